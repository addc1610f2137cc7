"""``tidelog.v1.Replication``: what a partition's leader answers its followers; and
``tidelog.v1.ClusterAdmin``, the cluster's status and reassignments. Both are served by every
server: a single broker's control answers that it is not in a cluster."""

from __future__ import annotations

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.control import Control

Context = grpc.aio.ServicerContext[object, object]


class ReplicationService(cluster_pb2_grpc.ReplicationServicer):
    def __init__(self, control: Control) -> None:
        self.control = control

    async def ReplicaFetch(
        self, request: cpb.ReplicaFetchRequest, context: Context
    ) -> cpb.ReplicaFetchResponse:
        return await self.control.replica_fetch(request)

    async def OffsetForLeaderEpoch(
        self, request: cpb.OffsetForLeaderEpochRequest, context: Context
    ) -> cpb.OffsetForLeaderEpochResponse:
        return self.control.epoch_end(request)


class ClusterAdminService(cluster_pb2_grpc.ClusterAdminServicer):
    """``tidelog cluster status|reassign``."""

    def __init__(self, control: Control) -> None:
        self.control = control

    async def ClusterStatus(
        self, request: cpb.ClusterStatusRequest, context: Context
    ) -> cpb.ClusterStatusResponse:
        return await self.control.cluster_status(request.stream, request.local_only)

    async def Reassign(
        self, request: cpb.ReassignRequest, context: Context
    ) -> cpb.ReassignResponse:
        status = await self.control.reassign(
            request.stream, request.partition, list(request.replicas)
        )
        found = [p for p in status.partitions if p.partition == request.partition]
        return cpb.ReassignResponse(status=found[0] if found else None)
