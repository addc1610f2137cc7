"""Records as a leader's log stores them, back to back: what a replica fetch carries; and the
two helpers that read such records (a record's CRC field, records gathered back to back).

Invariant: ``data`` holds ``len(sizes)`` whole stored records (``tidelog.log.record``: each with
its CRC, offset, timestamp and flags), ``sizes[i]`` bytes each, in offset order; nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_NO_SIZES = np.empty(0, dtype=np.int64)
OFFSET_AT = 8
"""Where a stored record's offset field starts (``tidelog.log.record``)."""


@dataclass(frozen=True, slots=True)
class StoredRecords:
    """Records as the leader's log stores them, back to back (``sizes[i]`` bytes each)."""

    data: bytes = b""
    sizes: np.ndarray = field(default_factory=lambda: _NO_SIZES)
    offsets: np.ndarray | None = None
    """Each record's offset when the reader knew them already (None: read from the headers
    when needed, ``fetch_cache.record_offsets``)."""

    def __len__(self) -> int:
        return len(self.sizes)

    def offset_range(self) -> tuple[int, int]:
        """The first and last record's offsets (read from their stored headers)."""
        last_at = len(self.data) - int(self.sizes[-1])
        return (
            int.from_bytes(self.data[OFFSET_AT : OFFSET_AT + 8], "little", signed=True),
            int.from_bytes(
                self.data[last_at + OFFSET_AT : last_at + OFFSET_AT + 8], "little", signed=True
            ),
        )


def crc_at(data: bytes, at: int) -> int:
    """The CRC field of the stored record starting at ``at`` of ``data`` (its first 4 bytes,
    ``tidelog.log.record``)."""
    return int.from_bytes(data[at : at + 4], "little")


def stored_bytes(data: bytes, positions: np.ndarray, sizes: np.ndarray) -> bytes:
    """The stored records at ``positions`` of ``data``, back to back (one slice when they lie
    back to back already, as a forward read of a segment finds them)."""
    if not len(positions):
        return b""
    start = int(positions[0])
    end = int(positions[-1] + sizes[-1])
    if end - start == int(sizes.sum()) and bool(
        (positions[1:] == positions[:-1] + sizes[:-1]).all()
    ):
        return bytes(data[start:end])
    return b"".join(
        bytes(data[a : a + n]) for a, n in zip(positions.tolist(), sizes.tolist(), strict=True)
    )
