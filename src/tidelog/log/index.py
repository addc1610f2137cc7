"""The dense offset index of one segment: one fixed 20-byte entry per record.

Entry (little-endian): relative offset u32, timestamp i64 (ns), position u32, size u32. Entries are
in offset order and both relative offsets and timestamps never decrease, so offset -> position and
timestamp -> offset are ``numpy.searchsorted`` calls over memory-mapped columns.

While its segment is active the index file is preallocated (grown in ``preallocate_bytes`` steps)
and memory-mapped read-write; unused slots are zero. Sealing trims the file to its entries and maps
it read-only. The entry count is kept in memory; on open it comes from recovery, never from the
file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

INDEX_DTYPE: Final = np.dtype(
    [("rel", "<u4"), ("timestamp", "<i8"), ("position", "<u4"), ("size", "<u4")]
)
ENTRY_SIZE: Final = 20
assert INDEX_DTYPE.itemsize == ENTRY_SIZE

IndexArray = npt.NDArray[np.void]


def read_index_file(path: Path) -> IndexArray:
    """Every whole entry stored in ``path`` (a trailing partial entry is ignored)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return np.empty(0, dtype=INDEX_DTYPE)
    whole = len(raw) - len(raw) % ENTRY_SIZE
    return np.frombuffer(raw[:whole], dtype=INDEX_DTYPE).copy()


def write_index_file(path: Path, entries: IndexArray) -> None:
    """Replace ``path`` with exactly ``entries`` (written to a temp file, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(entries.tobytes())
    os.replace(tmp, path)


class Index:
    """The entries ``[0, count)`` of one segment's index file, memory-mapped."""

    def __init__(self, path: Path, count: int, *, writable: bool, preallocate_bytes: int) -> None:
        self.path = path
        self.count = count
        self.writable = writable
        self._preallocate = preallocate_bytes
        self._fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY, 0o644)
        self._mmap: mmap.mmap | None = None
        self._array: IndexArray = np.empty(0, dtype=INDEX_DTYPE)
        if writable:
            self._map_writable(max(count * ENTRY_SIZE + preallocate_bytes, preallocate_bytes))
        else:
            self._map_readonly()

    def _release_map(self) -> None:
        self._array = np.empty(0, dtype=INDEX_DTYPE)
        if self._mmap is not None:
            # A caller may still hold a view; then the mapping goes when that view does.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def _map_writable(self, size: int) -> None:
        size -= size % ENTRY_SIZE
        self._release_map()
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)
        self._mmap = mmap.mmap(self._fd, size)
        self._array = np.frombuffer(self._mmap, dtype=INDEX_DTYPE)

    def _map_readonly(self) -> None:
        self._release_map()
        size = self.count * ENTRY_SIZE
        if size:
            self._mmap = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
            self._array = np.frombuffer(self._mmap, dtype=INDEX_DTYPE)

    @property
    def entries(self) -> IndexArray:
        """A view of the live entries (valid until the next append, seal or close)."""
        return self._array[: self.count]

    def append(self, entries: IndexArray) -> None:
        """Store ``entries`` after the current ones, growing the file when needed.

        Written with ``pwrite`` (cheaper than first-touch faults on the mapping); the mapping sees
        the same page-cache pages.
        """
        end = self.count + len(entries)
        if end > len(self._array):
            self._map_writable(end * ENTRY_SIZE + self._preallocate)
        os.pwrite(self._fd, entries.tobytes(), self.count * ENTRY_SIZE)
        self.count = end

    def truncate(self, count: int) -> None:
        """Forget entries from ``count`` on (their slots are zeroed)."""
        if count < self.count:
            self._array[count : self.count] = np.zeros(self.count - count, dtype=INDEX_DTYPE)
            self.count = count

    def sync(self) -> None:
        if self._mmap is not None and self.writable:
            self._mmap.flush()
            os.fsync(self._fd)

    def seal(self) -> None:
        """Trim the file to its entries and map it read-only."""
        if self.writable:
            if self._mmap is not None:
                self._mmap.flush()
            self._release_map()
            os.ftruncate(self._fd, self.count * ENTRY_SIZE)
            self.writable = False
            self._map_readonly()

    def close(self) -> None:
        self._release_map()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
