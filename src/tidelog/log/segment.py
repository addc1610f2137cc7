"""One segment of a commit log: ``<base>.log`` (records back to back) and ``<base>.index``.

Invariants (checked by recovery on open, kept by every method):
- the file holds exactly the records the index lists, in order, with no bytes between them:
  ``position[0] == 0``, ``position[i+1] == position[i] + size[i]``, and ``size`` (bytes) is the
  end of the last record;
- offsets strictly increase (gaps are allowed: compaction and replication may leave them) and
  timestamps never decrease;
- only the newest segment of a log is active (appendable); the others are sealed and read-only.

A failed write is undone: the log file is cut back to its previous size and the index is not
touched, so a partial batch is never visible.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

import numpy as np

from tidelog.errors import LogError
from tidelog.log.index import INDEX_DTYPE, Index, IndexArray, write_index_file
from tidelog.log.record import EncodedBatch, Int64Array


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def log_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{segment_name(base_offset)}.log"


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{segment_name(base_offset)}.index"


class Segment:
    """A segment's files and in-memory state; the owning log serialises every call."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        count: int,
        size: int,
        active: bool,
        preallocate_bytes: int,
        verified: bool = True,
    ) -> None:
        self.base_offset = base_offset
        self.verified = verified
        """Every index entry was checked against the others (see ``SegmentedLog._checked``)."""
        self.log_path = log_path(directory, base_offset)
        self.index_path = index_path(directory, base_offset)
        self.name = self.log_path.name
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND if active else os.O_RDONLY
        self._fd = os.open(self.log_path, flags, 0o644)
        self.index = Index(
            self.index_path, count, writable=active, preallocate_bytes=preallocate_bytes
        )
        self.size = size
        self.active = active

    # -- what it holds -------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.index.count

    @property
    def oldest_offset(self) -> int:
        """Offset of the first record, or ``base_offset`` when empty."""
        if not self.index.count:
            return self.base_offset
        return self.base_offset + int(self.index.entries["rel"][0])

    @property
    def newest_offset(self) -> int:
        """Offset of the last record, or ``base_offset - 1`` when empty."""
        if not self.index.count:
            return self.base_offset - 1
        return self.base_offset + int(self.index.entries["rel"][-1])

    @property
    def oldest_timestamp(self) -> int | None:
        return int(self.index.entries["timestamp"][0]) if self.index.count else None

    @property
    def newest_timestamp(self) -> int | None:
        return int(self.index.entries["timestamp"][-1]) if self.index.count else None

    # -- lookups (slots are entry numbers within this segment) ------------------------------------

    # numpy.searchsorted would copy a strided column of the whole index on every call (O(n));
    # bisect probes O(log n) entries in place.

    def slot_at_or_after(self, offset: int) -> int:
        """First slot whose offset is >= ``offset`` (``count`` when there is none)."""
        rel = offset - self.base_offset
        if rel <= 0:
            return 0
        return bisect.bisect_left(self.index.entries["rel"], rel)

    def slot_at_or_before(self, offset: int) -> int:
        """Last slot whose offset is <= ``offset`` (-1 when there is none)."""
        rel = offset - self.base_offset
        if rel < 0:
            return -1
        return bisect.bisect_right(self.index.entries["rel"], rel) - 1

    def slot_at_or_after_timestamp(self, timestamp: int) -> int:
        """First slot whose timestamp is >= ``timestamp`` (``count`` when there is none)."""
        return bisect.bisect_left(self.index.entries["timestamp"], timestamp)

    def slot_at_or_before_timestamp(self, timestamp: int) -> int:
        """Last slot whose timestamp is <= ``timestamp`` (-1 when there is none)."""
        return bisect.bisect_right(self.index.entries["timestamp"], timestamp) - 1

    def entries(self, first_slot: int, end_slot: int) -> IndexArray:
        """A copy of the entries in slots ``[first_slot, end_slot)``."""
        return self.index.entries[first_slot:end_slot].copy()

    def offsets_of(self, entries: IndexArray) -> Int64Array:
        return entries["rel"].astype(np.int64) + self.base_offset

    # -- I/O -------------------------------------------------------------------------------------

    def read(self, position: int, length: int) -> bytes:
        """``length`` bytes from ``position`` (shorter only if the file was cut underneath us)."""
        data = os.pread(self._fd, length, position)
        if len(data) < length:
            parts = [data]
            got = len(data)
            while got < length:
                more = os.pread(self._fd, length - got, position + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        return data

    def append(self, batch: EncodedBatch) -> None:
        """Write ``batch`` at the end of the file and index it."""
        if not self.active:
            raise LogError(f"segment {self.name} is sealed; only the active segment appends")
        n = len(batch.sizes)
        entries = np.empty(n, dtype=INDEX_DTYPE)
        entries["rel"] = batch.offsets - self.base_offset
        entries["timestamp"] = batch.timestamp
        ends = np.cumsum(batch.sizes) + self.size
        entries["position"] = ends - batch.sizes
        entries["size"] = batch.sizes
        view = batch.data.data
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except BaseException:
            os.ftruncate(self._fd, self.size)
            raise
        self.index.append(entries)
        self.size = int(ends[-1])

    def replace_index(self, entries: IndexArray) -> None:
        """Swap in a rebuilt index (sealed segments only): file rewritten, then remapped."""
        assert not self.active, "only a sealed segment's index is replaced"
        self.index.close()
        write_index_file(self.index_path, entries)
        self.index = Index(self.index_path, len(entries), writable=False, preallocate_bytes=0)

    def sync(self) -> None:
        """Force the segment's records to stable storage."""
        os.fdatasync(self._fd)

    def sync_all(self) -> None:
        """Force records and index to stable storage."""
        os.fdatasync(self._fd)
        self.index.sync()

    def truncate(self, slot: int) -> None:
        """Drop the records in slots ``[slot, count)`` from the file and the index."""
        if slot >= self.index.count:
            return
        position = int(self.index.entries["position"][slot])
        os.ftruncate(self._fd, position)
        self.index.truncate(slot)
        self.size = position

    def seal(self) -> None:
        """Make the segment read-only: trim its index and stop accepting appends."""
        if self.active:
            self.index.seal()
            self.active = False

    def close(self) -> None:
        self.index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove both files (the log first: an orphan index is removed on open)."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)
