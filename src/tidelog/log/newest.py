"""The newest batch the log wrote, kept in memory for the reader that follows the log's end.

A live subscriber reads every batch right after it is committed, from the offset the batch starts
at: through the file, that read is an index lookup, a ``pread`` of bytes the process has just
written and a CRC pass over them, several numpy calls each, for a handful of records. The writer
keeps the batch it wrote last (:class:`NewestBatch`), and ``SegmentedLog.read_forward`` hands it
out instead when, and only when, the read from the file would return exactly its records.

Invariants. A :class:`NewestBatch` holds the bytes of the newest batch ``LogWriter`` encoded and
wrote into the active segment, as written: the encoder computed their CRCs over these very bytes
(the array it built and the process owns), so they are what the file holds unless the file was
damaged since; they never came from a file. It serves a read (:meth:`NewestBatch.serves`) only
while its segment is the active one and its last offset is the log's newest (a truncation, a roll
or a later append of any kind make it stale), when the read starts at its first offset, the
readable end (the high watermark, or the committed offset for a replica's copy) reaches its last,
and the read's limits take it whole - so the batch returned is record for record the one the
file would give. A batch of more than :data:`NEWEST_MAX_BYTES` is not kept: its reader is a
catch-up, and the file's path serves it.

What this gives up: a read served here does not look at the file, so damage done to the file under
the newest batch after its write (a disk fault, a person editing it) is not seen by the live
reader, which gets the right bytes; it is found by the next read through the file (a catch-up
from an earlier offset, ``verify()``, recovery on the next open), as damage anywhere else is.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from tidelog.log.batch import MessageBatch
from tidelog.log.local import LocalLog
from tidelog.log.record import gather_headers
from tidelog.log.record_layout import HEADER_DTYPE, EncodedBatch
from tidelog.log.segment import Segment

NEWEST_MAX_BYTES: Final = 64 << 10
"""The largest batch kept in memory after its write (bytes of records): a live publisher's batch
is well under it; a bulk append above it is read back through the file."""


class NewestBatch:
    """The newest batch written into ``segment`` (module docstring)."""

    __slots__ = ("_batch", "_encoded", "first", "last", "segment", "size")

    def __init__(self, segment: Segment, encoded: EncodedBatch) -> None:
        self.segment = segment
        self._encoded = encoded
        self.first = int(encoded.offsets[0])
        self.last = int(encoded.offsets[-1])
        self.size = len(encoded.data)
        self._batch: MessageBatch | None = None

    def serves(
        self, active: Segment, newest: int, start: int, last: int, max_messages: int, max_bytes: int
    ) -> bool:
        """Whether a forward read of ``[start, last]`` (``last`` already capped at the readable
        end) with these limits would return exactly this batch, the log's active segment and
        newest offset being ``active`` and ``newest``."""
        return (
            start == self.first
            and self.last <= last
            and self.last == newest
            and self.segment is active
            and len(self._encoded.sizes) <= max_messages
            and self.size <= max_bytes
        )

    def batch(self) -> MessageBatch:
        """The records as a :class:`MessageBatch` (built once, shared by every reader: readers
        never change a batch, they cut new ones)."""
        batch = self._batch
        if batch is None:
            encoded = self._encoded
            data = encoded.data.tobytes()
            sizes = encoded.sizes.astype(np.int64)
            n = len(sizes)
            size = int(sizes[0])
            if int(sizes[-1]) == size and encoded.sizes.tolist().count(size) == n:
                # One size (a live publisher's usual batch): the headers lie at a fixed stride.
                positions = np.arange(0, n * size, size, dtype=np.int64)
                header = np.ndarray((n,), dtype=HEADER_DTYPE, buffer=data, strides=(size,)).copy()
            else:
                positions = np.cumsum(sizes) - sizes
                header = gather_headers(data, positions)
            batch = MessageBatch(data, positions, sizes, header)
            self._batch = batch
        return batch


def serving(
    newest: NewestBatch | None,
    local: LocalLog,
    start: int,
    last: int,
    max_messages: int,
    max_bytes: int,
) -> NewestBatch | None:
    """``newest`` if it serves a forward read of ``[start, last]`` (``last`` capped at the readable
    end) with these limits from ``local`` as it is now (:meth:`NewestBatch.serves`), else None.
    Called with ``local.lock`` held."""
    if newest is not None and newest.serves(
        local.active, local.next_offset - 1, start, last, max_messages, max_bytes
    ):
        return newest
    return None
