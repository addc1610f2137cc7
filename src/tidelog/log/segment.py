"""One segment of a commit log: ``<base>.log`` (records back to back) and ``<base>.index``.

Invariants (checked by recovery on open, kept by every method):
- the file holds exactly the records the index lists, in order, with no bytes between them:
  ``position[0] == 0``, ``position[i+1] == position[i] + size[i]``, and ``size`` (bytes) is the
  end of the last record;
- offsets strictly increase (gaps are allowed: compaction and replication may leave them) and
  timestamps never decrease;
- only the newest segment of a log is active (appendable); the others are sealed and read-only.

Files. A segment opens its files only while a ``FileCache`` (``filecache.py``) keeps it open:
every method that touches them pins the segment for its duration. What a log needs to know
without the files (count, size, oldest and newest offset and timestamp) is kept in memory.

An append is written whole or not at all. Index blocks are reserved first (a full disk is then
refused before anything is written); the records go to the file with ``pwrite`` at ``size`` (not
``O_APPEND``: a tail that could not be cut back is overwritten, never appended after); then the
index entries. If either write fails the file is cut back to ``size``, the index keeps its count
(and zeroes what it wrote), so the segment is exactly as before and the next append reuses the same
positions and slots. Should even the cut fail, the cut is pending: the next append, and any
seal, does it before anything else and refuses (raises) while it still fails, so no sealed
segment ever holds bytes past ``size`` (recovery would take them for damage and drop every later
segment). The newest segment may keep such a tail through a close: recovery cuts it on open.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tidelog import durable
from tidelog.errors import LogError
from tidelog.log.filecache import FileCache
from tidelog.log.index import INDEX_DTYPE, Index, IndexArray, write_index_file
from tidelog.log.record import HEADER_SIZE, EncodedBatch, Int64Array

LOG = logging.getLogger("tidelog.log")

_SMALL_BATCH = 16
"""Up to this many records an append packs its index entries one by one (``_entries_of``)."""
_ENTRY = struct.Struct("<IqII")
"""One index entry as ``INDEX_DTYPE`` lays it out: relative offset, timestamp, position, size."""
assert _ENTRY.size == INDEX_DTYPE.itemsize


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def log_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{segment_name(base_offset)}.log"


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{segment_name(base_offset)}.index"


class Segment:
    """A segment's files and in-memory state; the owning log serialises every call but ``sync``
    (see ``SegmentedLog``)."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        count: int,
        size: int,
        active: bool,
        preallocate_bytes: int,
        cache: FileCache,
        verified: bool = True,
        bounds: IndexArray | None = None,
    ) -> None:
        """``bounds``: the first and last index entries (needed when ``count`` > 0; without them
        the index is read once to find them)."""
        self.base_offset = base_offset
        self.verified = verified
        """Every index entry was checked against the others (see ``recovery.verify_index``)."""
        self.log_path = log_path(directory, base_offset)
        self.index_path = index_path(directory, base_offset)
        self.name = self.log_path.name
        self.count = count
        self.size = size
        self.active = active
        self._preallocate = preallocate_bytes
        self._cache = cache
        self._cut_pending = False
        """A failed append could not cut the file back to ``size``; the next append must."""
        self._first: tuple[int, int] | None = None
        """(relative offset, timestamp) of the first record; None when empty."""
        self._last: tuple[int, int] | None = None
        # Files: owned by the cache's bookkeeping (``pins``, ``is_open``, under its lock).
        self.pins = 0
        self.is_open = False
        self.descriptors = 0
        self._fd = -1
        self._index: Index | None = None
        if count and bounds is None:
            with self._using() as index:
                bounds = index.entries[[0, -1]].copy()
        self._set_bounds(bounds if count else None)

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, *, preallocate_bytes: int, cache: FileCache
    ) -> Segment:
        """A new, empty active segment, its files created (none left behind if that fails)."""
        segment = cls(
            directory,
            base_offset,
            count=0,
            size=0,
            active=True,
            preallocate_bytes=preallocate_bytes,
            cache=cache,
        )
        try:
            with segment._using():
                pass
        except BaseException:
            segment.log_path.unlink(missing_ok=True)
            segment.index_path.unlink(missing_ok=True)
            raise
        return segment

    # -- files (called by the cache, under its lock) ---------------------------------------------

    def open_files(self) -> None:
        flags = os.O_RDWR | os.O_CREAT if self.active else os.O_RDONLY
        fd = durable.open_fd(self.log_path, flags)
        try:
            self._index = Index(
                self.index_path,
                self.count,
                writable=self.active,
                preallocate_bytes=self._preallocate,
            )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.is_open = True
        # The log, the index while writable, and the mapping (CPython's mmap holds a dup).
        self.descriptors = 1 + self.active + (self.active or self.count > 0)

    def close_files(self) -> None:
        self.is_open = False
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @contextlib.contextmanager
    def held_open(self) -> Iterator[None]:
        """Keep the files open for the block (opening them now if needed, which may raise
        ``OutOfDescriptors``), so that nothing inside it has to reopen them."""
        with self._using():
            yield

    @contextlib.contextmanager
    def _using(self) -> Iterator[Index]:
        """The open index (and ``self._fd``) for the duration of the block."""
        self._cache.pin(self)
        try:
            assert self._index is not None
            yield self._index
        finally:
            self._cache.unpin(self)

    # -- what it holds -------------------------------------------------------------------------

    def _set_bounds(self, entries: IndexArray | None) -> None:
        """Take the first and last record from ``entries`` (all of them, or the first and last)."""
        if entries is None or not len(entries):
            self._first = self._last = None
        else:
            self._first = (int(entries["rel"][0]), int(entries["timestamp"][0]))
            self._last = (int(entries["rel"][-1]), int(entries["timestamp"][-1]))

    @property
    def oldest_offset(self) -> int:
        """Offset of the first record, or ``base_offset`` when empty."""
        return self.base_offset if self._first is None else self.base_offset + self._first[0]

    @property
    def newest_offset(self) -> int:
        """Offset of the last record, or ``base_offset - 1`` when empty."""
        return self.base_offset - 1 if self._last is None else self.base_offset + self._last[0]

    @property
    def oldest_timestamp(self) -> int | None:
        return None if self._first is None else self._first[1]

    @property
    def newest_timestamp(self) -> int | None:
        return None if self._last is None else self._last[1]

    # -- lookups (slots are entry numbers within this segment) ------------------------------------

    # numpy.searchsorted would copy a strided column of the whole index on every call (O(n));
    # bisect probes O(log n) entries in place.

    def slot_at_or_after(self, offset: int) -> int:
        """First slot whose offset is >= ``offset`` (``count`` when there is none)."""
        rel = offset - self.base_offset
        if rel <= 0:
            return 0
        with self._using() as index:
            return bisect.bisect_left(index.entries["rel"], rel)

    def slot_at_or_before(self, offset: int) -> int:
        """Last slot whose offset is <= ``offset`` (-1 when there is none)."""
        rel = offset - self.base_offset
        if rel < 0:
            return -1
        with self._using() as index:
            return bisect.bisect_right(index.entries["rel"], rel) - 1

    def slot_past_bytes(self, first_slot: int, end_slot: int, max_bytes: int) -> int:
        """The first slot in ``(first_slot, end_slot]`` whose record starts more than
        ``max_bytes`` past ``first_slot`` 's (``end_slot`` when there is none): records from
        there on cannot fit in a read of ``max_bytes`` from ``first_slot`` (records lie in the
        file in slot order)."""
        with self._using() as index:
            positions = index.entries["position"]
            limit = int(positions[first_slot]) + max_bytes
            return bisect.bisect_right(positions, limit, first_slot + 1, end_slot)

    def slot_at_or_after_timestamp(self, timestamp: int) -> int:
        """First slot whose timestamp is >= ``timestamp`` (``count`` when there is none)."""
        with self._using() as index:
            return bisect.bisect_left(index.entries["timestamp"], timestamp)

    def slot_at_or_before_timestamp(self, timestamp: int) -> int:
        """Last slot whose timestamp is <= ``timestamp`` (-1 when there is none)."""
        with self._using() as index:
            return bisect.bisect_right(index.entries["timestamp"], timestamp) - 1

    def entries(self, first_slot: int, end_slot: int) -> IndexArray:
        """A copy of the entries in slots ``[first_slot, end_slot)``."""
        with self._using() as index:
            # As bytes: numpy copies a structured array field by field, ~4 times slower.
            raw = index.entries[first_slot:end_slot].view(np.uint8).copy()
            entries: IndexArray = raw.view(index.entries.dtype)
            return entries

    def offset_at(self, slot: int) -> int:
        with self._using() as index:
            return self.base_offset + int(index.entries["rel"][slot])

    def offsets_of(self, entries: IndexArray) -> Int64Array:
        return entries["rel"].astype(np.int64) + self.base_offset

    # -- I/O -------------------------------------------------------------------------------------

    def read(self, position: int, length: int) -> bytes:
        """``length`` bytes from ``position`` (shorter only if the file was cut underneath us)."""
        with self._using():
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
        entries, end = self._entries_of(batch)
        self.finish_cut()
        with self._using() as index:
            index.reserve(len(entries))
            try:
                durable.pwrite_all(self._fd, batch.data.data, self.size, path=self.log_path)
                index.append(entries)
            except BaseException:
                self._cut_back()
                raise
            self.size = end
            self.count = index.count
        last = int(batch.offsets[-1]) - self.base_offset
        if self._first is None:
            self._first = (int(batch.offsets[0]) - self.base_offset, batch.timestamp)
        self._last = (last, batch.timestamp)

    def _entries_of(self, batch: EncodedBatch) -> tuple[IndexArray, int]:
        """The index entries of ``batch`` written at ``size``, and where its last record ends.
        A handful of records (a live publisher's batch) are packed entry by entry: numpy's fixed
        cost per call is most of the work at that size."""
        n = len(batch.sizes)
        if n <= _SMALL_BATCH:
            position = self.size
            rows = []
            base, stamp = self.base_offset, batch.timestamp
            for offset, size in zip(batch.offsets.tolist(), batch.sizes.tolist(), strict=True):
                rows.append(_ENTRY.pack(offset - base, stamp, position, size))
                position += size
            return np.frombuffer(b"".join(rows), dtype=INDEX_DTYPE), position
        entries = np.empty(n, dtype=INDEX_DTYPE)
        entries["rel"] = batch.offsets - self.base_offset
        entries["timestamp"] = batch.timestamp
        ends = np.cumsum(batch.sizes) + self.size
        entries["position"] = ends - batch.sizes
        entries["size"] = batch.sizes
        return entries, int(ends[-1])

    def finish_cut(self) -> None:
        """Cut the bytes a failed append left past ``size``, if any (``DiskFull`` or ``OSError``
        while that still fails; nothing else changes then). No system call when none are left."""
        if self._cut_pending:
            with self._using():
                durable.truncate(self._fd, self.size, path=self.log_path)
                self._cut_pending = False

    def _cut_back(self) -> None:
        """Undo the bytes a failed append wrote past ``size``. If the file cannot be cut, the cut
        is pending (see ``finish_cut``); meanwhile the first record header there is zeroed (its
        blocks were just written), so a recovery after a crash sees a torn tail and cuts it too."""
        try:
            durable.truncate(self._fd, self.size, path=self.log_path)
        except Exception:
            self._cut_pending = True
            LOG.warning("%s: could not cut a failed append back to byte %d", self.name, self.size)
            with contextlib.suppress(Exception):
                durable.pwrite_all(self._fd, bytes(HEADER_SIZE), self.size, path=self.log_path)

    def replace_index(self, entries: IndexArray) -> None:
        """Swap in a rebuilt index (sealed segments only): file rewritten, mapped on next use."""
        assert not self.active, "only a sealed segment's index is replaced"
        self._cache.discard(self)
        write_index_file(self.index_path, entries)
        self.count = len(entries)
        self._set_bounds(entries[[0, -1]] if len(entries) else None)

    def sync(self) -> None:
        """Force the segment's records to stable storage (reopening the file if it was closed)."""
        with self._using():
            durable.sync_fd(self._fd, os.fdatasync, path=self.log_path)

    def sync_all(self) -> None:
        """Force records and index to stable storage."""
        with self._using() as index:
            durable.sync_fd(self._fd, os.fdatasync, path=self.log_path)
            index.sync()

    def truncate(self, slot: int) -> None:
        """Drop the records in slots ``[slot, count)`` from the file and the index (active
        segments only: a sealed one's files are read-only)."""
        assert self.active, "only the active segment is truncated"
        if slot >= self.count:
            return
        with self._using() as index:
            position = int(index.entries["position"][slot])
            durable.truncate(self._fd, position, path=self.log_path)
            index.truncate(slot)
            self.size = position
            self.count = slot
            self._set_bounds(index.entries[[0, -1]] if slot else None)

    def unseal(self) -> None:
        """Make a sealed segment active again (a replica truncating into it): its files reopen
        for writing, the index mapped writable with room to grow. Raises, leaving it sealed,
        if they cannot be opened."""
        if self.active:
            return
        self._cache.discard(self)  # closes now, or when its current users are done
        self.active = True
        try:
            with self._using():
                pass
        except BaseException:
            self._cache.discard(self)
            self.active = False
            raise

    def seal(self) -> None:
        """Stop accepting appends and trim the index to its entries.

        Raises, leaving the segment active and unchanged, if its files cannot be opened or a
        pending cut (see ``finish_cut``) still fails; a caller that holds it open
        (``held_open``) and has done the cut can rely on ``seal`` not raising. The segment is
        sealed even if the trim fails (it is logged): the untrimmed index only costs the next
        recovery a rebuild of it.
        """
        if self.active:
            with self._using() as index:
                self.finish_cut()
                self.active = False
                try:
                    index.seal()
                except Exception as error:
                    LOG.warning("%s: could not trim the index on seal: %s", self.name, error)

    def close(self) -> None:
        """Close the segment's files (they reopen if the segment is used again)."""
        self._cache.discard(self)

    def delete(self) -> None:
        """Close and remove both files (the log first: an orphan index is removed on open)."""
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)

    @property
    def index(self) -> Index:
        """The open index, for tests (valid while the segment stays open in its cache)."""
        with self._using() as index:
            return index
