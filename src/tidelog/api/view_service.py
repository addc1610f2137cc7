"""The materialised-view RPCs of ``tidelog.v1``: declare, drop, list and query views."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.status import grpc_errors
from tidelog.broker import Broker, ViewEntry, ViewKind, ViewSpec
from tidelog.errors import InvalidArgument

Context = grpc.aio.ServicerContext[object, object]

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


def _names(stream: str, view: str) -> None:
    if not stream:
        raise InvalidArgument("a view query needs a stream name")
    if not view:
        raise InvalidArgument("a view query needs a view name")


class ViewService(v1_grpc.TidelogServicer):
    """Answers the view RPCs; mixed into :class:`tidelog.api.v1.TidelogService`."""

    broker: Broker

    async def DeclareView(
        self, request: v1.DeclareViewRequest, context: Context
    ) -> v1.DeclareViewResponse:
        async with grpc_errors(context):
            await self.broker.declare_view(request.stream, spec_of(request.view))
            return v1.DeclareViewResponse()
        raise AssertionError("unreachable")

    async def DropView(self, request: v1.DropViewRequest, context: Context) -> v1.DropViewResponse:
        async with grpc_errors(context):
            await self.broker.drop_view(request.stream, request.name)
            return v1.DropViewResponse()
        raise AssertionError("unreachable")

    async def ListViews(
        self, request: v1.ListViewsRequest, context: Context
    ) -> v1.ListViewsResponse:
        async with grpc_errors(context):
            views = self.broker.views(request.stream)
            return v1.ListViewsResponse(
                views=[
                    v1.ViewStatus(spec=wire_spec(spec), applied_offsets=applied, entries=entries)
                    for spec, applied, entries in await views.status()
                ]
            )
        raise AssertionError("unreachable")

    async def ViewGet(self, request: v1.ViewGetRequest, context: Context) -> v1.ViewGetResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)
            found = await self.broker.views(request.stream).get(request.view, request.key)
            if found is None:
                return v1.ViewGetResponse(found=False)
            return v1.ViewGetResponse(found=True, entry=wire_entries([found])[0])
        raise AssertionError("unreachable")

    async def ViewRange(
        self, request: v1.ViewRangeRequest, context: Context
    ) -> v1.ViewRangeResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)
            entries = await self.broker.views(request.stream).range(
                request.view,
                request.from_key if request.HasField("from_key") else None,
                request.to_key if request.HasField("to_key") else None,
                reverse=request.reverse,
                limit=request.limit,
                partition=request.partition if request.HasField("partition") else None,
            )
            return v1.ViewRangeResponse(entries=wire_entries(entries))
        raise AssertionError("unreachable")

    async def WindowFetch(
        self, request: v1.WindowFetchRequest, context: Context
    ) -> v1.WindowFetchResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)
            entries = await self.broker.views(request.stream).window_fetch(
                request.view,
                request.key,
                request.time_from_ms if request.HasField("time_from_ms") else None,
                request.time_to_ms if request.HasField("time_to_ms") else None,
                backward=request.backward,
                limit=request.limit,
            )
            return v1.WindowFetchResponse(entries=wire_entries(entries))
        raise AssertionError("unreachable")
