"""The materialised-view RPCs of ``tidelog.v1``: declare, drop, list and query views.

Queries are answered by each partition's leader (the control decides which broker that is and
hands the query there, with the ``FORWARDED`` header, so it goes no further); this module only
translates and merges the answers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.status import handed_over
from tidelog.broker import (
    ViewEntry,
    ViewKind,
    ViewSpec,
    merge_view_ranges,
    merge_view_windows,
    newest_view_entry,
    view_query_limit,
)
from tidelog.control import Control, ViewProgress
from tidelog.errors import InvalidArgument
from tidelog.wire import FORWARDED

Context = grpc.aio.ServicerContext[object, object]
T = TypeVar("T")

FORWARD_TIMEOUT_S = 10.0
"""How long a view query handed to a partition's leader may take."""

_KINDS = {v1.VIEW_KIND_TABLE: ViewKind.TABLE, v1.VIEW_KIND_WINDOW: ViewKind.WINDOW}
_WIRE_KINDS = {kind: wire for wire, kind in _KINDS.items()}


def spec_of(message: v1.ViewSpec) -> ViewSpec:
    kind = _KINDS.get(message.kind)
    if kind is None:
        raise InvalidArgument(f"unknown view kind {message.kind}")
    return ViewSpec(message.name, kind, message.window_size_ms, message.retention_ms)


def wire_spec(spec: ViewSpec) -> v1.ViewSpec:
    return v1.ViewSpec(
        name=spec.name,
        kind=_WIRE_KINDS[spec.kind],
        window_size_ms=spec.window_size_ms,
        retention_ms=spec.retention_ms,
    )


def wire_entries(entries: Iterable[ViewEntry]) -> list[v1.ViewEntry]:
    return [
        v1.ViewEntry(
            key=e.key,
            value=e.value,
            partition=e.partition,
            offset=e.offset,
            timestamp_ns=e.timestamp_ns,
            window_start_ms=e.window_start_ms,
        )
        for e in entries
    ]


def entry_of(wire: v1.ViewEntry) -> ViewEntry:
    return ViewEntry(
        wire.key, wire.value, wire.partition, wire.offset, wire.timestamp_ns, wire.window_start_ms
    )


def _names(stream: str, view: str) -> None:
    if not stream:
        raise InvalidArgument("a view query needs a stream name")
    if not view:
        raise InvalidArgument("a view query needs a view name")


class ViewService(v1_grpc.TidelogServicer):
    """Answers the view RPCs; mixed into :class:`tidelog.api.v1.TidelogService`."""

    control: Control

    async def DeclareView(
        self, request: v1.DeclareViewRequest, context: Context
    ) -> v1.DeclareViewResponse:
        await self.control.declare_view(request.stream, spec_of(request.view))
        return v1.DeclareViewResponse()

    async def DropView(self, request: v1.DropViewRequest, context: Context) -> v1.DropViewResponse:
        await self.control.drop_view(request.stream, request.name)
        return v1.DropViewResponse()

    async def ListViews(
        self, request: v1.ListViewsRequest, context: Context
    ) -> v1.ListViewsResponse:
        async def remote(channel: grpc.aio.Channel, _: int) -> list[ViewProgress]:
            answer: v1.ListViewsResponse = await v1_grpc.TidelogStub(channel).ListViews(
                request, timeout=FORWARD_TIMEOUT_S, metadata=((FORWARDED, "1"),)
            )
            return [
                ViewProgress(spec_of(s.spec), list(s.applied_offsets), list(s.partition_entries))
                for s in answer.views
            ]

        found = await self.control.view_progress(
            request.stream, remote, handed=handed_over(context)
        )
        return v1.ListViewsResponse(
            views=[
                v1.ViewStatus(
                    spec=wire_spec(p.spec),
                    applied_offsets=p.applied_offsets,
                    entries=sum(p.partition_entries),
                    partition_entries=p.partition_entries,
                )
                for p in found
            ]
        )

    async def ViewGet(self, request: v1.ViewGetRequest, context: Context) -> v1.ViewGetResponse:
        _names(request.stream, request.view)

        async def local(number: int | None) -> ViewEntry | None:
            views = self.control.views(request.stream)
            return await views.get(request.view, request.key, partition=number)

        async def remote(channel: grpc.aio.Channel, number: int) -> ViewEntry | None:
            answer = await _handed(v1_grpc.TidelogStub(channel).ViewGet, request, number)
            return entry_of(answer.entry) if answer.found else None

        found = newest_view_entry(await self._query(request, context, local, remote))
        if found is None:
            return v1.ViewGetResponse(found=False)
        return v1.ViewGetResponse(found=True, entry=wire_entries([found])[0])

    async def ViewRange(
        self, request: v1.ViewRangeRequest, context: Context
    ) -> v1.ViewRangeResponse:
        _names(request.stream, request.view)

        async def local(number: int | None) -> list[ViewEntry]:
            return await self.control.views(request.stream).range(
                request.view,
                request.from_key if request.HasField("from_key") else None,
                request.to_key if request.HasField("to_key") else None,
                reverse=request.reverse,
                limit=request.limit,
                partition=number,
            )

        async def remote(channel: grpc.aio.Channel, number: int) -> list[ViewEntry]:
            answer = await _handed(v1_grpc.TidelogStub(channel).ViewRange, request, number)
            return [entry_of(e) for e in answer.entries]

        answers = await self._query(request, context, local, remote)
        limit = view_query_limit(request.limit)
        entries = merge_view_ranges(answers, request.reverse, limit)
        return v1.ViewRangeResponse(entries=wire_entries(entries))

    async def WindowFetch(
        self, request: v1.WindowFetchRequest, context: Context
    ) -> v1.WindowFetchResponse:
        _names(request.stream, request.view)

        async def local(number: int | None) -> list[ViewEntry]:
            return await self.control.views(request.stream).window_fetch(
                request.view,
                request.key,
                request.time_from_ms if request.HasField("time_from_ms") else None,
                request.time_to_ms if request.HasField("time_to_ms") else None,
                backward=request.backward,
                limit=request.limit,
                partition=number,
            )

        async def remote(channel: grpc.aio.Channel, number: int) -> list[ViewEntry]:
            answer = await _handed(v1_grpc.TidelogStub(channel).WindowFetch, request, number)
            return [entry_of(e) for e in answer.entries]

        answers = await self._query(request, context, local, remote)
        limit = view_query_limit(request.limit)
        entries = merge_view_windows(answers, request.backward, limit)
        return v1.WindowFetchResponse(entries=wire_entries(entries))

    async def _query(
        self,
        request: Any,
        context: Context,
        local: Callable[[int | None], Awaitable[T]],
        remote: Callable[[grpc.aio.Channel, int], Awaitable[T]],
    ) -> list[T]:
        """The answers to merge for a view query (``request`` has ``stream``, ``view`` and an
        optional ``partition``): the control's, from each partition's leader."""
        partition = request.partition if request.HasField("partition") else None
        return await self.control.view_answers(
            request.stream, partition, request.view, local, remote, handed=handed_over(context)
        )


async def _handed(call: Any, request: Any, number: int) -> Any:
    """``request`` for partition ``number`` alone, handed to that partition's leader."""
    ask = type(request)()
    ask.CopyFrom(request)
    ask.partition = number
    return await call(ask, timeout=FORWARD_TIMEOUT_S, metadata=((FORWARDED, "1"),))
