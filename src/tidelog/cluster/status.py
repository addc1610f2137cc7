"""The cluster's status as one broker sees it (``ClusterStatus``, ``tidelog cluster status``).

Invariants. A read: nothing here changes the cluster or this broker. Brokers that are down have
no registration but are listed, as down, while a partition names them. A partition's replica
progress (high watermark, log ends, in-sync) comes from its leader only: this broker's own
replica when it leads, else asked of the leading broker once per broker with ``local_only``
(which never asks further); a leader that does not answer leaves that progress unknown (-1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.cluster.metadata import ClusterView
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.settings import ClusterSettings


class StatusHost(Protocol):
    """What the status needs of the node."""

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def view(self) -> ClusterView: ...

    @property
    def roles(self) -> Mapping[tuple[str, int], PartitionRole]: ...

    async def fresh_view(self) -> ClusterView: ...

    def channel(self, address: str) -> grpc.aio.Channel: ...


class StatusReport:
    """Answers ``ClusterStatus`` from this broker's view and its leaders' progress."""

    def __init__(self, host: StatusHost) -> None:
        self._host = host

    async def status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        """The cluster as this broker sees it, with each partition's replica progress from its
        leader (asked over ClusterStatus unless ``local_only``)."""
        host = self._host
        view = host.view if local_only else await host.fresh_view()
        response = cpb.ClusterStatusResponse(
            cluster=host.settings.cluster,
            answered_by=host.broker_id,
            brokers=[
                cpb.ClusterBroker(id=b, address=a, controller=b == view.controller)
                for b, a in sorted(view.brokers.items())
            ],
        )
        # A broker that is down has no registration; the partitions that name it still do.
        named = {b for state in view.partitions.values() for b in (*state.replicas, *state.target)}
        response.brokers.extend(
            cpb.ClusterBroker(id=b, down=True) for b in sorted(named - set(view.brokers))
        )
        remote: dict[str, list[tuple[str, int]]] = {}
        for (name, number), state in sorted(view.partitions.items()):
            if stream and name != stream:
                continue
            record = view.streams.get(name)
            entry = cpb.PartitionStatus(
                stream=name,
                partition=number,
                leader=state.leader,
                leader_epoch=state.leader_epoch,
                replicas=state.replicas,
                isr=state.isr,
                target=state.target,
                high_watermark=-1,
                log_end=-1,
                min_isr=1 if record is None else record.min_isr,
            )
            role = host.roles.get((name, number))
            if role is not None and role.leader is not None:
                leader = role.leader
                entry.high_watermark = leader.high_watermark
                entry.log_end = leader.log_end
                ends = leader.follower_ends()
                for member in state.replicas:
                    if member != host.broker_id:
                        entry.followers.append(
                            cpb.ReplicaProgress(
                                broker=member,
                                log_end=ends.get(member, -1),
                                in_sync=member in leader.isr,
                                down=member not in view.brokers,
                            )
                        )
            elif state.leader in view.brokers and state.leader != host.broker_id:
                remote.setdefault(state.leader, []).append((name, number))
            response.partitions.append(entry)
        if not local_only:
            await self._merge_remote(response, view, remote, stream)
        return response

    async def _merge_remote(
        self,
        response: cpb.ClusterStatusResponse,
        view: ClusterView,
        remote: dict[str, list[tuple[str, int]]],
        stream: str,
    ) -> None:
        """Fill in the progress of partitions other brokers lead, asking each once."""
        host = self._host
        at = {(p.stream, p.partition): p for p in response.partitions}
        for broker, _partitions in remote.items():
            stub = cluster_pb2_grpc.ClusterAdminStub(host.channel(view.brokers[broker]))
            try:
                answer = await stub.ClusterStatus(
                    cpb.ClusterStatusRequest(stream=stream, local_only=True), timeout=2
                )
            except grpc.aio.AioRpcError:
                continue  # that leader does not answer: its progress stays unknown (-1)
            for theirs in answer.partitions:
                mine = at.get((theirs.stream, theirs.partition))
                if mine is not None and theirs.log_end >= 0 and theirs.leader == broker:
                    mine.high_watermark = theirs.high_watermark
                    mine.log_end = theirs.log_end
                    del mine.followers[:]
                    mine.followers.extend(theirs.followers)
