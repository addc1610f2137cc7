"""``tidelog.v1.Replication``: what a partition's leader answers its followers
(``tidelog.cluster.node``). Registered only when the server runs in a cluster."""

from __future__ import annotations

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.api.status import grpc_errors
from tidelog.cluster.node import ClusterNode

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
