"""The in-memory session store: a ``SortedDict`` keyed (key, end, start).

Matching sessions (``end >= earliest_session_end``, ``start <= latest_session_start``) are found
by seeking each key to ``end >= earliest_session_end`` and stopping at
``end <= latest_session_start + longest``, where *longest* is the longest session ever put: no
session past that end can start early enough. Starts are then filtered.
"""

from __future__ import annotations

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from tidelog.store._base import (
    EmptyIterator,
    StoreBase,
    swapped,
)
from tidelog.store._composite import composite_bounds, composite_step
from tidelog.store._memory_scan import SortedScan
from tidelog.store._session import SessionQueries, check_session, session_entry, session_query
from tidelog.store.contract import SessionEntry, StoreIterator


class InMemorySessionStore(SessionQueries, StoreBase):
    """A :class:`~tidelog.store.contract.SessionStore` in memory; nothing is durable.

    Iterators are weakly consistent (``tidelog.store._memory_scan``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._data = SortedDict()
        self._longest = 0

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> None:
        self._check_open()
        check_session(start, end)
        if value is None:
            self._data.pop((key, end, start), None)
            return
        self._data[(key, end, start)] = value
        self._longest = max(self._longest, end - start)

    def remove(self, key: bytes, start: int, end: int) -> None:
        self.put(key, start, end, None)

    def fetch_session(self, key: bytes, start: int, end: int) -> bytes | None:
        self._check_open()
        value: bytes | None = self._data.get((key, end, start))
        return value

    def _scan(
        self,
        method: str,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
        *,
        forward: bool,
    ) -> StoreIterator[SessionEntry]:
        self._check_open()
        if swapped(method, key_from, key_to, "key "):
            return EmptyIterator(self)
        end_from, end_to, start_max = session_query(
            earliest_session_end, latest_session_start, self._longest
        )
        if end_from > end_to:
            return EmptyIterator(self)
        lower, upper = composite_bounds(key_from, key_to, end_from, end_to)
        step = composite_step(
            end_from, end_to, forward=forward, emit=session_entry, t2_max=start_max
        )
        return SortedScan(self, self._data, lower, upper, forward=forward, step=step)

    def approximate_num_entries(self) -> int:
        self._check_open()
        return len(self._data)

    def _close_backend(self) -> None:
        self._data = SortedDict()
