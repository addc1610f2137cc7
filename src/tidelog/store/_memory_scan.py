"""Lazy, write-tolerant scans over a ``SortedDict``: the in-memory stores' iterator.

The iterator never holds a sortedcontainers iterator across a yield (those break when the map
changes). It reads the next *chunk* of keys with ``irange`` from a cursor, the last key it
passed, exclusive, and re-reads from the cursor whenever the chunk runs out or the step function
seeks. Chunks start small and double, so a scan that stops after N entries costs O(N + log M)
and a full scan O(M + (M / chunk) log M).

What it sees while the map is written (the weakly consistent contract): keys are unique and
the cursor only moves ahead, so an entry present throughout is yielded exactly once and nothing
is repeated. Each value is read when the entry is reached, so an entry deleted before then is
skipped and an updated one shows its newest value. An entry inserted ahead of the cursor is seen
unless it falls inside the chunk already read; one inserted behind the cursor is not.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Generic, TypeVar

from tidelog.store._base import Seek, Step, StoreBase, StoreIteratorBase

T = TypeVar("T")
K = TypeVar("K")

FIRST_CHUNK = 16
MAX_CHUNK = 4096


class SortedScan(StoreIteratorBase[T], Generic[K, T]):
    """Entries of ``data`` between ``lower`` and ``upper`` (None: open), in one direction, passed
    through ``step``. ``lower`` is inclusive; ``upper`` is inclusive unless ``upper_inclusive``
    is False (prefix scans)."""

    def __init__(
        self,
        store: StoreBase,
        data: Any,  # SortedDict[K, bytes]; sortedcontainers ships no types
        lower: K | None,
        upper: K | None,
        *,
        forward: bool,
        step: Step[K, T],
        upper_inclusive: bool = True,
    ) -> None:
        super().__init__(store)
        self._data = data
        self._lower, self._lower_inclusive = lower, True
        self._upper, self._upper_inclusive = upper, upper_inclusive
        self._forward = forward
        self._step = step
        self._chunk = FIRST_CHUNK
        self._pending: deque[K] = deque()

    def _refill(self) -> None:
        keys = self._data.irange(
            self._lower,
            self._upper,
            inclusive=(self._lower_inclusive, self._upper_inclusive),
            reverse=not self._forward,
        )
        self._pending.extend(islice(keys, self._chunk))
        self._chunk = min(self._chunk * 2, MAX_CHUNK)

    def _advance(self) -> T:
        while True:
            if not self._pending:
                self._refill()
                if not self._pending:
                    raise StopIteration
            key = self._pending.popleft()
            if self._forward:
                self._lower, self._lower_inclusive = key, False
            else:
                self._upper, self._upper_inclusive = key, False
            value = self._data.get(key)
            if value is None:  # deleted after this chunk was read
                continue
            result = self._step(key, value)
            if result is None:
                continue
            if isinstance(result, Seek):
                self._pending.clear()
                if self._forward:
                    self._lower, self._lower_inclusive = result.target, True
                else:
                    self._upper, self._upper_inclusive = result.target, True
                continue
            return result

    def _release(self) -> None:
        self._pending.clear()
        self._data = None
