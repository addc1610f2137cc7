"""Window-store rules both backends share: retention arguments and the time range of a query."""

from __future__ import annotations

from tidelog.store._base import TIME_MAX, TIME_MIN, clamp_time, swapped
from tidelog.store._composite import CompositeScan, composite_scan
from tidelog.store.contract import StoreIterator, WindowEntry


def window_entry(key: bytes, start: int, _seq: int, value: bytes) -> WindowEntry:
    return key, start, value


def check_retention(retention_ms: int | None) -> int | None:
    if retention_ms is not None and retention_ms <= 0:
        raise ValueError(
            f"retention_ms must be positive (or None to keep every window), got {retention_ms}"
        )
    return retention_ms


def oldest_live(retention_ms: int | None, observed: int | None) -> int:
    """The smallest window start not expired: ``observed - retention_ms + 1`` (TIME_MIN when
    nothing expires)."""
    if retention_ms is None or observed is None:
        return TIME_MIN
    return observed - retention_ms + 1


def window_time_range(
    method: str,
    key_from: bytes | None,
    key_to: bytes | None,
    time_from: int | None,
    time_to: int | None,
    live_from: int,
) -> tuple[int, int] | None:
    """The inclusive window-start range to scan, or None when the query is empty (swapped
    bounds, with a warning; or a range that has wholly expired, silently)."""
    if swapped(method, key_from, key_to, "key ") or swapped(method, time_from, time_to, "time "):
        return None
    t_from = max(clamp_time(time_from, TIME_MIN), live_from)
    t_to = clamp_time(time_to, TIME_MAX)
    return None if t_from > t_to else (t_from, t_to)


def plan_window_scan(
    method: str,
    key_from: bytes | None,
    key_to: bytes | None,
    time_from: int | None,
    time_to: int | None,
    live_from: int,
    *,
    forward: bool,
) -> CompositeScan[WindowEntry] | None:
    """The scan a fetch runs on either backend, or None when nothing can match."""
    time_range = window_time_range(method, key_from, key_to, time_from, time_to, live_from)
    if time_range is None:
        return None
    t_from, t_to = time_range
    return composite_scan(key_from, key_to, t_from, t_to, forward=forward, emit=window_entry)


class WindowQueries:
    """The public fetch methods of both window stores, as calls of one ``_scan``."""

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
        raise NotImplementedError

    def fetch(
        self, key: bytes, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.fetch`."""
        return self._scan("fetch", key, key, time_from, time_to, forward=True)

    def backward_fetch(
        self, key: bytes, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.backward_fetch`."""
        return self._scan("backward_fetch", key, key, time_from, time_to, forward=False)

    def fetch_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
    ) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.fetch_range`."""
        return self._scan("fetch_range", key_from, key_to, time_from, time_to, forward=True)

    def backward_fetch_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
    ) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.backward_fetch_range`."""
        return self._scan(
            "backward_fetch_range", key_from, key_to, time_from, time_to, forward=False
        )

    def fetch_all(self, time_from: int | None, time_to: int | None) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.fetch_all`."""
        return self._scan("fetch_all", None, None, time_from, time_to, forward=True)

    def backward_fetch_all(
        self, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.backward_fetch_all`."""
        return self._scan("backward_fetch_all", None, None, time_from, time_to, forward=False)

    def all(self) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.all`."""
        return self._scan("all", None, None, None, None, forward=True)

    def backward_all(self) -> StoreIterator[WindowEntry]:
        """See :meth:`tidelog.store.contract.WindowStore.backward_all`."""
        return self._scan("backward_all", None, None, None, None, forward=False)
