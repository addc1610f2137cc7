"""Records as a leader's log stores them, back to back: what a replica fetch carries.

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
