"""Materialised views from the client: declare tables and window indexes, and query them.

:class:`ViewCalls` is mixed into :class:`~tidelog.client.AsyncClient` and
:class:`SyncViewCalls` into the blocking :class:`~tidelog.client.Client`; both speak the view
RPCs of ``tidelog.v1``. Every view call is retried while the server is unreachable: the
queries read, declaring an identical view again does nothing, and NOT_FOUND from a retried drop
means an earlier attempt dropped it (``tidelog.client.retry``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.retry import Attempt, removal

T = TypeVar("T")
Moment = int | datetime
"""A time bound: ms since the Unix epoch, or a datetime (naive means local time)."""

_KINDS: dict[str, int] = {"table": v1.VIEW_KIND_TABLE, "window": v1.VIEW_KIND_WINDOW}
_KIND_NAMES = {wire: name for name, wire in _KINDS.items()}


@dataclass(frozen=True, slots=True)
class View:
    """A view's definition: use :meth:`table` or :meth:`window`."""

    name: str
    kind: Literal["table", "window"]
    window_size_ms: int = 0
    retention_ms: int = 0
    """Window views: windows ending more than this long before the newest record are dropped;
    0 keeps every window."""

    @classmethod
    def table(cls, name: str) -> View:
        """The latest value per key (a key with an empty value is deleted)."""
        return cls(name, "table")

    @classmethod
    def window(cls, name: str, window_size_ms: int, retention_ms: int = 0) -> View:
        """Every value per key, indexed by windows of ``window_size_ms``."""
        return cls(name, "window", window_size_ms, retention_ms)

    def to_wire(self) -> v1.ViewSpec:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown view kind {self.kind!r}; use 'table' or 'window'")
        return v1.ViewSpec(
            name=self.name,
            kind=_KINDS[self.kind],  # type: ignore[arg-type]
            window_size_ms=self.window_size_ms,
            retention_ms=self.retention_ms,
        )

    @classmethod
    def from_wire(cls, spec: v1.ViewSpec) -> View:
        kind = _KIND_NAMES.get(spec.kind, "table")
        return cls(spec.name, kind, spec.window_size_ms, spec.retention_ms)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ViewStatus:
    view: View
    applied_offsets: tuple[int, ...]
    """Per partition: the next offset the view will apply."""
    entries: int
    """Approximate number of entries across partitions."""


@dataclass(frozen=True, slots=True)
class ViewEntry:
    """A value from a view and the record it came from."""

    key: bytes
    value: bytes
    partition: int
    offset: int
    timestamp: int
    """The record's broker timestamp, ns since the Unix epoch."""
    window_start_ms: int = 0
    """Window views: the start of the window holding the value."""

    @property
    def time(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp / 1e9).astimezone()

    @classmethod
    def from_wire(cls, entry: v1.ViewEntry) -> ViewEntry:
        return cls(
            entry.key,
            entry.value,
            entry.partition,
            entry.offset,
            entry.timestamp_ns,
            entry.window_start_ms,
        )


def millis(moment: Moment) -> int:
    if isinstance(moment, datetime):
        return int(moment.timestamp() * 1000)
    return int(moment)


class ViewCalls:
    """The view calls of :class:`~tidelog.client.AsyncClient`."""

    _v1: v1_grpc.TidelogAsyncStub

    async def _retrying(self, attempt: Attempt[T], timeout: float | None = None) -> T:
        raise NotImplementedError  # provided by AsyncClient

    async def declare_view(self, stream: str, view: View) -> None:
        """Add ``view`` to ``stream``; it is built from the oldest retained message and then
        follows every publish. Declaring an identical view again does nothing; another view of
        the same name fails with AlreadyExists."""
        request = v1.DeclareViewRequest(stream=stream, view=view.to_wire())

        async def attempt(timeout: float | None, number: int) -> None:
            await self._v1.DeclareView(request, timeout=timeout)

        await self._retrying(attempt)

    async def drop_view(self, stream: str, name: str) -> None:
        request = v1.DropViewRequest(stream=stream, name=name)

        await self._retrying(removal(lambda timeout: self._v1.DropView(request, timeout=timeout)))

    async def list_views(self, stream: str) -> list[ViewStatus]:
        request = v1.ListViewsRequest(stream=stream)

        async def attempt(timeout: float | None, number: int) -> v1.ListViewsResponse:
            return await self._v1.ListViews(request, timeout=timeout)

        response = await self._retrying(attempt)
        return [
            ViewStatus(View.from_wire(s.spec), tuple(s.applied_offsets), s.entries)
            for s in response.views
        ]

    async def view_get(self, stream: str, view: str, key: bytes) -> ViewEntry | None:
        """The latest value of ``key`` in table ``view``, or None."""
        request = v1.ViewGetRequest(stream=stream, view=view, key=key)

        async def attempt(timeout: float | None, number: int) -> v1.ViewGetResponse:
            return await self._v1.ViewGet(request, timeout=timeout)

        response = await self._retrying(attempt)
        return ViewEntry.from_wire(response.entry) if response.found else None

    async def view_range(
        self,
        stream: str,
        view: str,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
        partition: int | None = None,
    ) -> list[ViewEntry]:
        """Entries of table ``view`` with ``from_key <= key <= to_key`` (None: open at that
        end), ascending by key, or descending with ``reverse``; at most ``limit`` (server
        default 1000). ``from_key > to_key`` fails with InvalidArgument."""
        request = v1.ViewRangeRequest(stream=stream, view=view, reverse=reverse, limit=limit or 0)
        if from_key is not None:
            request.from_key = from_key
        if to_key is not None:
            request.to_key = to_key
        if partition is not None:
            request.partition = partition

        async def attempt(timeout: float | None, number: int) -> v1.ViewRangeResponse:
            return await self._v1.ViewRange(request, timeout=timeout)

        response = await self._retrying(attempt)
        return [ViewEntry.from_wire(e) for e in response.entries]

    async def window_fetch(
        self,
        stream: str,
        view: str,
        key: bytes,
        time_from: Moment | None = None,
        time_to: Moment | None = None,
        *,
        backward: bool = False,
        limit: int | None = None,
    ) -> list[ViewEntry]:
        """Values of ``key`` in window ``view`` whose timestamps lie in [time_from, time_to]
        (inclusive; None: open), oldest first, or newest first with ``backward``; at most
        ``limit`` (server default 1000)."""
        request = v1.WindowFetchRequest(
            stream=stream, view=view, key=key, backward=backward, limit=limit or 0
        )
        if time_from is not None:
            request.time_from_ms = millis(time_from)
        if time_to is not None:
            request.time_to_ms = millis(time_to)

        async def attempt(timeout: float | None, number: int) -> v1.WindowFetchResponse:
            return await self._v1.WindowFetch(request, timeout=timeout)

        response = await self._retrying(attempt)
        return [ViewEntry.from_wire(e) for e in response.entries]

    async def last_values(
        self,
        stream: str,
        view: str,
        key: bytes,
        count: int,
        time_from: Moment | None = None,
        time_to: Moment | None = None,
    ) -> list[ViewEntry]:
        """The last ``count`` values of ``key`` with timestamps in [time_from, time_to], newest
        first: one backward fetch that stops after ``count`` values."""
        return await self.window_fetch(
            stream, view, key, time_from, time_to, backward=True, limit=count
        )


class SyncViewCalls:
    """The blocking forms of :class:`ViewCalls`, mixed into :class:`~tidelog.client.Client`."""

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # provided by Client

    def _view_calls(self) -> ViewCalls:
        raise NotImplementedError  # provided by Client

    def declare_view(self, stream: str, view: View) -> None:
        self._run(self._view_calls().declare_view(stream, view))

    def drop_view(self, stream: str, name: str) -> None:
        self._run(self._view_calls().drop_view(stream, name))

    def list_views(self, stream: str) -> list[ViewStatus]:
        return self._run(self._view_calls().list_views(stream))

    def view_get(self, stream: str, view: str, key: bytes) -> ViewEntry | None:
        return self._run(self._view_calls().view_get(stream, view, key))

    def view_range(
        self,
        stream: str,
        view: str,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
        partition: int | None = None,
    ) -> list[ViewEntry]:
        return self._run(
            self._view_calls().view_range(
                stream, view, from_key, to_key, reverse=reverse, limit=limit, partition=partition
            )
        )

    def window_fetch(
        self,
        stream: str,
        view: str,
        key: bytes,
        time_from: Moment | None = None,
        time_to: Moment | None = None,
        *,
        backward: bool = False,
        limit: int | None = None,
    ) -> list[ViewEntry]:
        return self._run(
            self._view_calls().window_fetch(
                stream, view, key, time_from, time_to, backward=backward, limit=limit
            )
        )

    def last_values(
        self,
        stream: str,
        view: str,
        key: bytes,
        count: int,
        time_from: Moment | None = None,
        time_to: Moment | None = None,
    ) -> list[ViewEntry]:
        return self._run(
            self._view_calls().last_values(stream, view, key, count, time_from, time_to)
        )


__all__ = ["Moment", "SyncViewCalls", "View", "ViewCalls", "ViewEntry", "ViewStatus"]
