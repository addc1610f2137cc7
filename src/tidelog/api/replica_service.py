"""``tidelog.v1.Replication``: what a partition's leader answers its followers; and
``tidelog.v1.ClusterAdmin``, the cluster's status and reassignments. Both are served by every
server: a single broker's control answers that it is not in a cluster.

A follower's id is its identity, never what its request says. When the caller was identified
(a client certificate under mutual TLS, whose first subject alternative name, rewritten by the
principal rules, is a broker's id; or a token), the ``follower`` a fetch claims must be that
identity: a caller allowed inter-broker calls (``cluster`` on the cluster) still cannot keep
another broker in the ISR by fetching in its name. Without credentials (no TLS, or TLS without
client certificates) the claim cannot be checked and is taken as it is (``docs/security.md``,
"Brokers trust brokers").
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.access import ANONYMOUS, caller
from tidelog.control import Control
from tidelog.errors import PermissionDenied

Context = grpc.aio.ServicerContext[object, object]


class ReplicationService(cluster_pb2_grpc.ReplicationServicer):
    def __init__(self, control: Control) -> None:
        self.control = control

    async def ReplicaFetch(
        self, request: cpb.ReplicaFetchRequest, context: Context
    ) -> cpb.ReplicaFetchResponse:
        claimed_broker(request.follower, "fetch as follower")
        return await self.control.replica_fetch(request)

    async def ReplicaStream(  # type: ignore[override]  # the responses come serialised
        self, request_iterator: AsyncIterator[cpb.ReplicaFetchRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """The stream is its first request's follower's: the later requests are only its
        acknowledgements (their ``follower`` is not read). Its responses come serialised (the
        service's serializer passes bytes through, ``decoding.passing_bytes``)."""
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        claimed_broker(first.follower, "fetch as follower")
        async for response in self.control.replica_stream(first, request_iterator):
            yield response

    async def OffsetForLeaderEpoch(
        self, request: cpb.OffsetForLeaderEpochRequest, context: Context
    ) -> cpb.OffsetForLeaderEpochResponse:
        return self.control.epoch_end(request)


def claimed_broker(claimed: str, doing: str) -> None:
    """Refuse (``PERMISSION_DENIED``) a broker id claimed by an identified caller that is not
    that broker (module docstring)."""
    identity = caller().identity
    if identity != ANONYMOUS and claimed != identity:
        raise PermissionDenied(
            f"{identity} may not {doing} {claimed!r}: a broker calls in its own name (its "
            f"certificate's first subject alternative name is its broker id)"
        )


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
