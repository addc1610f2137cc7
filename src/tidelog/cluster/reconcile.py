"""This broker made to match the cluster's state: each partition's role, the read-only flags
and the views of its local copies.

Theory of operation. At every step the node hands the state it just read to
:meth:`Reconciler.reconcile`: a partition this broker replicates gets a :class:`PartitionRole`
(its stream created here first if missing) and leads, follows, or neither, as the state says;
a partition it no longer replicates gets an :class:`Outsider`, and a stream the cluster deleted
is deleted here. A stream on this broker's disk that the cluster does not have (deleted while it
was away) is refused as not found and kept until the cluster creates that name again, when its
files go first (:meth:`Reconciler._replace_stale`). The read-only flags and the views follow
the metadata the same way, stream by stream.

Invariants. Roles change only here (and when the node closes or loses its lease). A replica is
marked ready in etcd at the leader epoch it took its role for, once per epoch. The high
watermarks are checkpointed at most every ``CHECKPOINT_INTERVAL_S``. The views of a stream are
never reconciled from a view older than the one last applied to it, and one views reconcile
runs at a time (the step's, or a query's: ``sync_views``). Internal streams (``__*``) carry no
views or flags and are never deleted as stale: their owners manage them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Protocol

from tidelog.broker import Broker, StreamConfig, StreamViews, ViewSpec
from tidelog.cluster.controller import Controller
from tidelog.cluster.metadata import ClusterView, Membership, Metadata, StreamRecord
from tidelog.cluster.roles import Outsider, PartitionRole, RoleHost, Undecided
from tidelog.cluster.routing import Routing
from tidelog.cluster.settings import CHECKPOINT_INTERVAL_S
from tidelog.errors import StreamNotFound
from tidelog.wire import CURSORS_STREAM

LOG = logging.getLogger("tidelog.cluster")


class ReconcileHost(RoleHost, Protocol):
    """What reconciling needs of the node, besides what the roles it makes need."""

    @property
    def broker(self) -> Broker: ...

    @property
    def metadata(self) -> Metadata | None: ...

    @property
    def membership(self) -> Membership | None: ...

    @property
    def roles(self) -> dict[tuple[str, int], PartitionRole]:
        """This broker's replicas, by (stream, partition): filled and emptied here."""
        ...

    async def isolated(self, what: str, work: Awaitable[None]) -> None:
        """Run ``work``; a failure is logged (once until it succeeds) rather than raised."""
        ...


class Reconciler:
    """Makes this broker's partitions, flags and views match the cluster's state."""

    def __init__(self, host: ReconcileHost, controller: Controller, routing: Routing) -> None:
        """``controller``: the ISR changes this broker makes where it leads; ``routing``: what
        an :class:`Outsider` names as the leader."""
        self._host = host
        self._controller = controller
        self._routing = routing
        self._views_revision: dict[str, int] = {}
        """Stream -> the etcd revision of the newest view its views were reconciled with."""
        self._views_lock = asyncio.Lock()
        """One views reconcile at a time: the step's and a query's (``sync_views``)."""
        self._checkpointed = 0.0
        self._stale: set[str] = set()
        """Streams on this broker's disk that the cluster did not have when the node looked
        (deleted while it was away): refused, and replaced if the cluster creates the name."""

    def forget_revisions(self) -> None:
        """etcd went back (restored, or replaced): the revisions remembered mean nothing now."""
        self._views_revision.clear()

    async def reconcile(self, view: ClusterView) -> None:
        """Give every partition of this broker its role in ``view``: lead, follow, or neither;
        mark the replicas opened, checkpoint the high watermarks, and let go of the partitions
        and streams the cluster no longer puts here."""
        host = self._host
        metadata, membership = host.metadata, host.membership
        assert metadata is not None and membership is not None
        seen: set[tuple[str, int]] = set()
        for (stream, number), state in sorted(view.partitions.items()):
            if host.broker_id not in state.replicas:
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
            marked = view.ready.get((stream, number), {}).get(host.broker_id)
            if state.leader == host.broker_id:
                if role.lead(state, record.min_isr) and stream == CURSORS_STREAM:
                    # Before any await: no set can reach the new leader before its index.
                    read = host.broker.cursors.rebuild(number)
                    LOG.info("%s/%d: cursor index rebuilt from %d records", stream, number, read)
                if marked != state.leader_epoch:
                    await metadata.mark_ready(
                        stream, number, host.broker_id, state.leader_epoch, membership.lease
                    )
                await self._controller.adjust_isr(stream, number, state, role)
            elif state.leader and state.leader in view.brokers:
                role.follow(state.leader, state.leader_epoch)
                if marked != state.leader_epoch:
                    await metadata.mark_ready(
                        stream, number, host.broker_id, state.leader_epoch, membership.lease
                    )
            else:
                role.step_down()
                role.stop_following()
        if time.monotonic() - self._checkpointed >= CHECKPOINT_INTERVAL_S:
            self._checkpointed = time.monotonic()
            for key in seen:
                await host.roles[key].checkpoint()
        for key in [k for k in host.roles if k not in seen]:
            role = host.roles.pop(key)
            await role.close()
            role.partition.role = Outsider(self._routing, *key)
            if key[0] not in view.streams and host.broker.find_stream(key[0]) is not None:
                LOG.info("stream %s was deleted from the cluster: deleting it here", key[0])
                with contextlib.suppress(StreamNotFound):
                    await host.broker.delete_stream(key[0])
        for name in view.streams:
            local = host.broker.find_stream(name)
            if local is None:
                continue
            for partition in local.partitions:
                if (name, partition.number) not in seen and (
                    partition.role is None or isinstance(partition.role, Undecided)
                ):
                    partition.role = Outsider(self._routing, name, partition.number)
        for local in host.broker.list_streams():
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
            await self._host.broker.delete_stream(name)

    def _role(self, stream: str, number: int, record: StreamRecord) -> PartitionRole | None:
        role = self._host.roles.get((stream, number))
        if role is not None and not (role.partition.deleted or role.partition.closed):
            return role
        found = self._host.broker.find_stream(stream)
        if found is None:
            config = StreamConfig.from_json(record.config)
            if stream.startswith("__"):  # the cluster's internal streams (sites' queues)
                found = self._host.broker.internal_stream(stream, config)
            else:
                found = self._host.broker.create_stream(stream, config)
        if number >= len(found.partitions):
            LOG.error("%s has %d partitions here, the cluster says more", stream, number)
            return None
        partition = found.partitions[number]
        if partition.paused:
            # Paused before it was replicated here (or by an older build): a replica must be
            # open to follow or lead, and replicated partitions are never paused.
            self._host.broker.resume(partition)
        role = PartitionRole(self._host, partition)
        partition.role = role
        if partition.current_log is not None:
            role.opened(partition.current_log)
        self._host.roles[stream, number] = role
        return role

    async def reconcile_flags(self, view: ClusterView, only: str | None = None) -> None:
        """Make the local copies of the cluster's streams read-only as the metadata says."""
        for name in view.streams if only is None else [only]:
            local = self._host.broker.find_stream(name)
            if local is None or name.startswith("__"):
                continue
            for partition in local.partitions:
                wanted = (name, partition.number) in view.readonly
                if partition.readonly != wanted:
                    self._host.broker.set_readonly(name, [partition.number], wanted)

    async def reconcile_views(self, view: ClusterView, only: str | None = None) -> None:
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
            local = self._host.broker.find_stream(name)
            if local is None or name.startswith("__"):
                continue
            # Each stream alone: one that cannot be matched does not hold back the others.
            await self._host.isolated(
                f"views of {name}", self._match_views(name, local.views, view)
            )

    async def _match_views(self, name: str, have: StreamViews, view: ClusterView) -> None:
        wanted = {n: ViewSpec.from_json(d) for n, d in view.views.get(name, {}).items()}
        for view_name in [n for n in have.specs if n not in wanted]:
            await self._host.broker.drop_view(name, view_name)
        for view_name, spec in wanted.items():
            if have.specs.get(view_name) != spec:
                if view_name in have.specs:  # redefined: dropped and declared again
                    await self._host.broker.drop_view(name, view_name)
                await self._host.broker.declare_view(name, spec)
