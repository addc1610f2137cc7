"""``tidelog.v1.Replication``: what a partition's leader answers its followers
(``tidelog.cluster.node``), registered only when the server runs in a cluster; and
``tidelog.v1.ClusterAdmin``, the cluster's status and reassignments, on every server."""

from __future__ import annotations

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.api.status import grpc_errors
from tidelog.cluster.node import ClusterNode
from tidelog.errors import FailedPrecondition

Context = grpc.aio.ServicerContext[object, object]


class ReplicationService(cluster_pb2_grpc.ReplicationServicer):
    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    async def ReplicaFetch(
        self, request: cpb.ReplicaFetchRequest, context: Context
    ) -> cpb.ReplicaFetchResponse:
        async with grpc_errors(context):
            return await self.node.serve_fetch(request)
        raise AssertionError("unreachable")

    async def OffsetForLeaderEpoch(
        self, request: cpb.OffsetForLeaderEpochRequest, context: Context
    ) -> cpb.OffsetForLeaderEpochResponse:
        async with grpc_errors(context):
            return self.node.serve_epoch_end(request)
        raise AssertionError("unreachable")


class ClusterAdminService(cluster_pb2_grpc.ClusterAdminServicer):
    """``tidelog cluster status|reassign``; a single broker says it is not in a cluster."""

    def __init__(self, node: ClusterNode | None) -> None:
        self.node = node

    def _node(self) -> ClusterNode:
        if self.node is None:
            raise FailedPrecondition(
                "this server is a single broker, not part of a cluster (start brokers with "
                "--cluster http://ETCD:2379 --broker-id ID)"
            )
        return self.node

    async def ClusterStatus(
        self, request: cpb.ClusterStatusRequest, context: Context
    ) -> cpb.ClusterStatusResponse:
        async with grpc_errors(context):
            return await self._node().status(request.stream, request.local_only)
        raise AssertionError("unreachable")

    async def Reassign(
        self, request: cpb.ReassignRequest, context: Context
    ) -> cpb.ReassignResponse:
        async with grpc_errors(context):
            node = self._node()
            await node.reassign(request.stream, request.partition, list(request.replicas))
            status = await node.status(request.stream, local_only=True)
            found = [p for p in status.partitions if p.partition == request.partition]
            return cpb.ReassignResponse(status=found[0] if found else None)
        raise AssertionError("unreachable")
