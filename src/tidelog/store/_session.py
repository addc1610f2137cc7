"""Session-store rules both backends share: valid sessions and how a find becomes a scan.

Entries are sorted by (key, end, start). A find matches ``end >= earliest_session_end`` and
``start <= latest_session_start``; it seeks each key to ``end >= earliest_session_end`` and stops
at ``end <= latest_session_start + longest``, where *longest* is the longest session ever put
(kept by the store; it never shrinks): no session ending later can start early enough. Starts
are then filtered entry by entry.
"""

from __future__ import annotations

from tidelog.store._base import TIME_MAX, TIME_MIN, check_time, clamp_time, swapped
from tidelog.store._composite import CompositeScan, composite_scan
from tidelog.store.contract import SessionEntry, StoreIterator


def session_entry(key: bytes, end: int, start: int, value: bytes) -> SessionEntry:
    return key, start, end, value


def check_session(start: int, end: int) -> None:
    check_time("start", start)
    check_time("end", end)
    if start > end:
        raise ValueError(f"a session's start must not be after its end: start={start} end={end}")


def session_query(
    earliest_session_end: int | None, latest_session_start: int | None, longest: int
) -> tuple[int, int, int | None]:
    """(end_from, end_to, start_max) for a find: the end range to scan and the start filter."""
    end_from = clamp_time(earliest_session_end, TIME_MIN)
    if latest_session_start is None:
        return end_from, TIME_MAX, None
    start_max = clamp_time(latest_session_start, TIME_MAX)
    return end_from, min(start_max + longest, TIME_MAX), start_max


def plan_session_scan(
    method: str,
    key_from: bytes | None,
    key_to: bytes | None,
    earliest_session_end: int | None,
    latest_session_start: int | None,
    longest: int,
    *,
    forward: bool,
) -> CompositeScan[SessionEntry] | None:
    """The scan a find runs on either backend, or None when nothing can match."""
    if swapped(method, key_from, key_to, "key "):
        return None
    end_from, end_to, start_max = session_query(earliest_session_end, latest_session_start, longest)
    if end_from > end_to:
        return None
    return composite_scan(
        key_from, key_to, end_from, end_to, forward=forward, emit=session_entry, t2_max=start_max
    )


class SessionQueries:
    """The public find/fetch methods of both session stores, as calls of one ``_scan``."""

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
        raise NotImplementedError

    def find_sessions(
        self, key: bytes, earliest_session_end: int | None, latest_session_start: int | None
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.find_sessions`."""
        return self._scan(
            "find_sessions", key, key, earliest_session_end, latest_session_start, forward=True
        )

    def backward_find_sessions(
        self, key: bytes, earliest_session_end: int | None, latest_session_start: int | None
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.backward_find_sessions`."""
        return self._scan(
            "backward_find_sessions",
            key,
            key,
            earliest_session_end,
            latest_session_start,
            forward=False,
        )

    def find_sessions_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.find_sessions_range`."""
        return self._scan(
            "find_sessions_range",
            key_from,
            key_to,
            earliest_session_end,
            latest_session_start,
            forward=True,
        )

    def backward_find_sessions_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.backward_find_sessions_range`."""
        return self._scan(
            "backward_find_sessions_range",
            key_from,
            key_to,
            earliest_session_end,
            latest_session_start,
            forward=False,
        )

    def fetch(self, key: bytes) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.fetch`."""
        return self._scan("fetch", key, key, None, None, forward=True)

    def backward_fetch(self, key: bytes) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.backward_fetch`."""
        return self._scan("backward_fetch", key, key, None, None, forward=False)

    def fetch_range(
        self, key_from: bytes | None, key_to: bytes | None
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.fetch_range`."""
        return self._scan("fetch_range", key_from, key_to, None, None, forward=True)

    def backward_fetch_range(
        self, key_from: bytes | None, key_to: bytes | None
    ) -> StoreIterator[SessionEntry]:
        """See :meth:`tidelog.store.contract.SessionStore.backward_fetch_range`."""
        return self._scan("backward_fetch_range", key_from, key_to, None, None, forward=False)
