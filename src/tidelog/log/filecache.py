"""A bounded, process-wide cache of open segment files, so descriptors and mappings stay bounded.

Without it every segment of every log would hold its files from open to close: 2,000 streams of
20 segments would need 80,000 descriptors and 40,000 mappings. With it a segment opens its files
(the ``.log`` descriptor, the index mapping, and for the active segment the index descriptor)
when it is used and closes them when it falls out of the least-recently-used set, so the number
of segments on disk is bounded by the disk, not by ``ulimit -n`` or ``vm.max_map_count``.

Theory of operation. A user ``pin``\\ s a segment for the duration of one operation (a lookup, a
read, an append, a sync) and ``unpin``\\ s it after; pins are counted under the cache's one lock,
and eviction only ever closes segments with no pin, so files are never closed under a reader,
whichever log or thread asked for room. Under that lock run the bookkeeping, the opening of
a missed segment (so two threads never open the same segment twice) and the closing of evicted
or discarded ones (a munmap and a close or two); nothing else. The lock is always taken after a
log's own locks, never before, and the cache calls nothing that takes them.
A segment ``discard``\\ ed while pinned (its index was rebuilt, its log closed) keeps its files
until its last user unpins; a ``pin`` in between waits for that and then opens fresh files, so
nobody starts on files that are about to close or are stale. No thread may pin a segment again
after discarding it while itself still holding a pin on it (it would wait for itself).

``capacity`` counts descriptors and is soft: when every open segment is pinned, a new one opens
anyway (at most one per concurrent operation) and the set shrinks back later.
A segment is evicted without a sync: a sync later reopens it (``fdatasync`` acts on the file,
whichever descriptor wrote it).

If opening runs into the process's descriptor limit (other parts of the process hold
descriptors too), every unpinned segment is closed and the open is tried once more before
``OutOfDescriptors`` is raised.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final, Protocol

from tidelog.errors import OutOfDescriptors

DEFAULT_MAX_DESCRIPTORS: Final = 900
"""Descriptors all open segments together may hold: with 2,000 single-partition streams the
broker stays around 1,000 descriptors in total."""

MOST_PER_SEGMENT: Final = 3
"""An active segment: its ``.log``, its index, and the index mapping (CPython's ``mmap`` keeps a
duplicate of the descriptor it maps; ``trackfd=False`` needs Python 3.13). A sealed one: two."""


class Cached(Protocol):
    """What the cache needs of a segment: open and close its files, and room for bookkeeping."""

    pins: int
    is_open: bool
    descriptors: int
    """How many descriptors its open files hold (set by ``open_files``)."""

    def open_files(self) -> None: ...

    def close_files(self) -> None: ...


class FileCache:
    """The segments whose files are open, holding at most ``capacity`` descriptors when none is
    pinned (a segment counts the descriptors it held when opened, even if a seal closed one)."""

    def __init__(self, capacity: int = DEFAULT_MAX_DESCRIPTORS) -> None:
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        """Notified when a segment discarded while pinned is closed by its last user."""
        self._open: OrderedDict[Cached, int] = OrderedDict()
        self._held = 0
        self.capacity = capacity
        self.set_capacity(capacity)
        self.opened = 0
        """How many times a segment's files were opened (misses), for tests and metrics."""

    def set_capacity(self, capacity: int) -> None:
        if capacity < MOST_PER_SEGMENT:
            raise ValueError(f"the open-file cache needs a capacity >= 3, not {capacity}")
        with self._lock:
            self.capacity = capacity
            self._evict_locked(0)

    def __len__(self) -> int:
        """Segments open."""
        with self._lock:
            return len(self._open)

    @property
    def descriptors(self) -> int:
        """Descriptors the open segments hold (as counted when they opened)."""
        with self._lock:
            return self._held

    def pin(self, segment: Cached) -> None:
        """Make sure ``segment``'s files are open and keep them open until ``unpin``."""
        with self._lock:
            while segment.is_open and segment not in self._open:
                self._closed.wait()  # discarded while pinned: closes when its users are done
            if segment.is_open:
                segment.pins += 1
                self._open.move_to_end(segment)
                return
            self._evict_locked(MOST_PER_SEGMENT)
            try:
                segment.open_files()
            except OutOfDescriptors:
                self._evict_locked(self.capacity)  # everything unpinned goes, then one more try
                segment.open_files()
            self.opened += 1
            segment.pins = 1
            self._open[segment] = segment.descriptors
            self._held += segment.descriptors

    def unpin(self, segment: Cached) -> None:
        with self._lock:
            segment.pins -= 1
            if not segment.pins and segment not in self._open:
                segment.close_files()  # discarded while in use: closed by its last user
                self._closed.notify_all()
            elif self._held > self.capacity:
                self._evict_locked(0)

    def discard(self, segment: Cached) -> None:
        """Close ``segment``'s files now (or, if it is pinned, when its last user unpins it)."""
        with self._lock:
            held = self._open.pop(segment, None)
            if held is not None:
                self._held -= held
                if not segment.pins:
                    segment.close_files()

    def _evict_locked(self, room: int) -> None:
        """Close least-recently-used unpinned segments until ``room`` more descriptors fit."""
        if self._held + room <= self.capacity:
            return
        for segment, held in list(self._open.items()):
            if self._held + room <= self.capacity:
                break
            if segment.pins:
                continue
            del self._open[segment]
            self._held -= held
            segment.close_files()


DEFAULT_FILE_CACHE: Final = FileCache()
"""The cache every log uses unless it is given its own."""
