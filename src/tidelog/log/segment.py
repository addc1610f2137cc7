"""One segment of a commit log: ``<base>.log`` (records back to back) and ``<base>.index``.

Invariants (checked by recovery on open, kept by every method):
- the file holds exactly the records the index lists, in order, with no bytes between them:
  ``position[0] == 0``, ``position[i+1] == position[i] + size[i]``, and ``size`` (bytes) is the
  end of the last record;
- offsets strictly increase (gaps are allowed: compaction and replication may leave them) and
  timestamps never decrease;
- only the newest segment of a log is active (appendable); the others are sealed and read-only.

An append is written whole or not at all. Index blocks are reserved first (a full disk is then
refused before anything is written); the records go to the file with ``pwrite`` at ``size`` (not
``O_APPEND``: a tail that could not be cut back is overwritten, never appended after); then the
index entries. If either write fails the file is cut back to ``size``, the index keeps its count
(and zeroes what it wrote), so the segment is exactly as before and the next append reuses the same
positions and slots. Should even the cut fail, the next append retries it before writing.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from pathlib import Path

import numpy as np

from tidelog.errors import LogError
from tidelog.log import files
from tidelog.log.index import INDEX_DTYPE, Index, IndexArray, write_index_file
from tidelog.log.record import HEADER_SIZE, EncodedBatch, Int64Array

LOG = logging.getLogger("tidelog.log")


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
        flags = os.O_RDWR | os.O_CREAT if active else os.O_RDONLY
        self._fd = files.open_fd(self.log_path, flags)
        try:
            self.index = Index(
                self.index_path,
                count,
                writable=active,
                preallocate_bytes=preallocate_bytes,
            )
        except BaseException:
            os.close(self._fd)
            raise
        self.size = size
        self.active = active
        self._cut_pending = False
        """A failed append could not cut the file back to ``size``; the next append must."""

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
        if self._cut_pending:
            files.truncate(self._fd, self.size, path=self.log_path)
            self._cut_pending = False
        self.index.reserve(n)
        try:
            files.pwrite_all(self._fd, batch.data.data, self.size, path=self.log_path)
            self.index.append(entries)
        except BaseException:
            self._cut_back()
            raise
        self.size = int(ends[-1])

    def _cut_back(self) -> None:
        """Undo the bytes a failed append wrote past ``size``. If the file cannot be cut, the next
        append cuts it first; meanwhile the first record header there is zeroed (its blocks were
        just written), so a recovery after a crash sees a torn tail and cuts it too."""
        try:
            files.truncate(self._fd, self.size, path=self.log_path)
        except Exception:
            self._cut_pending = True
            LOG.warning("%s: could not cut a failed append back to byte %d", self.name, self.size)
            with contextlib.suppress(Exception):
                files.pwrite_all(self._fd, bytes(HEADER_SIZE), self.size, path=self.log_path)

    def replace_index(self, entries: IndexArray) -> None:
        """Swap in a rebuilt index (sealed segments only): file rewritten, then remapped."""
        assert not self.active, "only a sealed segment's index is replaced"
        self.index.close()
        write_index_file(self.index_path, entries)
        self.index = Index(self.index_path, len(entries), writable=False, preallocate_bytes=0)

    def sync(self) -> None:
        """Force the segment's records to stable storage."""
        files.datasync(self._fd, path=self.log_path)

    def sync_all(self) -> None:
        """Force records and index to stable storage."""
        files.datasync(self._fd, path=self.log_path)
        self.index.sync()

    def truncate(self, slot: int) -> None:
        """Drop the records in slots ``[slot, count)`` from the file and the index."""
        if slot >= self.index.count:
            return
        position = int(self.index.entries["position"][slot])
        files.truncate(self._fd, position, path=self.log_path)
        self.index.truncate(slot)
        self.size = position

    def seal(self) -> None:
        """Stop accepting appends and trim the index to its entries.

        The segment is sealed even if the trim fails (it is logged): the untrimmed index only
        costs the next recovery a rebuild of it.
        """
        if self.active:
            self.active = False
            try:
                self.index.seal()
            except Exception as error:
                LOG.warning("%s: could not trim the index on seal: %s", self.name, error)

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
