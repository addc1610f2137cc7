"""The control of a server that is one broker: every decision is this broker's own.

Invariant: there is no other broker. This one leads every partition it holds, coordinates every
group, and answers every view query from its own views; a call that needs another broker
(:meth:`SingleBroker.on_leader`) raises the refusal it was given, and the cluster's own calls
answer ``FailedPrecondition`` saying how to start a cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.broker import (
    Broker,
    CursorStore,
    StreamConfig,
    ViewSpec,
)
from tidelog.control.contract import (
    Advertised,
    BrokerInfo,
    LeaderCall,
    PartitionInfo,
    StreamInfo,
    ViewProgress,
)
from tidelog.control.local import LocalControl
from tidelog.control.site_host import SiteHost
from tidelog.errors import FailedPrecondition, InvalidArgument, NotLeader

T = TypeVar("T")

NOT_A_CLUSTER = (
    "this server is a single broker, not part of a cluster (start brokers with "
    "--cluster http://ETCD:2379 --broker-id ID)"
)


class SingleBroker(LocalControl):
    """:class:`~tidelog.control.contract.Control` for one broker (module docstring)."""

    def __init__(
        self, broker: Broker, advertised: Advertised, sites: SiteHost | None = None
    ) -> None:
        super().__init__(broker, sites)
        self.advertised = advertised

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self, name: str, config: StreamConfig, replication_factor: int, min_isr: int
    ) -> None:
        if replication_factor not in (-1, 0, 1):
            raise InvalidArgument(
                f"replication factor {replication_factor} exceeds the cluster size: this "
                f"tidelog server is a single broker (use 1, 0 or -1)"
            )
        if min_isr > 1:
            raise InvalidArgument(f"minIsr {min_isr} exceeds the cluster size of 1")
        await self.broker.wait_deleted(name)  # a delete of that name in progress
        self.broker.create_stream(name, config)

    async def delete_stream(self, name: str) -> None:
        await self.broker.delete_stream(name)

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None:
        self.broker.set_readonly(name, partitions, readonly)

    # -- metadata --------------------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        count = sum(len(s.partitions) for s in self.broker.list_streams())
        here = self.advertised
        return [BrokerInfo(here.broker_id, here.host, here.port, count, count)]

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        return {}

    def stream_names(self) -> list[str]:
        return sorted(s.name for s in self.broker.list_streams())

    def describe_stream(self, name: str) -> StreamInfo | None:
        stream = self.broker.find_stream(name)
        if stream is None:
            return None
        return StreamInfo(
            name=name,
            subject=stream.subject,
            created_ns=stream.created_ns,
            partitions={p.number: self._info(p.stream, p.number) for p in stream.partitions},
            config=stream.config,
        )

    def _info(self, stream: str, number: int) -> PartitionInfo:
        partition = self.broker.partition(stream, number)
        me = (self.advertised.broker_id,)
        return PartitionInfo(number, me[0], me, me, partition.readonly, partition, 0)

    def describe_partition(self, stream: str, number: int) -> PartitionInfo:
        return self._info(stream, number)

    async def group_coordinator(self, group_id: str) -> tuple[str, int] | None:
        epoch = self.broker.groups.epoch(group_id)
        return None if epoch is None else (self.advertised.broker_id, epoch)

    # -- publishing and reading ------------------------------------------------------------------

    async def on_leader(
        self, stream: str, partition: int, refusal: NotLeader, call: LeaderCall[T]
    ) -> T:
        raise refusal

    # -- cursors and groups ----------------------------------------------------------------------

    async def cursors(self) -> CursorStore:
        return self.broker.cursors

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        await self.broker.cursors.set(cursor_id, stream, partition, offset)

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int | None:
        return await self.broker.cursors.stored(cursor_id, stream, partition)

    async def join_group(
        self, group_id: str, consumer_id: str, streams: list[str], *, principal: str | None = None
    ) -> tuple[str, int]:
        epoch = self.broker.groups.join(group_id, consumer_id, streams, principal=principal)
        await self.broker.group_writer.saved()  # written off the loop, with others' changes
        return self.advertised.broker_id, epoch

    async def leave_group(
        self, group_id: str, consumer_id: str, *, principal: str | None = None
    ) -> None:
        self.broker.groups.leave(group_id, consumer_id, principal=principal)
        await self.broker.group_writer.saved()

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> tuple[int, dict[str, list[int]]]:
        return self.broker.groups.fetch_assignments(
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
        self.broker.groups.report_coordinator(group_id, consumer_id, epoch, principal=principal)

    # -- views -----------------------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        await self.broker.declare_view(stream, spec)

    async def drop_view(self, stream: str, name: str) -> None:
        await self.broker.drop_view(stream, name)

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
        return [await local(partition)]

    async def view_progress(
        self,
        stream: str,
        remote: Callable[[grpc.aio.Channel, int], Awaitable[list[ViewProgress]]],
        *,
        handed: bool,
    ) -> list[ViewProgress]:
        return await local_progress(self.broker, stream)

    # -- the cluster's own calls -----------------------------------------------------------------

    async def replica_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        raise FailedPrecondition(NOT_A_CLUSTER)

    async def replica_stream(
        self, first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        raise FailedPrecondition(NOT_A_CLUSTER)
        yield  # an async generator, as the contract's

    def epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        raise FailedPrecondition(NOT_A_CLUSTER)

    async def cluster_status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        raise FailedPrecondition(NOT_A_CLUSTER)

    async def reassign(
        self, stream: str, partition: int, replicas: list[str]
    ) -> cpb.ClusterStatusResponse:
        raise FailedPrecondition(NOT_A_CLUSTER)


async def local_progress(broker: Broker, stream: str) -> list[ViewProgress]:
    """The views of ``stream`` on this broker with each partition's progress here."""
    return [
        ViewProgress(spec, list(applied), list(entries))
        for spec, applied, entries in await broker.views(stream).status()
    ]
