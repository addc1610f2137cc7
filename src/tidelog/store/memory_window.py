"""The in-memory window store: a ``SortedDict`` keyed (key, window start, sequence).

The sequence is a store-wide counter when duplicates are retained and 0 otherwise, so one map
gives the contract's single order (key, window start, insertion). With retention, a second
sorted list (window start, key, sequence) finds expired entries in time order: a put that raises
the observed time pops them off its front, O(log M) per expired entry, never scanning the store.
"""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedDict, SortedList  # type: ignore[import-untyped]

from tidelog.store._base import (
    EmptyIterator,
    StoreBase,
    check_time,
)
from tidelog.store._memory_scan import SortedScan
from tidelog.store._window import (
    WindowQueries,
    check_retention,
    oldest_live,
    plan_window_scan,
)
from tidelog.store.contract import StoreIterator, WindowEntry


class InMemoryWindowStore(WindowQueries, StoreBase):
    """A :class:`~tidelog.store.contract.WindowStore` in memory; nothing is durable.

    Expired windows are removed by the put that expires them. Iterators are weakly consistent
    (``tidelog.store._memory_scan``) and read the retention cutoff once, when they open.
    """

    def __init__(self, *, retention_ms: int | None = None, retain_duplicates: bool = False) -> None:
        super().__init__()
        self._retention_ms = check_retention(retention_ms)
        self._retain_duplicates = retain_duplicates
        self._data = SortedDict()
        self._by_time = SortedList() if retention_ms is not None else None
        self._observed: int | None = None
        self._next_seq = 0

    def _oldest_live(self) -> int:
        return oldest_live(self._retention_ms, self._observed)

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None, int]]) -> None:
        for key, value, window_start in entries:
            self.put(key, value, window_start)

    def put(self, key: bytes, value: bytes | None, window_start: int) -> None:
        self._check_open()
        check_time("window_start", window_start)
        if window_start < self._oldest_live():
            return
        # Every put advances observed time, even one that stores nothing (as in Kafka).
        advanced = self._observed is None or window_start > self._observed
        if advanced:
            self._observed = window_start
        if value is not None or not self._retain_duplicates:
            self._store_entry(key, value, window_start)
        if advanced and self._by_time is not None:
            self._expire()

    def _store_entry(self, key: bytes, value: bytes | None, window_start: int) -> None:
        seq = 0
        if self._retain_duplicates:
            seq = self._next_seq
            self._next_seq += 1
        entry = (key, window_start, seq)
        if value is None:
            if self._data.pop(entry, None) is not None and self._by_time is not None:
                self._by_time.discard((window_start, key, seq))
            return
        if self._by_time is not None and entry not in self._data:
            self._by_time.add((window_start, key, seq))  # once per entry, however often replaced
        self._data[entry] = value

    def _expire(self) -> None:
        assert self._by_time is not None
        live_from = self._oldest_live()
        while self._by_time and self._by_time[0][0] < live_from:
            start, key, seq = self._by_time.pop(0)
            del self._data[(key, start, seq)]

    def _scan(
        self,
        method: str,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
        *,
        forward: bool,
    ) -> StoreIterator[WindowEntry]:
        self._check_open()
        plan = plan_window_scan(
            method, key_from, key_to, time_from, time_to, self._oldest_live(), forward=forward
        )
        if plan is None:
            return EmptyIterator(self)
        return SortedScan(self, self._data, plan.lower, plan.upper, forward=forward, step=plan.step)

    def approximate_num_entries(self) -> int:
        self._check_open()
        return len(self._data)

    def _close_backend(self) -> None:
        self._data = SortedDict()
