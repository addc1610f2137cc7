"""``ClusterNode``: a broker's part in a cluster, put together from pieces, one concern each.

- ``settings.py`` — ``ClusterSettings`` and the cluster's fixed defaults;
- ``roles.py`` — each partition's replica role here (leader, follower, neither, undecided);
- ``controller.py`` — elections, reassignments, and the ISR changes a leader makes;
- ``reconcile.py`` — this broker made to match the cluster's state (roles, flags, views);
- ``follower.py`` / ``serving.py`` — the two sides of replica fetch;
- ``routing.py`` — where each partition's leader is, and channels to brokers;
- ``admin.py`` — streams created, deleted and moved, flags, views, internal streams;
- ``status.py`` — the cluster's status as this broker sees it;
- ``groups.py`` — consumer groups (``metadata.py``, ``placement.py``, ``replication.py`` and
  ``leader_epochs.py`` are the pieces' own building blocks).

This class holds what they share (the view last read, the replica roles, membership, the
metadata store) and runs the loop; every piece takes a narrow host protocol that this class
implements, so none imports it. Its invariant: one step at a time, and every step starts from
one read of the cluster's state, which replaces ``view`` whole.

Theory of operation (``docs/cluster.md``):

- **Membership.** The node registers its broker id and advertised address (and its Kafka
  listener's, when it runs one) in etcd with a lease (``metadata.Membership``). A lease that
  expires while the process was paused or cut off is noticed on the next refresh: the node
  registers again, and until it has read the cluster's state anew it leads nothing.
- **One loop** (``_run``) reads the whole cluster state every ``poll_s`` (one etcd range read)
  and makes this broker match it. Every decision is taken from that state and written back by
  compare-and-set on the partition epoch, so a decision taken on a stale state loses.
- **The controller** (the broker holding the ``controller`` key) elects a new leader from the
  live ISR when a partition's leader is not live (``placement.elect``; no unclean election).
- **A partition's leader** (``LeaderReplica``) takes publishes; its high watermark is the
  smallest ISR log end, and readers of its log see only that far (the log's commit limit). It
  shrinks the ISR of followers that stopped catching up for ``replica_lag_max_s`` and expands it
  with followers that reached its log end, both by compare-and-set (as Kafka's leaders once
  wrote ISR changes to ZooKeeper themselves). It marks the partition ready in etcd once open.
- **A follower** (``FollowerReplica``) asks its leader where its own newest epoch ends,
  truncates there, then fetches in a loop (``ReplicaFetch``, long-polled) and appends with the
  leader's offsets and timestamps. A fetch refused for its epoch waits for the next state.
- A publish with ack policy ALL returns once the high watermark passes it; while the ISR is
  below ``minIsr`` the high watermark stands still and such publishes fail after the ack timeout
  with ``NotEnoughReplicas`` (retryable); what was acknowledged is on every ISR member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.broker import Broker, CursorStore, Stream, StreamConfig, ViewSpec
from tidelog.cluster.admin import Admin
from tidelog.cluster.controller import Controller
from tidelog.cluster.follower import ReplicaFetcher
from tidelog.cluster.groups import ClusterGroups
from tidelog.cluster.metadata import (
    ClusterView,
    Membership,
    Metadata,
    PartitionState,
)
from tidelog.cluster.reconcile import Reconciler
from tidelog.cluster.roles import PartitionRole, Undecided
from tidelog.cluster.routing import Routing
from tidelog.cluster.serving import FetchServer
from tidelog.cluster.settings import ClusterSettings
from tidelog.cluster.status import StatusReport
from tidelog.errors import MetadataUnavailable

LOG = logging.getLogger("tidelog.cluster")

__all__ = ["ClusterNode", "ClusterSettings"]


class ClusterNode:
    """One broker's membership of a cluster: the loop, the shared state, and the calls the
    servers make, each answered by the piece that owns it (see the module docstring)."""

    def __init__(self, broker: Broker, settings: ClusterSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.broker_id = settings.broker_id
        self.view = ClusterView()
        self.routing = Routing(self, settings.peer_tls)
        """Where each partition's leader is, and the channels to the other brokers."""
        self.groups = ClusterGroups(self)
        """Consumer groups in etcd; the broker's own coordinator becomes their mirror."""
        self.roles: dict[tuple[str, int], PartitionRole] = {}
        self.member = False
        self._metadata_cm: Any = None
        self.metadata: Metadata | None = None
        self.membership: Membership | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._warned = 0.0
        self._failing: set[str] = set()
        """Parts of the step that failed last time (logged once until they succeed)."""
        self._revision = 0
        """The etcd revision of the last view read by the step."""
        self.fetch_delay_s = float(os.environ.get("TIDELOG_TEST_REPLICA_FETCH_DELAY_S") or 0)
        """Fault tests: each fetch answer waits this long before the follower appends it (a slow
        follower or link; docs/operations.md). Zero otherwise."""
        self._controller = Controller(self)
        self._reconciler = Reconciler(self, self._controller, self.routing)
        self._admin = Admin(self, self._reconciler)
        self._fetcher = ReplicaFetcher(self)
        self._server = FetchServer(self)
        self._status = StatusReport(self)
        if not broker.config.clustered:
            raise ValueError(
                "a cluster node needs a broker made with BrokerConfig(clustered=True): its logs "
                "must open held at their saved high watermarks"
            )
        # From now on (before the server answers anything): no partition is served until this
        # node has given it its role.
        broker.hold_partitions(lambda partition: Undecided(self.routing, partition))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.ack_timeout_s <= self.settings.replica_lag_max_s:
            LOG.warning(
                "cluster_ack_timeout_s (%g) is not above replica_lag_max_s (%g): a publish with "
                "ack ALL that waits for a follower that stopped fails before the ISR drops it",
                self.settings.ack_timeout_s,
                self.settings.replica_lag_max_s,
            )
        self.broker.hosted_elsewhere = self.routing._elsewhere
        self._metadata_cm = Metadata.connect(
            self.settings.etcd, self.settings.cluster, self.settings.etcd_tls
        )
        self.metadata = await self._metadata_cm.__aenter__()
        try:
            await self._register()
            await self._step()
        except BaseException:
            await self._metadata_cm.__aexit__(None, None, None)
            raise
        self._task = asyncio.create_task(self._run(), name="cluster")

    async def _register(self) -> None:
        assert self.metadata is not None
        deadline = time.monotonic() + 3 * self.settings.lease_ttl_s
        while True:
            try:
                self.membership = await self.metadata.register(
                    self.broker_id,
                    self.settings.advertise,
                    self.settings.lease_ttl_s,
                    kafka=self.settings.kafka_advertise,
                )
                break
            except ValueError:
                # Our own key from before a restart (kill -9) lives until its lease expires.
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.member = True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.member = False
        for role in list(self.roles.values()):
            with contextlib.suppress(Exception):
                await role.checkpoint()
            # Stepped down but still attached: until the process ends, a publish here is
            # refused (NotLeader), never appended as if this were a single broker.
            await role.close()
        await self.routing.close()
        if self.membership is not None:
            await self.membership.close()
        if self._metadata_cm is not None:
            await self._metadata_cm.__aexit__(None, None, None)

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except MetadataUnavailable as error:
                if time.monotonic() - self._warned > 10:
                    LOG.warning("cluster metadata unavailable: %s", error)
                    self._warned = time.monotonic()
            except Exception:
                LOG.exception("cluster step failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.settings.poll_s)
            self._changed.clear()

    async def _step(self) -> None:
        assert self.metadata is not None and self.membership is not None
        if self.membership.lost:
            self.member = False
            for role in self.roles.values():
                role.step_down()
            await self.membership.lapse()
            await self._register()
        view = await self.metadata.view()
        if view.revision < self._revision:
            # etcd went back (restored from a snapshot, or replaced): the revisions remembered
            # to skip older reads mean nothing now.
            LOG.warning("etcd revision went back from %d to %d", self._revision, view.revision)
            self._reconciler.forget_revisions()
            self.metadata.flags_written_at = 0
            self.groups.forget_revisions()
        self._revision = view.revision
        self.view = view
        self.groups.follow(view)
        if view.controller is None:
            await self.metadata.campaign(self.broker_id, self.membership)
        elif view.controller == self.broker_id:
            await self._controller.control(view)
        await self._reconciler.reconcile(view)
        # Partitions first (above): what follows must never keep a step from electing leaders
        # or following them, so each part fails alone, logged, and is tried at the next step.
        if view.controller == self.broker_id:
            await self.isolated("group coordinators", self.groups.control(view))
        if view.revision >= self.metadata.flags_written_at:  # else: read before our own write
            await self.isolated("read-only flags", self._reconciler.reconcile_flags(view))
            await self.isolated("views", self._reconciler.reconcile_views(view))
        await self.isolated("group expiry", self.groups.expire())

    async def isolated(self, what: str, work: Awaitable[None]) -> None:
        """Run ``work``, one part of the step: a failure is logged once (until it succeeds) and
        tried again at the next step, so it never keeps the other parts from running."""
        try:
            await work
        except MetadataUnavailable:
            raise
        except Exception:
            if what not in self._failing:  # once, not every 100 ms
                LOG.exception("cluster step: %s failed; trying again at every step", what)
            self._failing.add(what)
        else:
            self._failing.discard(what)

    def wake(self) -> None:
        """Run the step now rather than at the next poll (a change was just written)."""
        self._changed.set()

    async def fresh_view(self) -> ClusterView:
        assert self.metadata is not None
        try:
            return await self.metadata.view()
        except MetadataUnavailable:
            return self.view

    # -- administration (admin.py, status.py) ----------------------------------------------------

    async def create_stream(
        self,
        name: str,
        config: StreamConfig,
        replication_factor: int,
        min_isr: int,
        *,
        colocate: str = "",
    ) -> None:
        await self._admin.create_stream(
            name, config, replication_factor, min_isr, colocate=colocate
        )

    async def delete_stream(self, name: str) -> None:
        await self._admin.delete_stream(name)

    async def reassign(self, stream: str, number: int, replicas: list[str]) -> PartitionState:
        return await self._admin.reassign(stream, number, replicas)

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None:
        await self._admin.set_readonly(name, partitions, readonly)

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        await self._admin.declare_view(stream, spec)

    async def drop_view(self, stream: str, name: str) -> None:
        await self._admin.drop_view(stream, name)

    async def sync_views(self, stream: str) -> None:
        await self._admin.sync_views(stream)

    async def cursors(self) -> CursorStore:
        return await self._admin.cursors()

    async def internal_stream(
        self, name: str, config: StreamConfig, *, colocate: str = ""
    ) -> Stream:
        return await self._admin.internal_stream(name, config, colocate=colocate)

    async def status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        return await self._status.status(stream, local_only)

    # -- routing (routing.py) --------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        return self.routing.channel(address)

    def leads(self, stream: str, number: int) -> bool:
        return self.routing.leads(stream, number)

    def leader_address(self, stream: str, number: int) -> str | None:
        return self.routing.leader_address(stream, number)

    # -- replication between brokers (follower.py, serving.py) -----------------------------------

    async def follow(self, role: PartitionRole, leader_id: str, leader_epoch: int) -> None:
        await self._fetcher.follow(role, leader_id, leader_epoch)

    async def serve_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        return await self._server.serve_fetch(request)

    def serve_stream(
        self, first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        return self._server.serve_stream(first, acks)

    def serve_epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        return self._server.serve_epoch_end(request)
