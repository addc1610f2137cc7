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
)
from tidelog.store._memory_scan import SortedScan
from tidelog.store._session import SessionQueries, check_session, plan_session_scan
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
        plan = plan_session_scan(
            method,
            key_from,
            key_to,
            earliest_session_end,
            latest_session_start,
            self._longest,
            forward=forward,
        )
        if plan is None:
            return EmptyIterator(self)
        return SortedScan(self, self._data, plan.lower, plan.upper, forward=forward, step=plan.step)

    def approximate_num_entries(self) -> int:
        self._check_open()
        return len(self._data)

    def _close_backend(self) -> None:
        self._data = SortedDict()
