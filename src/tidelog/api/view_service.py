"""The materialised-view RPCs of ``tidelog.v1``: declare, drop, list and query views."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.status import Forwarded, grpc_errors, handed_over
from tidelog.broker import (
    Broker,
    ViewEntry,
    ViewKind,
    ViewSpec,
    merge_view_ranges,
    merge_view_windows,
    newest_view_entry,
    view_query_limit,
)
from tidelog.cluster.groups import FORWARDED
from tidelog.cluster.node import ClusterNode
from tidelog.errors import (
    InvalidArgument,
    NotEnoughReplicas,
    NotLeader,
    StreamNotFound,
    ViewNotFound,
)

Context = grpc.aio.ServicerContext[object, object]
T = TypeVar("T")

LEADER_ATTEMPTS = 3
"""Tries per partition when the broker asked is no longer its leader (a failover under way)."""

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

    broker: Broker
    cluster: ClusterNode | None

    async def DeclareView(
        self, request: v1.DeclareViewRequest, context: Context
    ) -> v1.DeclareViewResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.declare_view(request.stream, spec_of(request.view))
            else:
                await self.broker.declare_view(request.stream, spec_of(request.view))
            return v1.DeclareViewResponse()
        raise AssertionError("unreachable")

    async def DropView(self, request: v1.DropViewRequest, context: Context) -> v1.DropViewResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.drop_view(request.stream, request.name)
            else:
                await self.broker.drop_view(request.stream, request.name)
            return v1.DropViewResponse()
        raise AssertionError("unreachable")

    async def ListViews(
        self, request: v1.ListViewsRequest, context: Context
    ) -> v1.ListViewsResponse:
        async with grpc_errors(context):
            if self.cluster is None or handed_over(context):
                return await self._local_status(request.stream)

            async def remote(stub: Any, _: int) -> v1.ListViewsResponse:
                answer: v1.ListViewsResponse = await stub.ListViews(
                    request, timeout=10, metadata=((FORWARDED, "1"),)
                )
                return answer

            async def local(_: int) -> v1.ListViewsResponse:
                return await self._local_status(request.stream)

            # Each partition's progress as its leader sees it, for the views the cluster has.
            answers = await self._across_leaders(request.stream, None, local, remote)
            defined = (await self.cluster.fresh_view()).views.get(request.stream, {})
            by_name: dict[str, v1.ViewStatus] = {}
            for number, answer in enumerate(answers):
                for status in answer.views:
                    if status.spec.name not in defined:
                        continue  # dropped a moment ago; that leader has not removed it yet
                    mine = by_name.setdefault(
                        status.spec.name,
                        v1.ViewStatus(
                            spec=status.spec,
                            applied_offsets=[0] * len(answers),
                            partition_entries=[0] * len(answers),
                        ),
                    )
                    if number < len(status.applied_offsets):
                        mine.applied_offsets[number] = status.applied_offsets[number]
                    if number < len(status.partition_entries):
                        mine.partition_entries[number] = status.partition_entries[number]
            for name, definition in defined.items():  # declared, built by no leader yet
                if name not in by_name:
                    by_name[name] = v1.ViewStatus(
                        spec=wire_spec(ViewSpec.from_json(definition)),
                        applied_offsets=[0] * len(answers),
                        partition_entries=[0] * len(answers),
                    )
            for status in by_name.values():
                status.entries = sum(status.partition_entries)
            return v1.ListViewsResponse(views=[by_name[n] for n in sorted(by_name)])
        raise AssertionError("unreachable")

    async def _local_status(self, stream: str) -> v1.ListViewsResponse:
        views = self.broker.views(stream)
        return v1.ListViewsResponse(
            views=[
                v1.ViewStatus(
                    spec=wire_spec(spec),
                    applied_offsets=applied,
                    entries=sum(entries),
                    partition_entries=entries,
                )
                for spec, applied, entries in await views.status()
            ]
        )

    async def ViewGet(self, request: v1.ViewGetRequest, context: Context) -> v1.ViewGetResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)

            async def local(number: int | None) -> ViewEntry | None:
                views = self.broker.views(request.stream)
                return await views.get(request.view, request.key, partition=number)

            async def remote(stub: Any, number: int) -> ViewEntry | None:
                answer = await _handed(stub.ViewGet, request, number)
                return entry_of(answer.entry) if answer.found else None

            found = newest_view_entry(await self._query(request, context, local, remote))
            if found is None:
                return v1.ViewGetResponse(found=False)
            return v1.ViewGetResponse(found=True, entry=wire_entries([found])[0])
        raise AssertionError("unreachable")

    async def ViewRange(
        self, request: v1.ViewRangeRequest, context: Context
    ) -> v1.ViewRangeResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)

            async def local(number: int | None) -> list[ViewEntry]:
                return await self.broker.views(request.stream).range(
                    request.view,
                    request.from_key if request.HasField("from_key") else None,
                    request.to_key if request.HasField("to_key") else None,
                    reverse=request.reverse,
                    limit=request.limit,
                    partition=number,
                )

            async def remote(stub: Any, number: int) -> list[ViewEntry]:
                answer = await _handed(stub.ViewRange, request, number)
                return [entry_of(e) for e in answer.entries]

            answers = await self._query(request, context, local, remote)
            limit = view_query_limit(request.limit)
            entries = merge_view_ranges(answers, request.reverse, limit)
            return v1.ViewRangeResponse(entries=wire_entries(entries))
        raise AssertionError("unreachable")

    async def WindowFetch(
        self, request: v1.WindowFetchRequest, context: Context
    ) -> v1.WindowFetchResponse:
        async with grpc_errors(context):
            _names(request.stream, request.view)

            async def local(number: int | None) -> list[ViewEntry]:
                return await self.broker.views(request.stream).window_fetch(
                    request.view,
                    request.key,
                    request.time_from_ms if request.HasField("time_from_ms") else None,
                    request.time_to_ms if request.HasField("time_to_ms") else None,
                    backward=request.backward,
                    limit=request.limit,
                    partition=number,
                )

            async def remote(stub: Any, number: int) -> list[ViewEntry]:
                answer = await _handed(stub.WindowFetch, request, number)
                return [entry_of(e) for e in answer.entries]

            answers = await self._query(request, context, local, remote)
            limit = view_query_limit(request.limit)
            entries = merge_view_windows(answers, request.backward, limit)
            return v1.WindowFetchResponse(entries=wire_entries(entries))
        raise AssertionError("unreachable")

    async def _query(
        self,
        request: Any,
        context: Context,
        local: Callable[[int | None], Awaitable[T]],
        remote: Callable[[Any, int], Awaitable[T]],
    ) -> list[T]:
        """The answers to merge for a view query (``request`` has ``stream``, ``view`` and an
        optional ``partition``): this broker's own, as one answer, on a single broker or for a
        query another broker handed over; else, in a cluster, each partition's leader's."""
        partition = request.partition if request.HasField("partition") else None
        if self.cluster is None or handed_over(context):
            return [await self._local(request.stream, lambda: local(partition), partition)]
        return await self._across_leaders(request.stream, partition, local, remote, request.view)

    # -- in a cluster: each partition's answer from its leader -----------------------------------

    async def _local(
        self, stream: str, call: Callable[[], Awaitable[T]], partition: int | None = None
    ) -> T:
        """``call`` on this broker's views; in a cluster, a view declared a moment ago that
        this broker has not built yet is built first (rather than answered NOT_FOUND), and a
        query handed over for ``partition`` is refused unless this broker leads it."""
        if self.cluster is not None and partition is not None:
            state = self.cluster.view.partitions.get((stream, partition))
            if state is not None and state.leader != self.cluster.broker_id:
                raise NotLeader(stream, partition, self.cluster.view.brokers.get(state.leader, ""))
        try:
            return await call()
        except ViewNotFound:
            if self.cluster is None:
                raise
            await self.cluster.sync_views(stream)  # or it was being built: asked again below
            return await call()

    async def _across_leaders(
        self,
        stream: str,
        partition: int | None,
        local: Callable[[int], Awaitable[T]],
        remote: Callable[[Any, int], Awaitable[T]],
        view_name: str = "",
    ) -> list[T]:
        """Per partition (all, or ``partition``), the answer of its leader: this broker's own
        views when it leads, else the leader's over gRPC. Views on followers trail the leader
        by a fetch, so only leaders answer: a query sees everything acknowledged before it.
        ``view_name``: the view must be defined in the cluster's metadata (which is what says
        whether a view exists; a broker builds or drops its copy within ``poll_s``)."""
        cluster = self.cluster
        assert cluster is not None
        view = cluster.view
        if stream not in view.streams or (
            view_name and view_name not in view.views.get(stream, {})
        ):
            view = await cluster.fresh_view()
            if stream not in view.streams:
                raise StreamNotFound(stream)
            if view_name and view_name not in view.views.get(stream, {}):
                raise ViewNotFound(stream, view_name)
        count = sum(1 for (name, _) in view.partitions if name == stream)
        if partition is not None and not 0 <= partition < count:
            raise InvalidArgument(
                f"stream {stream!r} has partitions 0..{count - 1}, not {partition}"
            )
        numbers = range(count) if partition is None else [partition]

        async def one(number: int) -> T:
            current = view
            for _ in range(LEADER_ATTEMPTS):
                state = current.partitions.get((stream, number))
                leader = "" if state is None else state.leader
                if leader == cluster.broker_id:
                    return await self._local(stream, lambda: local(number))
                address = current.brokers.get(leader)
                if address is not None:
                    stub = v1_grpc.TidelogStub(cluster.channel(address))
                    try:
                        return await remote(stub, number)
                    except grpc.aio.AioRpcError as error:
                        if not _moved(error):
                            raise Forwarded(error.code(), error.details() or "") from None
                await asyncio.sleep(0.2)  # a failover under way: the metadata will say
                current = cluster.view
            # UNAVAILABLE: retried by clients (a read), and the election ends within a lease.
            raise NotEnoughReplicas(
                f"partition {number} of {stream!r} has no reachable leader now (a failover "
                f"under way?): try again"
            )

        return list(await asyncio.gather(*(one(n) for n in numbers)))


async def _handed(call: Any, request: Any, number: int) -> Any:
    """``request`` for partition ``number`` alone, handed to that partition's leader."""
    ask = type(request)()
    ask.CopyFrom(request)
    ask.partition = number
    return await call(ask, timeout=10, metadata=((FORWARDED, "1"),))


def _moved(error: grpc.aio.AioRpcError) -> bool:
    """The broker asked no longer leads the partition, or is going away."""
    return (
        error.code() == grpc.StatusCode.UNAVAILABLE
        or "not partition leader" in (error.details() or "").lower()
    )
