"""A cluster's state from the client (``docs/cluster.md``): brokers, the controller, each
partition's leader, replicas and ISR with how far each replica's log reaches, and moving a
partition to other replicas. A single broker answers ``FailedPrecondition``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.client.errors import from_rpc_error


@dataclass(frozen=True, slots=True)
class ClusterBroker:
    broker_id: str
    address: str
    """Empty when the broker is down."""
    controller: bool
    down: bool = False
    """Named among a partition's replicas but not registered: stopped, crashed or cut off."""


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    broker_id: str
    log_end: int
    """The offset after the replica's newest record at its last fetch (-1: not known)."""
    in_sync: bool
    down: bool = False
    """Its broker is down: ``log_end`` is from before, and it has no lag to speak of."""


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    stream: str
    partition: int
    leader: str
    leader_epoch: int
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    target: tuple[str, ...]
    """While a reassignment runs, the replicas asked for; empty otherwise."""
    min_isr: int
    high_watermark: int
    """-1 when the leader could not be asked."""
    log_end: int
    followers: tuple[ReplicaProgress, ...]

    def lag(self, broker_id: str) -> int | None:
        """Records ``broker_id`` lacks of the leader's log (None: not known, or it is down)."""
        for follower in self.followers:
            if (
                follower.broker_id == broker_id
                and not follower.down
                and follower.log_end >= 0
                and self.log_end >= 0
            ):
                return max(self.log_end - follower.log_end, 0)
        return 0 if broker_id == self.leader else None

    @classmethod
    def from_wire(cls, p: cpb.PartitionStatus) -> PartitionReplicas:
        return cls(
            p.stream,
            p.partition,
            p.leader,
            p.leader_epoch,
            tuple(p.replicas),
            tuple(p.isr),
            tuple(p.target),
            p.min_isr,
            p.high_watermark,
            p.log_end,
            tuple(ReplicaProgress(f.broker, f.log_end, f.in_sync, f.down) for f in p.followers),
        )


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    cluster: str
    answered_by: str
    brokers: tuple[ClusterBroker, ...]
    partitions: tuple[PartitionReplicas, ...]

    @property
    def controller(self) -> str | None:
        return next((b.broker_id for b in self.brokers if b.controller), None)


class ClusterCalls:
    """The cluster calls of :class:`~tidelog.client.AsyncClient` (not retried: status is
    asked again by whoever polls it, a reassignment is checked with status)."""

    _channel: grpc.aio.Channel

    def _admin(self) -> Any:
        return cluster_pb2_grpc.ClusterAdminStub(self._channel)

    async def cluster_status(self, stream: str = "", timeout: float = 10.0) -> ClusterStatus:
        try:
            answer = await self._admin().ClusterStatus(
                cpb.ClusterStatusRequest(stream=stream), timeout=timeout
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return ClusterStatus(
            answer.cluster,
            answer.answered_by,
            tuple(ClusterBroker(b.id, b.address, b.controller, b.down) for b in answer.brokers),
            tuple(PartitionReplicas.from_wire(p) for p in answer.partitions),
        )

    async def reassign(
        self, stream: str, partition: int, replicas: list[str], timeout: float = 10.0
    ) -> PartitionReplicas:
        try:
            answer = await self._admin().Reassign(
                cpb.ReassignRequest(stream=stream, partition=partition, replicas=replicas),
                timeout=timeout,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return PartitionReplicas.from_wire(answer.status)
