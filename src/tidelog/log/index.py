"""The dense offset index of one segment: one fixed 20-byte entry per record.

Entry (little-endian): relative offset u32, timestamp i64 (ns), position u32, size u32. Entries are
in offset order and both relative offsets and timestamps never decrease, so offset -> position and
timestamp -> offset are binary searches (``bisect`` over the memory-mapped columns, which probes
O(log n) entries in place; ``numpy.searchsorted`` would copy the strided column first).

While its segment is active the index file is preallocated (grown in ``preallocate_bytes`` steps)
and memory-mapped read-write; unused slots are zero. Sealing trims the file to its entries and maps
it read-only (a read-only index keeps its mapping, not its own descriptor; CPython's ``mmap``
holds a duplicate until it is closed). The entry count is kept in
memory; on open it comes from recovery, never from the file.

Writing on a full disk. The preallocated file is sparse, so a write into it may need a new block.
Entries are therefore only ever written with ``pwrite`` (through ``durable.pwrite_all``, which
reports ENOSPC as ``DiskFull``), never through the mapping: a store into an unallocated page of a
shared mapping on a full disk is a SIGBUS that kills the process. Zeroing (``truncate``) also uses
``pwrite``, and only over slots that were written, so it needs no new block. On top of that,
blocks are reserved ahead of use with ``posix_fallocate`` in steps of ``RESERVE_STEP`` (not the
whole preallocation: 10 MiB per active segment of every stream would be real disk), and
``Segment.append`` reserves before it writes the record bytes, so a full disk is normally reported
before anything is written. A reservation is a convenience, not what correctness rests on: a failed
``append`` leaves ``count`` where it was and zeroes what it wrote, so the next append overwrites
those slots and recovery (which trusts only the file's records above the recovery point) never
sees them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog import durable

INDEX_DTYPE: Final = np.dtype(
    [("rel", "<u4"), ("timestamp", "<i8"), ("position", "<u4"), ("size", "<u4")]
)
ENTRY_SIZE: Final = 20
assert INDEX_DTYPE.itemsize == ENTRY_SIZE

IndexArray = npt.NDArray[np.void]

RESERVE_STEP: Final = 256 * 1024
"""Bytes of index file reserved (``posix_fallocate``) at a time ahead of the entries written."""


def read_index_file(path: Path) -> IndexArray:
    """Every whole entry stored in ``path`` (a trailing partial entry is ignored)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return np.empty(0, dtype=INDEX_DTYPE)
    whole = len(raw) - len(raw) % ENTRY_SIZE
    return np.frombuffer(raw[:whole], dtype=INDEX_DTYPE).copy()


def write_index_file(path: Path, entries: IndexArray, *, sync: bool = False) -> None:
    """Replace ``path`` with exactly ``entries`` (written to a temp file, then renamed); on failure
    (``DiskFull`` included) ``path`` is as it was."""
    durable.replace_file(path, entries.tobytes(), sync=sync)


class Index:
    """The entries ``[0, count)`` of one segment's index file, memory-mapped."""

    def __init__(
        self,
        path: Path,
        count: int,
        *,
        writable: bool,
        preallocate_bytes: int,
    ) -> None:
        self.path = path
        self.count = count
        self.writable = writable
        self._preallocate = preallocate_bytes
        self._fd = durable.open_fd(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY)
        self._mmap: mmap.mmap | None = None
        self._array: IndexArray = np.empty(0, dtype=INDEX_DTYPE)
        self._reserved = count * ENTRY_SIZE
        """Bytes from the file's start known to have blocks (written or reserved)."""
        try:
            if writable:
                self._map_writable(max(count * ENTRY_SIZE + preallocate_bytes, preallocate_bytes))
            else:
                self._map_readonly()
        except BaseException:
            self.close()
            raise

    def _release_map(self) -> None:
        self._array = np.empty(0, dtype=INDEX_DTYPE)
        if self._mmap is not None:
            # A caller may still hold a view; then the mapping goes when that view does.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def _map_writable(self, size: int) -> None:
        size -= size % ENTRY_SIZE
        if os.fstat(self._fd).st_size < size:
            durable.truncate(self._fd, size, path=self.path)  # sparse: grows without allocating
        self._release_map()
        self._mmap = mmap.mmap(self._fd, size)
        self._array = np.frombuffer(self._mmap, dtype=INDEX_DTYPE)

    def _map_readonly(self) -> None:
        """Map the entries read-only and let go of the descriptor (the mapping does not need it)."""
        self._release_map()
        size = self.count * ENTRY_SIZE
        if size:
            self._mmap = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
            self._array = np.frombuffer(self._mmap, dtype=INDEX_DTYPE)
        os.close(self._fd)
        self._fd = -1

    @property
    def entries(self) -> IndexArray:
        """A view of the live entries (valid until the next append, seal or close)."""
        return self._array[: self.count]

    def reserve(self, more: int) -> None:
        """Make room for ``more`` entries after the current ones: the file and its mapping grown,
        blocks allocated (``DiskFull`` if the disk has no room; the entries are untouched then)."""
        end = self.count + more
        if end > len(self._array):
            self._map_writable(end * ENTRY_SIZE + self._preallocate)
        need = end * ENTRY_SIZE
        if need > self._reserved:
            mapped = len(self._array) * ENTRY_SIZE
            length = min(max(need - self._reserved, RESERVE_STEP), mapped - self._reserved)
            durable.reserve(self._fd, self._reserved, length, path=self.path)
            self._reserved += length

    def append(self, entries: IndexArray) -> None:
        """Store ``entries`` after the current ones, growing the file when needed.

        Written with ``pwrite`` (cheaper than first-touch faults on the mapping, and a full disk is
        an error rather than a SIGBUS); the mapping sees the same page-cache pages. On failure
        ``count`` is unchanged and whatever part was written is zeroed again (best effort).
        """
        end = self.count + len(entries)
        self.reserve(len(entries))
        at = self.count * ENTRY_SIZE
        data = entries.tobytes()
        try:
            durable.pwrite_all(self._fd, data, at, path=self.path)
        except BaseException:
            with contextlib.suppress(Exception):
                durable.pwrite_all(self._fd, bytes(len(data)), at, path=self.path)
            raise
        self.count = end

    def truncate(self, count: int) -> None:
        """Forget entries from ``count`` on (their slots, all written before, are zeroed)."""
        if count < self.count:
            at, length = count * ENTRY_SIZE, (self.count - count) * ENTRY_SIZE
            durable.pwrite_all(self._fd, bytes(length), at, path=self.path)
            self.count = count

    def sync(self) -> None:
        """Force the entries to stable storage. A sealed index has no descriptor of its own (see
        ``_map_readonly``): it is opened read-only for the fsync, which acts on the file."""
        if self.writable:
            if self._mmap is not None:
                self._mmap.flush()
            durable.sync_fd(self._fd, os.fsync, path=self.path)
            return
        fd = durable.open_fd(self.path, os.O_RDONLY)
        try:
            durable.sync_fd(fd, os.fsync, path=self.path)
        finally:
            os.close(fd)

    def seal(self) -> None:
        """Trim the file to its entries and map it read-only.

        The trim comes first: if it fails, the index is still writable and nothing changed.
        """
        if self.writable:
            if self._mmap is not None:
                self._mmap.flush()
            durable.truncate(self._fd, self.count * ENTRY_SIZE, path=self.path)
            self.writable = False
            self._map_readonly()

    def close(self) -> None:
        self._release_map()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
