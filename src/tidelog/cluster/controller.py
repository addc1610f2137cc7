"""The controller's work, and the ISR changes each partition's leader makes.

Theory of operation. The broker holding the ``controller`` key runs :meth:`Controller.control`
at every step with the state it just read: it elects a new leader from the live ISR when a
partition's leader is not live (``placement.elect``; never an unclean election), finishes
reassignments whose new replicas caught up, keeps colocated partitions led with their anchor,
and widens internal streams to ``INTERNAL_REPLICAS`` as brokers join. Each partition's leader
(any broker) runs :meth:`Controller.adjust_isr`: it shrinks the ISR of followers that stopped
catching up and expands it with followers that reached its high watermark in its epoch.

Invariant. Every decision is taken from one read of the cluster's state and written back by
compare-and-set on the partition epoch (or the stream record), so a decision taken on a stale
state loses and is taken again, from a fresh read, at the next step. Nothing here touches a
local log.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from tidelog.cluster.metadata import ClusterView, Metadata, PartitionState
from tidelog.cluster.placement import (
    align,
    elect,
    expand_isr,
    finish_reassignment,
    follow_anchor,
    shrink_isr,
    widen,
)
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.settings import INTERNAL_REPLICAS, ClusterSettings

LOG = logging.getLogger("tidelog.cluster")


class ControllerHost(Protocol):
    """What the controller needs of the node: the metadata store and the settings."""

    @property
    def metadata(self) -> Metadata | None: ...

    @property
    def settings(self) -> ClusterSettings: ...


class Controller:
    """Leader elections, reassignments and ISR changes, written to the metadata."""

    def __init__(self, host: ControllerHost) -> None:
        self._host = host

    async def control(self, view: ClusterView) -> None:
        """Elect leaders where the leader is not live, finish reassignments, keep colocated
        partitions with their anchor and widen internal streams, each by compare-and-set on
        the partition epoch (a decision on a stale view loses); ``view`` is updated with what
        was written."""
        metadata = self._host.metadata
        assert metadata is not None
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
            written = await metadata.update_partition(stream, number, state.partition_epoch, new)
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
        metadata = self._host.metadata
        assert metadata is not None
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
            if wider != record and await metadata.update_stream(name, wider):
                view.streams[name] = wider
                LOG.info(
                    "controller: %s has %d replicas now (minIsr %d)",
                    name,
                    wider.replication_factor,
                    wider.min_isr,
                )

    async def adjust_isr(
        self, stream: str, number: int, state: PartitionState, role: PartitionRole
    ) -> None:
        """As the leader of ``stream``/``number``: drop from the ISR the followers that stopped
        catching up for ``replica_lag_max_s``, or add one that caught up, by compare-and-set
        (as Kafka's leaders once wrote ISR changes to ZooKeeper themselves)."""
        metadata = self._host.metadata
        assert metadata is not None
        leader = role.leader
        if leader is None:
            return
        new: PartitionState | None = None
        lagging = leader.lagging(self._host.settings.replica_lag_max_s)
        if lagging:
            new = shrink_isr(state, lagging)
        else:
            # In sync again (Kafka's rule): it holds everything the ISR holds (the high
            # watermark) and has fetched into the current leader epoch.
            ends = leader.follower_ends()
            floor = max(leader.high_watermark + 1, leader.epoch_start)
            lag = self._host.settings.replica_lag_max_s
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
        written = await metadata.update_partition(stream, number, state.partition_epoch, new)
        if written is not None:
            LOG.info("%s/%d ISR %s -> %s", stream, number, ",".join(state.isr), ",".join(new.isr))
            role.state = written
            leader.set_isr(written.isr)


def _anchors_first(view: ClusterView) -> list[tuple[tuple[str, int], PartitionState]]:
    """The partitions in the controller's order: those of streams colocated with another last,
    so a colocated partition follows the anchor's leader elected in the same pass."""
    first: list[tuple[tuple[str, int], PartitionState]] = []
    last: list[tuple[tuple[str, int], PartitionState]] = []
    for item in view.partitions.items():
        record = view.streams.get(item[0][0])
        (last if record is not None and record.colocate else first).append(item)
    return first + last
