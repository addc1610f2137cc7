"""A broker's part in a cluster: membership, the controller's duties, and each replicated
partition's role on this broker.

Theory of operation (``docs/cluster.md``):

- **Membership.** The node registers its broker id and advertised address in etcd with a lease
  (``metadata.Membership``). A lease that expires while the process was paused or cut off is
  noticed on the next refresh: the node registers again, and until it has read the cluster's
  state anew it leads nothing.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from tidelog import columns
from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.broker import (
    CURSORS_STREAM,
    HW_CHECKPOINT,
    Broker,
    CursorStore,
    FlushPolicy,
    Partition,
    Stream,
    StreamConfig,
    StreamViews,
    ViewSpec,
    replace_json,
    saved_high_watermark,
)
from tidelog.cluster.groups import ClusterGroups
from tidelog.cluster.leader_epochs import EpochEnd, EpochEntry
from tidelog.cluster.metadata import (
    ClusterView,
    Membership,
    Metadata,
    MetadataUnavailable,
    PartitionState,
    StreamRecord,
)
from tidelog.cluster.placement import (
    align,
    colocated,
    elect,
    expand_isr,
    finish_reassignment,
    follow_anchor,
    place,
    reassign,
    shrink_isr,
    widen,
)
from tidelog.cluster.replication import (
    FETCH_MAX_RECORDS,
    FetchAnswer,
    FollowerReplica,
    LeaderReplica,
    StaleEpoch,
    StoredRecords,
)
from tidelog.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotEnoughReplicas,
    NotLeader,
    PartitionNotFound,
    PermissionDenied,
    StreamExists,
    StreamNotFound,
    ViewExists,
    ViewNotFound,
)
from tidelog.wire import MAX_FRAME

LOG = logging.getLogger("tidelog.cluster")

CURSOR_REPLICAS = 3
"""Replicas of ``__cursors`` in a cluster (fewer when the cluster has fewer live brokers when
the first cursor is set)."""
INTERNAL_REPLICAS = 3
"""Replicas of the other internal streams the cluster creates (``ClusterNode.internal_stream``;
fewer when fewer brokers are live then)."""

CHECKPOINT_INTERVAL_S = 1.0
"""How often the high watermarks are written (a restart may restart from one this old)."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    etcd: str
    """The etcd endpoint, http://HOST:PORT."""
    broker_id: str
    advertise: str
    """HOST:PORT other brokers and clients reach this broker at."""
    cluster: str = "default"
    lease_ttl_s: int = 3
    poll_s: float = 0.1
    replica_lag_max_s: float = 5.0
    ack_timeout_s: float = 10.0
    """Above ``replica_lag_max_s``: an ack ALL publish that waits for a follower that stopped
    gets through once the ISR has dropped it, rather than failing at that very moment."""

    @property
    def fetch_wait_ms(self) -> int:
        """How long a follower's fetch waits at the leader for records: half the lag a follower
        may have before it leaves the ISR (a waiting follower counts caught up anyway:
        ``LeaderReplica.hold``). A record, or a higher high watermark, answers at once, so the
        wait costs no latency; what it sets is how often an idle partition's followers ask."""
        return max(round(self.replica_lag_max_s * 500), 50)


class PartitionRole:
    """The :class:`ReplicaRole` of one partition on this broker: leader, follower or neither."""

    def __init__(self, node: ClusterNode, partition: Partition) -> None:
        self.node = node
        self.partition = partition
        self.leader: LeaderReplica | None = None
        self.follower: FollowerReplica | None = None
        self.following: tuple[str, int] | None = None
        """(leader id, leader epoch) the fetch task follows."""
        self._task: asyncio.Task[None] | None = None
        self._listener: Callable[[int], None] | None = None
        self.state: PartitionState | None = None
        self.saved_hw = -1
        self.known_hw = saved_high_watermark(partition.directory)
        """The high watermark last known here, restored from the checkpoint on a restart."""

    # -- ReplicaRole -----------------------------------------------------------------------------

    def check_publish(self) -> None:
        if self.leader is None or not self.node.member:
            raise NotLeader(self.partition.stream, self.partition.number, self._leader_address())

    async def replicated(self, last_offset: int) -> None:
        deadline = time.monotonic() + self.node.settings.ack_timeout_s
        leader = self.leader
        while leader is not None and leader.high_watermark < last_offset:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                isr = ", ".join(sorted(leader.isr))
                raise NotEnoughReplicas(
                    f"offset {last_offset} of {self.partition.stream}/{self.partition.number} "
                    f"was not copied by every in-sync replica within "
                    f"{self.node.settings.ack_timeout_s:g} s (ISR: {isr}; minIsr "
                    f"{leader.min_isr}): publish again once the replicas are back"
                )
            # asyncio.wait, not wait_for: the signal's future is shared, never cancel it.
            await asyncio.wait([self.partition.signal.current()], timeout=min(remaining, 0.5))
            if self.leader is not leader:
                raise self._moved(last_offset)
        if leader is None:
            raise self._moved(last_offset)

    def _moved(self, last_offset: int) -> NotEnoughReplicas:
        """The leadership moved after the append and before the ISR had it: the record may be
        stored (the new leader has it if it copied it), so this is not "not the leader" (which
        tells a client nothing was done, and a plain publish would be sent again and stored
        twice), but a retryable failure whose outcome is unknown."""
        partition = self.partition
        return NotEnoughReplicas(
            f"the leadership of {partition.stream}/{partition.number} moved before every "
            f"in-sync replica had offset {last_offset}: it may be stored; publish again with a "
            f"producer id to be sure it is stored once"
        )

    def check_read(self, read_replica: bool) -> None:
        if self.leader is not None:
            return
        if read_replica and self.follower is not None:
            return
        raise NotLeader(self.partition.stream, self.partition.number, self._leader_address())

    def opened(self, log: Any) -> None:
        log.set_commit_limit(self.high_watermark)

    # -- state -----------------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        if self.leader is not None:
            return self.leader.high_watermark
        if self.follower is not None:
            return self.follower.high_watermark
        return self.known_hw

    def _leader_address(self) -> str:
        state = self.state
        if state is None or not state.leader:
            return ""
        return self.node.view.brokers.get(state.leader, "")

    async def checkpoint(self) -> None:
        """Write the high watermark if it moved (a restart resumes from it), in a thread."""
        hw = self.high_watermark
        if hw != self.saved_hw and not (self.partition.deleted or self.partition.closed):
            await asyncio.to_thread(replace_json, self.partition.directory / HW_CHECKPOINT, hw)
            self.saved_hw = hw

    def lead(self, state: PartitionState, min_isr: int) -> bool:
        """Become (or stay) the leader of ``state``; True when leadership is new."""
        if self.leader is not None and self.leader.leader_epoch == state.leader_epoch:
            self.leader.set_isr(state.isr, min_isr)
            return False
        self.stop_following()
        known = self.high_watermark
        partition = self.partition
        partition.reload_producers()
        self.leader = LeaderReplica(
            partition,
            self.node.broker_id,
            state.leader_epoch,
            state.isr,
            high_watermark=known,
            min_isr=min_isr,
        )
        loop = asyncio.get_running_loop()
        leader = self.leader

        def committed(_: int) -> None:  # local appends move a lone leader's high watermark
            loop.call_soon_threadsafe(leader.advance)

        self._listener = committed
        partition.log.add_listener(committed)
        leader.advance()
        LOG.info(
            "leading %s/%d at leader epoch %d (ISR %s)",
            partition.stream,
            partition.number,
            state.leader_epoch,
            ",".join(state.isr),
        )
        return True

    def step_down(self) -> None:
        leader, self.leader = self.leader, None
        if leader is not None:
            self.known_hw = leader.high_watermark
            if self._listener is not None:
                with contextlib.suppress(Exception):
                    self.partition.log.remove_listener(self._listener)
                self._listener = None
            self.partition.signal.fire()  # ack waiters learn at once

    def follow(self, leader_id: str, leader_epoch: int) -> None:
        if self.following == (leader_id, leader_epoch) and self._task is not None:
            return
        self.step_down()
        self.stop_following()
        if self.follower is None:
            self.follower = FollowerReplica(self.partition, self.node.broker_id)
            self.follower.high_watermark = self.known_hw
        self.following = (leader_id, leader_epoch)
        self._task = asyncio.create_task(
            self.node.follow(self, leader_id, leader_epoch),
            name=f"follow {self.partition.stream}/{self.partition.number}",
        )

    def stop_following(self) -> None:
        task, self._task = self._task, None
        self.following = None
        if task is not None:
            task.cancel()
        if self.follower is not None:
            self.known_hw = max(self.known_hw, self.follower.high_watermark)

    async def close(self) -> None:
        task = self._task
        self.stop_following()
        self.step_down()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Outsider:
    """The :class:`ReplicaRole` of a partition this broker holds no replica of (a stream is
    created whole on every broker that replicates any of its partitions, or one that was moved
    away): it serves nothing and names the leader."""

    def __init__(self, node: ClusterNode, stream: str, number: int) -> None:
        self.node = node
        self.stream = stream
        self.number = number

    def _refuse(self) -> NotLeader | StreamNotFound:
        return NotLeader(
            self.stream, self.number, self.node._elsewhere(self.stream, self.number) or ""
        )

    def check_publish(self) -> None:
        raise self._refuse()

    async def replicated(self, last_offset: int) -> None:
        raise self._refuse()

    def check_read(self, read_replica: bool) -> None:
        raise self._refuse()

    def opened(self, log: Any) -> None:
        log.set_commit_limit(-1)


class Undecided(Outsider):
    """The :class:`ReplicaRole` of every partition of a broker of a cluster until the node has
    read the cluster's state and given the partition its own role (``Broker.hold_partitions``):
    a restarted broker serves nothing it has not been told it leads or follows.

    Without it a partition loaded from disk had no role at all between the gRPC server's start
    and the node's first step, and took publishes as a single broker's: appended, synced and
    acknowledged without the leader check or the ISR wait, then cut when the broker followed
    the real leader (or, within the same leader epoch, kept, so the follower diverged)."""

    def __init__(self, node: ClusterNode, partition: Partition) -> None:
        super().__init__(node, partition.stream, partition.number)

    def _refuse(self) -> NotLeader | StreamNotFound:
        node = self.node
        if node.view.revision > 0 and self.stream not in node.view.streams:
            # On this broker's disk, but the cluster has no such stream (deleted while this
            # broker was away): not found, rather than "no leader now; retry" for ever.
            return StreamNotFound(self.stream)
        return super()._refuse()

    def opened(self, log: Any) -> None:
        """Nothing to do: a clustered broker opens every log held at the high watermark saved
        here (``Partition``'s ``held``), and a commit limit can only be raised."""


class ClusterNode:
    def __init__(self, broker: Broker, settings: ClusterSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.broker_id = settings.broker_id
        self.view = ClusterView()
        self.groups = ClusterGroups(self)
        """Consumer groups in etcd; the broker's own coordinator becomes their mirror."""
        self.roles: dict[tuple[str, int], PartitionRole] = {}
        self.member = False
        self._metadata_cm: Any = None
        self.metadata: Metadata | None = None
        self.membership: Membership | None = None
        self._task: asyncio.Task[None] | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._changed = asyncio.Event()
        self._warned = 0.0
        self._failing: set[str] = set()
        """Parts of the step that failed last time (logged once until they succeed)."""
        self._views_revision: dict[str, int] = {}
        """Stream -> the etcd revision of the newest view its views were reconciled with."""
        self._revision = 0
        """The etcd revision of the last view read by the step."""
        self._views_lock = asyncio.Lock()
        """One views reconcile at a time: the step's and a query's (``sync_views``)."""
        self._checkpointed = 0.0
        self._stale: set[str] = set()
        """Streams on this broker's disk that the cluster did not have when the node looked
        (deleted while it was away): refused, and replaced if the cluster creates the name."""
        self.fetch_delay_s = float(os.environ.get("TIDELOG_TEST_REPLICA_FETCH_DELAY_S") or 0)
        """Fault tests: each fetch answer waits this long before the follower appends it (a slow
        follower or link; docs/operations.md). Zero otherwise."""
        if not broker.config.clustered:
            raise ValueError(
                "a cluster node needs a broker made with BrokerConfig(clustered=True): its logs "
                "must open held at their saved high watermarks"
            )
        # From now on (before the server answers anything): no partition is served until this
        # node has given it its role.
        broker.hold_partitions(lambda partition: Undecided(self, partition))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.ack_timeout_s <= self.settings.replica_lag_max_s:
            LOG.warning(
                "cluster_ack_timeout_s (%g) is not above replica_lag_max_s (%g): a publish with "
                "ack ALL that waits for a follower that stopped fails before the ISR drops it",
                self.settings.ack_timeout_s,
                self.settings.replica_lag_max_s,
            )
        self.broker.hosted_elsewhere = self._elsewhere
        self._metadata_cm = Metadata.connect(self.settings.etcd, self.settings.cluster)
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
                    self.broker_id, self.settings.advertise, self.settings.lease_ttl_s
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
        for channel in self._channels.values():
            await channel.close()
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
            self._views_revision.clear()
            self.metadata.flags_written_at = 0
            self.groups.forget_revisions()
        self._revision = view.revision
        self.view = view
        self.groups.follow(view)
        if view.controller is None:
            await self.metadata.campaign(self.broker_id, self.membership)
        elif view.controller == self.broker_id:
            await self._control(view)
        await self._reconcile(view)
        # Partitions first (above): what follows must never keep a step from electing leaders
        # or following them, so each part fails alone, logged, and is tried at the next step.
        if view.controller == self.broker_id:
            await self._isolated("group coordinators", self.groups.control(view))
        if view.revision >= self.metadata.flags_written_at:  # else: read before our own write
            await self._isolated("read-only flags", self._reconcile_flags(view))
            await self._isolated("views", self._reconcile_views(view))
        await self._isolated("group expiry", self.groups.expire())

    async def _isolated(self, what: str, work: Awaitable[None]) -> None:
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

    # -- the controller --------------------------------------------------------------------------

    async def _control(self, view: ClusterView) -> None:
        assert self.metadata is not None
        live = set(view.brokers)
        for (stream, number), state in _anchors_first(view):
            new = elect(state, live) or finish_reassignment(state)
            record = view.streams.get(stream)
            anchor = None if record is None else view.partitions.get((record.colocate, 0))
            if (
                new is not None
                and anchor is not None
                and new.leader != anchor.leader
                and anchor.leader in new.isr
                and anchor.leader in live
                and new.leader_epoch > state.leader_epoch
            ):
                # A new leader for a colocated partition: the anchor's (elected first, in this
                # pass) when it may lead, rather than another move at the next pass.
                new = replace(new, leader=anchor.leader)
            if new is None and anchor is not None:
                new = follow_anchor(state, anchor, live) or align(state, anchor, live)
            elif new is None and record is not None and stream.startswith("__"):
                new = widen(state, INTERNAL_REPLICAS, live, sorted(live))
            if new is None:
                continue
            written = await self.metadata.update_partition(
                stream, number, state.partition_epoch, new
            )
            if written is not None:
                LOG.info(
                    "controller: %s/%d leader %s -> %s (leader epoch %d), replicas %s",
                    stream,
                    number,
                    state.leader or "-",
                    written.leader,
                    written.leader_epoch,
                    ",".join(written.replicas),
                )
                view.partitions[stream, number] = written
        await self._widened(view)

    async def _widened(self, view: ClusterView) -> None:
        """Internal streams that gained replicas (``placement.widen``): their records say so
        once the reassignment is done, and their minIsr becomes 2 (what it would have been had
        the replicas been live at creation) once every partition has two in sync."""
        assert self.metadata is not None
        internal: dict[str, list[PartitionState]] = {}  # one pass over the partitions
        for (name, _), state in view.partitions.items():
            if name.startswith("__"):
                internal.setdefault(name, []).append(state)
        for name, states in internal.items():
            record = view.streams.get(name)
            if record is None or any(s.target for s in states):
                continue
            factor = min(len(s.replicas) for s in states)
            in_sync = min(len(s.isr) for s in states)
            wider = replace(
                record,
                replication_factor=max(record.replication_factor, factor),
                min_isr=2 if record.min_isr < 2 <= in_sync else record.min_isr,
            )
            if wider != record and await self.metadata.update_stream(name, wider):
                view.streams[name] = wider
                LOG.info(
                    "controller: %s has %d replicas now (minIsr %d)",
                    name,
                    wider.replication_factor,
                    wider.min_isr,
                )

    # -- this broker's partitions ----------------------------------------------------------------

    async def _reconcile(self, view: ClusterView) -> None:
        assert self.metadata is not None and self.membership is not None
        seen: set[tuple[str, int]] = set()
        for (stream, number), state in sorted(view.partitions.items()):
            if self.broker_id not in state.replicas:
                continue
            record = view.streams.get(stream)
            if record is None:
                continue
            if stream in self._stale:
                await self._replace_stale(stream)
            role = self._role(stream, number, record)
            if role is None:
                continue
            seen.add((stream, number))
            role.state = state
            marked = view.ready.get((stream, number), {}).get(self.broker_id)
            if state.leader == self.broker_id:
                if role.lead(state, record.min_isr) and stream == CURSORS_STREAM:
                    # Before any await: no set can reach the new leader before its index.
                    read = self.broker.cursors.rebuild(number)
                    LOG.info("%s/%d: cursor index rebuilt from %d records", stream, number, read)
                if marked != state.leader_epoch:
                    await self.metadata.mark_ready(
                        stream, number, self.broker_id, state.leader_epoch, self.membership.lease
                    )
                await self._adjust_isr(stream, number, state, role)
            elif state.leader and state.leader in view.brokers:
                role.follow(state.leader, state.leader_epoch)
                if marked != state.leader_epoch:
                    await self.metadata.mark_ready(
                        stream, number, self.broker_id, state.leader_epoch, self.membership.lease
                    )
            else:
                role.step_down()
                role.stop_following()
        if time.monotonic() - self._checkpointed >= CHECKPOINT_INTERVAL_S:
            self._checkpointed = time.monotonic()
            for key in seen:
                await self.roles[key].checkpoint()
        for key in [k for k in self.roles if k not in seen]:
            role = self.roles.pop(key)
            await role.close()
            role.partition.role = Outsider(self, *key)
            if key[0] not in view.streams and self.broker.find_stream(key[0]) is not None:
                LOG.info("stream %s was deleted from the cluster: deleting it here", key[0])
                with contextlib.suppress(StreamNotFound):
                    await self.broker.delete_stream(key[0])
        for name in view.streams:
            local = self.broker.find_stream(name)
            if local is None:
                continue
            for partition in local.partitions:
                if (name, partition.number) not in seen and (
                    partition.role is None or isinstance(partition.role, Undecided)
                ):
                    partition.role = Outsider(self, name, partition.number)
        for local in self.broker.list_streams():
            if (
                local.name not in view.streams
                and local.name not in self._stale
                and not local.name.startswith("__")  # internal: their owners manage them
                and all(isinstance(p.role, Undecided) for p in local.partitions)
            ):
                self._stale.add(local.name)
                LOG.warning(
                    "stream %s is on this broker's disk but not in the cluster (deleted while "
                    "this broker was away?): refused as not found, and its files are kept "
                    "until the cluster creates a stream of that name again",
                    local.name,
                )

    async def _replace_stale(self, name: str) -> None:
        """The cluster created ``name`` again while this broker held the files of the stream
        of that name deleted while it was away: those go first, so the new stream's replica
        here starts empty (a leader elected at creation would otherwise serve the old
        records)."""
        self._stale.discard(name)
        LOG.warning(
            "stream %s was created again in the cluster: removing the files this broker kept of "
            "the one deleted while it was away",
            name,
        )
        with contextlib.suppress(StreamNotFound):
            await self.broker.delete_stream(name)

    def _role(self, stream: str, number: int, record: StreamRecord) -> PartitionRole | None:
        role = self.roles.get((stream, number))
        if role is not None and not (role.partition.deleted or role.partition.closed):
            return role
        found = self.broker.find_stream(stream)
        if found is None:
            config = StreamConfig.from_json(record.config)
            if stream.startswith("__"):  # the cluster's internal streams (sites' queues)
                found = self.broker.internal_stream(stream, config)
            else:
                found = self.broker.create_stream(stream, config)
        if number >= len(found.partitions):
            LOG.error("%s has %d partitions here, the cluster says more", stream, number)
            return None
        partition = found.partitions[number]
        if partition.paused:
            # Paused before it was replicated here (or by an older build): a replica must be
            # open to follow or lead, and replicated partitions are never paused.
            self.broker.resume(partition)
        role = PartitionRole(self, partition)
        partition.role = role
        if partition.current_log is not None:
            role.opened(partition.current_log)
        self.roles[stream, number] = role
        return role

    async def _adjust_isr(
        self, stream: str, number: int, state: PartitionState, role: PartitionRole
    ) -> None:
        assert self.metadata is not None
        leader = role.leader
        if leader is None:
            return
        new: PartitionState | None = None
        lagging = leader.lagging(self.settings.replica_lag_max_s)
        if lagging:
            new = shrink_isr(state, lagging)
        else:
            # In sync again (Kafka's rule): it holds everything the ISR holds (the high
            # watermark) and has fetched into the current leader epoch.
            ends = leader.follower_ends()
            floor = max(leader.high_watermark + 1, leader.epoch_start)
            lag = self.settings.replica_lag_max_s
            for member in state.replicas:
                if (
                    member not in state.isr
                    and ends.get(member, -1) >= floor
                    and leader.caught_up(member, lag / 2)
                ):
                    new = expand_isr(state, member)
                    break
        if new is None:
            return
        written = await self.metadata.update_partition(stream, number, state.partition_epoch, new)
        if written is not None:
            LOG.info("%s/%d ISR %s -> %s", stream, number, ",".join(state.isr), ",".join(new.isr))
            role.state = written
            leader.set_isr(written.isr)

    def _elsewhere(self, stream: str, number: int) -> str | None:
        view = self.view
        if stream not in view.streams:
            return None
        state = view.partitions.get((stream, max(number, 0)))
        if state is None:
            return None
        return view.brokers.get(state.leader, "")

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str,
        config: StreamConfig,
        replication_factor: int,
        min_isr: int,
        *,
        colocate: str = "",
    ) -> None:
        """Place a new stream's partitions on live brokers and wait until every leader has
        opened its partition (``StreamExists`` if the name is taken). ``colocate``: the stream
        whose partition 0 this one lives and leads with (``placement.colocated``; the
        replication factor is then that partition's)."""
        assert self.metadata is not None
        view = await self.metadata.view()
        if replication_factor == 0:
            replication_factor = 1
        if colocate:
            anchor = view.partitions.get((colocate, 0))
            if anchor is None:
                raise StreamNotFound(colocate)
            states = colocated(config.partitions, anchor)
            min_isr = min(min_isr, len(states[0].isr))  # the anchor's replicas decide
        else:
            states = place(
                config.partitions, replication_factor, list(view.brokers), view.leading()
            )
        factor = len(states[0].replicas)
        if min_isr < 0 or min_isr > factor:
            raise InvalidArgument(
                f"minIsr {min_isr} is more than the stream's {factor} replicas: use 1 to {factor}"
            )
        record = StreamRecord(config.to_json(), factor, max(min_isr, 1), colocate)
        if not await self.metadata.create_stream(name, record, states):
            raise StreamExists(name)
        self._changed.set()
        await self._wait_ready(name, config.partitions)

    async def cursors(self) -> CursorStore:
        """The broker's cursor store, once ``__cursors`` is a replicated stream of the cluster
        (created here on first use: ``cursor_partitions`` partitions, three replicas or every
        broker if fewer, minIsr 2 or 1) and every local partition of it has its role, so a set
        is appended only by a partition's leader and acknowledged once the ISR has it."""
        assert self.metadata is not None
        if CURSORS_STREAM not in self.view.streams:
            view = await self.metadata.view()
            if CURSORS_STREAM not in view.streams:
                factor = min(CURSOR_REPLICAS, max(len(view.brokers), 1))
                config = StreamConfig(partitions=self.broker.config.cursor_partitions, compact=True)
                with contextlib.suppress(StreamExists):  # another broker created it first
                    await self.create_stream(CURSORS_STREAM, config, factor, min(2, factor))
        store = self.broker.cursors
        deadline = time.monotonic() + 10
        while True:
            record = self.view.streams.get(CURSORS_STREAM)
            if record is not None:
                wanted = StreamConfig.from_json(record.config).partitions
                if wanted != len(store.stream.partitions):
                    raise FailedPrecondition(
                        f"this broker's {CURSORS_STREAM} has {len(store.stream.partitions)} "
                        f"partitions, the cluster's {wanted}: give every broker the same "
                        f"cursor_partitions"
                    )
                if all(
                    p.role is not None and not isinstance(p.role, Undecided)
                    for p in store.stream.partitions
                ):
                    return store
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(
                    f"{CURSORS_STREAM} is not assigned on this broker yet: try again"
                )
            self._changed.set()  # reconcile now rather than at the next poll
            await asyncio.sleep(self.settings.poll_s)

    async def internal_stream(
        self, name: str, config: StreamConfig, *, colocate: str = ""
    ) -> Stream:
        """The internal stream ``name`` as a replicated stream of the cluster, for the parts above
        the broker that keep their state in streams (the sites' queues): created on first use
        (``INTERNAL_REPLICAS`` replicas, or every live broker if fewer, and minIsr 2, or 1 on a
        lone broker; ``colocate``: placed and led with that stream's partition 0), and returned
        once every partition of it here has its role. Appends to it are a leader's only, and
        acknowledged with ``durable`` once the ISR holds them. ``FailedPrecondition`` when this
        broker holds no replica of it; ``NotEnoughReplicas`` (retryable) while it is not
        assigned here yet."""
        assert self.metadata is not None
        if name not in self.view.streams:
            view = await self.metadata.view()
            if name not in view.streams:
                factor = min(INTERNAL_REPLICAS, max(len(view.brokers), 1))
                with contextlib.suppress(StreamExists):  # another broker created it first
                    await self.create_stream(
                        name, config, factor, min(2, factor), colocate=colocate
                    )
        deadline = time.monotonic() + 10
        while True:
            view = self.view
            record = view.streams.get(name)
            if record is not None:
                states = stream_states(view, name)
                if states and all(self.broker_id not in s.replicas for s in states.values()):
                    raise FailedPrecondition(
                        f"{name} has no replica on broker {self.broker_id}: its leader "
                        f"{states[0].leader or '(none yet)'} serves it"
                    )
                local = self.broker.find_stream(name)
                if local is not None and all(
                    (name, p.number) in self.roles for p in local.partitions
                ):
                    return local
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(f"{name} is not assigned on this broker yet: try again")
            self._changed.set()  # reconcile now rather than at the next poll
            await asyncio.sleep(self.settings.poll_s)

    def leads(self, stream: str, number: int) -> bool:
        """Whether this broker is the serving leader of ``stream``/``number`` now: the cluster
        names it and its replica has taken the leadership."""
        role = self.roles.get((stream, number))
        state = self.view.partitions.get((stream, number))
        return (
            self.member
            and role is not None
            and role.leader is not None
            and state is not None
            and state.leader == self.broker_id
            and role.leader.leader_epoch == state.leader_epoch
        )

    def leader_address(self, stream: str, number: int) -> str | None:
        """``HOST:PORT`` of the live leader of ``stream``/``number`` (None: none now)."""
        state = self.view.partitions.get((stream, number))
        if state is None or not state.leader:
            return None
        return self.view.brokers.get(state.leader)

    async def _wait_ready(self, name: str, partitions: int) -> None:
        """Until every partition's leader and live replicas have opened it: 10 s, and 50 ms
        more per partition (500 partitions of three replicas took 9.4 s on a loaded 2-core
        machine)."""
        assert self.metadata is not None
        timeout_s = 10.0 + 0.05 * partitions
        deadline = time.monotonic() + timeout_s
        while True:
            view = await self.metadata.view()
            if all(view.opened(name, n) for n in range(partitions)):
                return
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(
                    f"stream {name!r} was created but its leaders did not open it within "
                    f"{timeout_s:g} s: check `tidelog cluster status`"
                )
            await asyncio.sleep(0.05)

    async def reassign(self, stream: str, number: int, replicas: list[str]) -> PartitionState:
        """Start moving a partition to ``replicas`` (compare-and-set; retried on a race)."""
        assert self.metadata is not None
        for _ in range(10):
            view = await self.metadata.view()
            state = view.partitions.get((stream, number))
            if state is None:
                raise (
                    StreamNotFound(stream)
                    if stream not in view.streams
                    else InvalidArgument(f"stream {stream!r} has no partition {number}")
                )
            if state.target:
                raise InvalidArgument(
                    f"{stream}/{number} is being moved to {','.join(state.target)} already: "
                    f"wait until `tidelog cluster status` shows it done"
                )
            new = reassign(state, replicas, set(view.brokers))
            written = await self.metadata.update_partition(
                stream, number, state.partition_epoch, new
            )
            if written is not None:
                self._changed.set()
                return written
        raise NotEnoughReplicas(f"{stream}/{number} kept changing; try the reassignment again")

    async def status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        """The cluster as this broker sees it, with each partition's replica progress from its
        leader (asked over ClusterStatus unless ``local_only``)."""
        view = self.view if local_only else await self.fresh_view()
        response = cpb.ClusterStatusResponse(
            cluster=self.settings.cluster,
            answered_by=self.broker_id,
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
            role = self.roles.get((name, number))
            if role is not None and role.leader is not None:
                leader = role.leader
                entry.high_watermark = leader.high_watermark
                entry.log_end = leader.log_end
                ends = leader.follower_ends()
                for member in state.replicas:
                    if member != self.broker_id:
                        entry.followers.append(
                            cpb.ReplicaProgress(
                                broker=member,
                                log_end=ends.get(member, -1),
                                in_sync=member in leader.isr,
                                down=member not in view.brokers,
                            )
                        )
            elif state.leader in view.brokers and state.leader != self.broker_id:
                remote.setdefault(state.leader, []).append((name, number))
            response.partitions.append(entry)
        if not local_only:
            await self._merge_remote(response, view, remote, stream)
        return response

    async def fresh_view(self) -> ClusterView:
        assert self.metadata is not None
        try:
            return await self.metadata.view()
        except MetadataUnavailable:
            return self.view

    async def _merge_remote(
        self,
        response: cpb.ClusterStatusResponse,
        view: ClusterView,
        remote: dict[str, list[tuple[str, int]]],
        stream: str,
    ) -> None:
        """Fill in the progress of partitions other brokers lead, asking each once."""
        at = {(p.stream, p.partition): p for p in response.partitions}
        for broker, _partitions in remote.items():
            stub = cluster_pb2_grpc.ClusterAdminStub(self.channel(view.brokers[broker]))
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

    async def delete_stream(self, name: str) -> None:
        assert self.metadata is not None
        if not await self.metadata.delete_stream(name):
            raise StreamNotFound(name)
        self._changed.set()

    # -- read-only partitions --------------------------------------------------------------------

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None:
        """Make partitions (none named: all) read-only, or writable again, on every replica:
        the flag goes to etcd first, then this broker applies it at once and every other
        replica within one metadata read (:meth:`_reconcile_flags`)."""
        assert self.metadata is not None
        if name.startswith("__"):
            raise PermissionDenied(
                f"stream {name!r} is internal: only the broker may change the read-only flag of "
                f"it (it is read with the usual calls; cursors are set with SetCursor)"
            )
        view = await self.fresh_view()
        record = view.streams.get(name)
        if record is None:
            raise StreamNotFound(name)
        count = int(record.config.get("partitions", 1))
        chosen = sorted(set(partitions)) or list(range(count))
        for number in chosen:
            if not 0 <= number < count:
                raise PartitionNotFound(name, number, count)
        if not await self.metadata.set_readonly(name, chosen, readonly):
            raise StreamNotFound(name)
        for number in chosen:
            if readonly:
                self.view.readonly.add((name, number))
            else:
                self.view.readonly.discard((name, number))
        await self._reconcile_flags(self.view, only=name)
        self._changed.set()

    async def _reconcile_flags(self, view: ClusterView, only: str | None = None) -> None:
        """Make the local copies of the cluster's streams read-only as the metadata says."""
        for name in view.streams if only is None else [only]:
            local = self.broker.find_stream(name)
            if local is None or name.startswith("__"):
                continue
            for partition in local.partitions:
                wanted = (name, partition.number) in view.readonly
                if partition.readonly != wanted:
                    self.broker.set_readonly(name, [partition.number], wanted)

    # -- views -----------------------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        """Declare a view on every replica of ``stream``: its definition goes to etcd (declaring
        an identical one again is a no-op), and each replica builds it from its own log once
        it reads the metadata (:meth:`_reconcile_views`)."""
        assert self.metadata is not None
        spec.validate()
        if stream.startswith("__"):
            raise InvalidArgument(f"stream {stream!r} is internal and takes no views")
        created, existing = await self.metadata.declare_view(stream, spec.name, spec.to_json())
        if not created:
            if existing is None:
                raise StreamNotFound(stream)
            if ViewSpec.from_json(existing) != spec:
                raise ViewExists(stream, spec.name)
        self._changed.set()

    async def drop_view(self, stream: str, name: str) -> None:
        assert self.metadata is not None
        if not await self.metadata.drop_view(stream, name):
            view = await self.fresh_view()
            raise (
                StreamNotFound(stream) if stream not in view.streams else ViewNotFound(stream, name)
            )
        self._changed.set()

    async def sync_views(self, stream: str) -> None:
        """Read the metadata now and make ``stream``'s views here match it (a view declared a
        moment ago that this broker has not built yet); returns once no other reconcile is
        building them either."""
        view = await self.fresh_view()
        await self._reconcile_views(view, only=stream)

    async def _reconcile_views(self, view: ClusterView, only: str | None = None) -> None:
        """Make the local copies of every stream (or ``only``) carry the cluster's views, no
        more."""
        async with self._views_lock:
            await self._reconcile_views_locked(view, only)

    async def _reconcile_views_locked(self, view: ClusterView, only: str | None) -> None:
        for name in view.streams if only is None else [only]:
            if name not in view.streams:
                continue  # not (or no longer) the cluster's: its copy goes with the stream
            if view.revision < self._views_revision.get(name, 0):
                continue  # read before what another reconcile (a query's) applied here
            self._views_revision[name] = view.revision
            local = self.broker.find_stream(name)
            if local is None or name.startswith("__"):
                continue
            # Each stream alone: one that cannot be matched does not hold back the others.
            await self._isolated(f"views of {name}", self._match_views(name, local.views, view))

    async def _match_views(self, name: str, have: StreamViews, view: ClusterView) -> None:
        wanted = {n: ViewSpec.from_json(d) for n, d in view.views.get(name, {}).items()}
        for view_name in [n for n in have.specs if n not in wanted]:
            await self.broker.drop_view(name, view_name)
        for view_name, spec in wanted.items():
            if have.specs.get(view_name) != spec:
                if view_name in have.specs:  # redefined: dropped and declared again
                    await self.broker.drop_view(name, view_name)
                await self.broker.declare_view(name, spec)

    # -- replication between brokers -------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", MAX_FRAME),
                    ("grpc.max_send_message_length", MAX_FRAME),
                ],
            )
            self._channels[address] = channel
        return channel

    def leading(self, stream: str, number: int) -> LeaderReplica:
        role = self.roles.get((stream, number))
        if role is None or role.leader is None:
            raise NotLeader(stream, number, "" if role is None else role._leader_address())
        return role.leader

    async def follow(self, role: PartitionRole, leader_id: str, leader_epoch: int) -> None:
        """Copy the leader's log until cancelled (a new state, a close)."""
        partition = role.partition
        follower = role.follower
        assert follower is not None
        stub: Any = None
        next_offset: int | None = None
        backoff = 0.05
        released = 0
        while True:
            try:
                address = self.view.brokers.get(leader_id)
                if address is None:
                    await asyncio.sleep(self.settings.poll_s)
                    continue
                stub = cluster_pb2_grpc.ReplicationStub(self.channel(address))
                if next_offset is None:
                    asked = follower.epochs.latest_epoch
                    reply = await stub.OffsetForLeaderEpoch(
                        cpb.OffsetForLeaderEpochRequest(
                            stream=partition.stream,
                            partition=partition.number,
                            leader_epoch=leader_epoch,
                            epoch=asked,
                        ),
                        timeout=5,
                    )
                    answer = EpochEnd(reply.epoch, reply.end_offset)
                    before = partition.log.next_offset
                    next_offset = follower.follow(leader_epoch, _known(answer))
                    LOG.info(
                        "%s/%d: following %s at leader epoch %d from offset %d%s",
                        partition.stream,
                        partition.number,
                        leader_id,
                        leader_epoch,
                        next_offset,
                        f" (cut {before - next_offset} records it never had)"
                        if next_offset < before
                        else "",
                    )
                response = await stub.ReplicaFetch(
                    cpb.ReplicaFetchRequest(
                        stream=partition.stream,
                        partition=partition.number,
                        follower=self.broker_id,
                        leader_epoch=leader_epoch,
                        fetch_offset=next_offset,
                        max_records=FETCH_MAX_RECORDS,
                        max_wait_ms=self.settings.fetch_wait_ms,
                        high_watermark=follower.high_watermark,
                        previous_crc=follower.last_crc,
                    ),
                    timeout=5 + self.settings.fetch_wait_ms / 1000,
                )
                fetched = _answer(response)
                if fetched.diverged:
                    LOG.warning(
                        "%s/%d: record %d is not leader %s's: cutting back to find where the "
                        "logs agree",
                        partition.stream,
                        partition.number,
                        next_offset - 1,
                        leader_id,
                    )
                if self.fetch_delay_s and fetched.records:
                    await asyncio.sleep(self.fetch_delay_s)
                if fetched.records and partition.log.config.flush_policy is FlushPolicy.ALWAYS:
                    next_offset = await asyncio.to_thread(follower.apply, fetched)
                else:
                    next_offset = follower.apply(fetched)
                # The leader's retention, or the owner of the stream, removed its oldest
                # records: this replica follows, in whole segments, never past its own high
                # watermark (asked again only when the leader's start moves).
                start = min(fetched.log_start, follower.high_watermark + 1)
                if start > released and start > partition.log.oldest_offset:
                    released = start
                    await partition.release_before(start)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                LOG.debug(
                    "%s/%d: fetch from %s: %s %s",
                    partition.stream,
                    partition.number,
                    leader_id,
                    error.code(),
                    error.details(),
                )
                if error.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.NOT_FOUND,
                ):
                    LOG.warning(
                        "%s/%d: fetch from %s failed: %s",
                        partition.stream,
                        partition.number,
                        leader_id,
                        error.details(),
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            except Exception:
                LOG.exception("%s/%d: following %s", partition.stream, partition.number, leader_id)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def serve_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        """The leader's side of ``ReplicaFetch``: answer at once when there are records or a
        high watermark the follower does not know, else wait up to ``max_wait_ms`` for either."""
        leader = self.leading(request.stream, request.partition)
        max_records = request.max_records or FETCH_MAX_RECORDS
        wake = leader.partition.signal.current()
        previous_crc = request.previous_crc if request.HasField("previous_crc") else None
        answer = leader.fetch(
            request.follower,
            request.leader_epoch,
            request.fetch_offset,
            max_records,
            previous_crc=previous_crc,
        )
        # A follower must learn a completed publish at once, for reads from it (ReadISRReplica):
        # a high watermark above the one it knows is news, as records are. That includes the
        # one its own fetch just raised, and one another follower's fetch raises while it waits.
        # What it can take of it: a follower keeps no high watermark past its own log end.
        known = request.high_watermark if request.HasField("high_watermark") else None
        if known is None:
            known = answer.high_watermark  # an older follower: what this answer would tell it
        reach = request.fetch_offset - 1

        def news(answer: FetchAnswer) -> bool:
            return bool(answer.records) or min(answer.high_watermark, reach) > known

        # Held at most this leader's own wait: a follower counts caught up while held.
        wait_ms = min(request.max_wait_ms, self.settings.fetch_wait_ms)
        if news(answer) or wait_ms <= 0 or answer.diverged:
            return _response(answer)
        # While it waits here the follower has everything: it stays caught up (in the ISR)
        # however long the wait, which only sets how often an idle follower asks.
        held = leader
        held.hold(request.follower)
        try:
            deadline = time.monotonic() + wait_ms / 1000
            while (remaining := deadline - time.monotonic()) > 0:
                await asyncio.wait([wake], timeout=remaining)
                leader = self.leading(request.stream, request.partition)
                wake = leader.partition.signal.current()
                answer = leader.fetch(
                    request.follower,
                    request.leader_epoch,
                    request.fetch_offset,
                    max_records,
                    again=True,
                )
                if news(answer):
                    break
        finally:
            held.release(request.follower)
        return _response(answer)

    def serve_epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        leader = self.leading(request.stream, request.partition)
        if request.leader_epoch != leader.leader_epoch:
            raise StaleEpoch(request.leader_epoch, leader.leader_epoch)
        end = leader.end_offset_for(request.epoch)
        return cpb.OffsetForLeaderEpochResponse(epoch=end.epoch, end_offset=end.end_offset)


def _known(answer: EpochEnd) -> Callable[[int], EpochEnd]:
    """The leader's answer, already fetched, as the question ``FollowerReplica.follow`` asks."""

    def ask(_epoch: int) -> EpochEnd:
        return answer

    return ask


def _response(answer: FetchAnswer) -> cpb.ReplicaFetchResponse:
    records = answer.records
    return cpb.ReplicaFetchResponse(
        leader_epoch=answer.leader_epoch,
        high_watermark=answer.high_watermark,
        epochs=[cpb.EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in answer.epochs],
        stored_records=records.data,
        stored_sizes=columns.pack_int64(records.sizes) if len(records) else b"",
        log_start_offset=answer.log_start,
        diverged=answer.diverged,
    )


def _answer(response: cpb.ReplicaFetchResponse) -> FetchAnswer:
    sizes = columns.unpack_int64(response.stored_sizes)
    if int(sizes.sum()) != len(response.stored_records):
        raise ValueError("malformed replica fetch answer: record sizes and bytes differ")
    records = StoredRecords(response.stored_records, sizes)
    epochs = [EpochEntry(e.epoch, e.start_offset) for e in response.epochs]
    return FetchAnswer(
        response.leader_epoch,
        response.high_watermark,
        records,
        epochs,
        response.log_start_offset,
        diverged=response.diverged,
    )


def _anchors_first(view: ClusterView) -> list[tuple[tuple[str, int], PartitionState]]:
    """The partitions in the controller's order: those of streams colocated with another last,
    so a colocated partition follows the anchor's leader elected in the same pass."""
    first: list[tuple[tuple[str, int], PartitionState]] = []
    last: list[tuple[tuple[str, int], PartitionState]] = []
    for item in view.partitions.items():
        record = view.streams.get(item[0][0])
        (last if record is not None and record.colocate else first).append(item)
    return first + last


def stream_states(view: ClusterView, stream: str) -> dict[int, PartitionState]:
    return {n: st for (s, n), st in view.partitions.items() if s == stream}
