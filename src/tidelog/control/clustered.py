"""The control of a broker in a cluster: what the cluster decides together, asked of it.

Invariant: the metadata store (through this broker's :class:`~tidelog.cluster.ClusterNode`) says
which streams and views exist, which broker leads each partition and who coordinates each group;
this broker serves only the partitions it leads (its replica roles refuse the rest with
``NotLeader``), and a call for another broker's partition goes there through the cluster's
routing (:meth:`ClusterControl.on_leader`), never by reading a status text. A cursor set or
read for a front that answers for keys placed on several cursor partitions (the Kafka group
coordinator) runs on each key's partition leader (:meth:`ClusterControl.set_cursor`), as this
broker, through the Liftbridge cursor calls; where cursors live is the cursor store's rule, as
for every other cursor call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc
from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.broker import (
    Broker,
    CursorStore,
    StreamConfig,
    ViewSpec,
    validate_stream_name,
)
from tidelog.cluster import ClusterNode
from tidelog.control.contract import BrokerInfo, LeaderCall, PartitionInfo, StreamInfo, ViewProgress
from tidelog.control.local import LocalControl, forwarded
from tidelog.control.single import local_progress
from tidelog.control.site_host import SiteHost
from tidelog.errors import (
    InvalidArgument,
    NotLeader,
    StreamNotFound,
    ViewNotFound,
)
from tidelog.wire import CURSOR_UNSET_KEY, CURSORS_STREAM, FORWARDED

T = TypeVar("T")

CURSOR_CALL_TIMEOUT_S: Final = 10.0
"""How long a cursor call handed to the leader of its cursor partition may take."""


class ClusterControl(LocalControl):
    """:class:`~tidelog.control.contract.Control` for a broker of a cluster (module docstring)."""

    def __init__(self, broker: Broker, node: ClusterNode, sites: SiteHost | None = None) -> None:
        super().__init__(broker, sites)
        self.node = node

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self, name: str, config: StreamConfig, replication_factor: int, min_isr: int
    ) -> None:
        validate_stream_name(name)
        await self.node.create_stream(name, config, replication_factor, min_isr)

    async def delete_stream(self, name: str) -> None:
        await self.node.delete_stream(name)

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None:
        await self.node.set_readonly(name, partitions, readonly)

    # -- metadata --------------------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        view = self.node.view
        counts: dict[str, int] = {}
        for state in view.partitions.values():
            for member in state.replicas:
                counts[member] = counts.get(member, 0) + 1
        leading = view.leading()
        found = []
        for broker_id, address in sorted(view.brokers.items()):
            host, _, port = address.rpartition(":")
            found.append(
                BrokerInfo(
                    broker_id,
                    host,
                    int(port or 0),
                    counts.get(broker_id, 0),
                    leading.get(broker_id, 0),
                )
            )
        return found

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        found = {}
        for broker_id, address in self.node.view.kafka.items():
            host, _, port = address.rpartition(":")
            if host and port.isdigit():
                found[broker_id] = (host.strip("[]"), int(port))
        return found

    def stream_names(self) -> list[str]:
        return sorted(self.node.view.streams)

    def describe_stream(self, name: str) -> StreamInfo | None:
        view = self.node.view
        record = view.streams.get(name)
        if record is None:
            return None
        local = self.broker.find_stream(name)
        partitions: dict[int, PartitionInfo] = {}
        for (stream, number), state in view.partitions.items():
            if stream != name:
                continue
            here = (
                local.partitions[number]
                if local is not None
                and number < len(local.partitions)
                and self.node.broker_id in state.replicas
                else None
            )
            partitions[number] = PartitionInfo(
                number,
                state.leader,
                tuple(state.replicas),
                tuple(state.isr),
                (name, number) in view.readonly,
                here,
                state.leader_epoch,
            )
        return StreamInfo(
            name=name,
            subject=str(record.config.get("subject", "")),
            created_ns=0 if local is None else local.created_ns,
            partitions=partitions,
            config=StreamConfig.from_json(record.config),
            replication_factor=record.replication_factor,
            min_isr=record.min_isr,
        )

    def describe_partition(self, stream: str, number: int) -> PartitionInfo:
        partition = self.broker.partition(stream, number)
        if partition.role is not None:
            partition.role.check_read(False)  # Liftbridge: the leader answers
        state = self.node.view.partitions.get((stream, number))
        if state is None:  # not in the metadata yet: as the broker holds it
            return PartitionInfo(number, "", ("",), ("",), partition.readonly, partition)
        return PartitionInfo(
            number,
            state.leader,
            tuple(state.replicas),
            tuple(state.isr),
            partition.readonly,
            partition,
            state.leader_epoch,
        )

    async def group_coordinator(self, group_id: str) -> tuple[str, int] | None:
        # Read from etcd: a client asks after a refusal, so the answer must be current.
        record = await self.node.groups.refresh(group_id)
        return None if record is None else (record.coordinator, record.epoch)

    # -- publishing and reading ------------------------------------------------------------------

    async def on_leader(
        self, stream: str, partition: int, refusal: NotLeader, call: LeaderCall[T]
    ) -> T:
        try:
            return await self.node.routing.on_leader(stream, partition, refusal, call)
        except grpc.aio.AioRpcError as error:
            raise forwarded(error) from None

    async def _admit_group(self, group: tuple[str, str, int]) -> None:
        groups = self.node.groups
        if not groups.check_subscriber(*group):
            await groups.refresh(group[0])  # the mirror may be behind the metadata

    # -- cursors and groups ----------------------------------------------------------------------

    async def cursors(self) -> CursorStore:
        return await self.node.cursors()

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        store = await self.cursors()

        async def here(_: int) -> None:
            await store.set(cursor_id, stream, partition, offset)

        async def there(channel: grpc.aio.Channel, _: int) -> None:
            request = pb.SetCursorRequest(
                stream=stream, partition=partition, cursorId=cursor_id, offset=offset
            )
            await api_pb2_grpc.APIStub(channel).SetCursor(
                request, timeout=CURSOR_CALL_TIMEOUT_S, metadata=((FORWARDED, "1"),)
            )

        await self._on_cursor_leader(store.partition_of(cursor_id, stream, partition), here, there)

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int | None:
        store = await self.cursors()

        async def here(_: int) -> int | None:
            return await store.stored(cursor_id, stream, partition)

        async def there(channel: grpc.aio.Channel, _: int) -> int | None:
            request = pb.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
            call = api_pb2_grpc.APIStub(channel).FetchCursor(
                request, timeout=CURSOR_CALL_TIMEOUT_S, metadata=((FORWARDED, "1"),)
            )
            answer = await call
            trailing = await call.trailing_metadata() or ()
            unset = any(key == CURSOR_UNSET_KEY for key, _ in trailing)
            return None if unset else answer.offset

        number = store.partition_of(cursor_id, stream, partition)
        return await self._on_cursor_leader(number, here, there)

    async def _on_cursor_leader(
        self,
        number: int,
        here: Callable[[int], Awaitable[T]],
        there: Callable[[grpc.aio.Channel, int], Awaitable[T]],
    ) -> T:
        """A cursor call on the leader of cursor partition ``number``: ``here`` when this
        broker leads it, else ``there`` on the leader's channel (``Routing.on_each_leader``:
        a leader that moved is looked up again)."""
        node = self.node
        try:
            [answer] = await node.routing.on_each_leader(
                CURSORS_STREAM, [number], node.view, here, there
            )
        except grpc.aio.AioRpcError as error:
            raise forwarded(error) from None
        return answer

    async def join_group(
        self, group_id: str, consumer_id: str, streams: list[str], *, principal: str | None = None
    ) -> tuple[str, int]:
        record = await self.node.groups.join(group_id, consumer_id, streams, principal=principal)
        return record.coordinator, record.epoch

    async def leave_group(
        self, group_id: str, consumer_id: str, *, principal: str | None = None
    ) -> None:
        await self.node.groups.leave(group_id, consumer_id, principal=principal)

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> tuple[int, dict[str, list[int]]]:
        return await self.node.groups.fetch_assignments(
            group_id, consumer_id, epoch, principal=principal
        )

    async def report_coordinator(
        self,
        group_id: str,
        consumer_id: str,
        coordinator: str,
        epoch: int,
        *,
        handed: bool,
        principal: str | None = None,
    ) -> None:
        await self.node.groups.report_coordinator(
            group_id, consumer_id, coordinator, epoch, forwarded=handed, principal=principal
        )

    # -- views -----------------------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        await self.node.declare_view(stream, spec)

    async def drop_view(self, stream: str, name: str) -> None:
        await self.node.drop_view(stream, name)

    async def view_answers(
        self,
        stream: str,
        partition: int | None,
        view: str,
        local: Callable[[int | None], Awaitable[T]],
        remote: Callable[[grpc.aio.Channel, int], Awaitable[T]],
        *,
        handed: bool,
    ) -> list[T]:
        if handed:
            return [await self._local(stream, lambda: local(partition), partition)]
        return await self._across_leaders(stream, partition, local, remote, view)

    async def view_progress(
        self,
        stream: str,
        remote: Callable[[grpc.aio.Channel, int], Awaitable[list[ViewProgress]]],
        *,
        handed: bool,
    ) -> list[ViewProgress]:
        if handed:
            return await self._local(stream, lambda: local_progress(self.broker, stream))

        async def local(_: int | None) -> list[ViewProgress]:
            return await local_progress(self.broker, stream)

        # Each partition's progress as its leader sees it, for the views the cluster has.
        answers = await self._across_leaders(stream, None, local, remote)
        defined = (await self.node.fresh_view()).views.get(stream, {})
        count = len(answers)
        merged: dict[str, ViewProgress] = {}
        for number, answer in enumerate(answers):
            for progress in answer:
                name = progress.spec.name
                if name not in defined:
                    continue  # dropped a moment ago; that leader has not removed it yet
                mine = merged.setdefault(
                    name, ViewProgress(progress.spec, [0] * count, [0] * count)
                )
                if number < len(progress.applied_offsets):
                    mine.applied_offsets[number] = progress.applied_offsets[number]
                if number < len(progress.partition_entries):
                    mine.partition_entries[number] = progress.partition_entries[number]
        for name, definition in defined.items():  # declared, built by no leader yet
            if name not in merged:
                merged[name] = ViewProgress(
                    ViewSpec.from_json(definition), [0] * count, [0] * count
                )
        return [merged[name] for name in sorted(merged)]

    async def _local(
        self, stream: str, call: Callable[[], Awaitable[T]], partition: int | None = None
    ) -> T:
        """``call`` on this broker's views: a view declared a moment ago that this broker has
        not built yet is built first (rather than answered NOT_FOUND), and a query handed over
        for ``partition`` is refused unless this broker leads it."""
        if partition is not None:
            state = self.node.view.partitions.get((stream, partition))
            if state is not None and state.leader != self.node.broker_id:
                raise NotLeader(
                    stream,
                    partition,
                    self.node.view.brokers.get(state.leader, ""),
                    leader_id=state.leader,
                    leader_epoch=state.leader_epoch,
                )
        try:
            return await call()
        except ViewNotFound:
            await self.node.sync_views(stream)  # or it was being built: asked again below
            return await call()

    async def _across_leaders(
        self,
        stream: str,
        partition: int | None,
        local: Callable[[int | None], Awaitable[T]],
        remote: Callable[[grpc.aio.Channel, int], Awaitable[T]],
        view_name: str = "",
    ) -> list[T]:
        """Per partition (all, or ``partition``), the answer of its leader: this broker's own
        views when it leads, else the leader's over gRPC. Views on followers trail the leader
        by a fetch, so only leaders answer: a query sees everything acknowledged before it.
        ``view_name``: the view must be defined in the cluster's metadata (which is what says
        whether a view exists; a broker builds or drops its copy within ``poll_s``)."""
        node = self.node
        view = node.view
        if stream not in view.streams or (
            view_name and view_name not in view.views.get(stream, {})
        ):
            view = await node.fresh_view()
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

        async def here(number: int) -> T:
            return await self._local(stream, lambda: local(number))

        try:
            return await node.routing.on_each_leader(stream, list(numbers), view, here, remote)
        except grpc.aio.AioRpcError as error:
            raise forwarded(error) from None

    # -- the cluster's own calls -----------------------------------------------------------------

    async def replica_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        return await self.node.serve_fetch(request)

    def replica_stream(
        self, first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        return self.node.serve_stream(first, acks)

    def epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        return self.node.serve_epoch_end(request)

    async def cluster_status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        return await self.node.status(stream, local_only)

    async def reassign(
        self, stream: str, partition: int, replicas: list[str]
    ) -> cpb.ClusterStatusResponse:
        await self.node.reassign(stream, partition, replicas)
        return await self.node.status(stream, local_only=True)
