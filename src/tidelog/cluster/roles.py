"""The replica role of each partition on a broker of a cluster: leader, follower, or neither.

The broker asks a partition's :class:`~tidelog.broker.ReplicaRole` before it takes a publish or
serves a read; the node gives every partition one (``reconcile.py``) and changes it as the
cluster's state does.

Invariants. A :class:`PartitionRole` is the leader (``leader`` set), a follower (``follower`` set
and one fetch task running, for exactly the ``following`` leader and leader epoch), or neither:
never leader and fetching at once (``lead`` stops the fetch task, ``follow`` steps down first).
Publishes are taken only by the leader of a broker that is a member of the cluster; the high
watermark a role reports never goes back when it changes (what a leader or follower knew is kept
in ``known_hw``). :class:`Outsider` (no replica here) and :class:`Undecided` (before the node's
first reading) serve nothing: they refuse with the leader's address, or not found.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from tidelog.broker import HW_CHECKPOINT, Partition, running_on, saved_high_watermark
from tidelog.cluster.metadata import ClusterView, PartitionState
from tidelog.cluster.replication import FollowerReplica, LeaderReplica, save_epochs
from tidelog.cluster.settings import ClusterSettings
from tidelog.durable import replace_json
from tidelog.errors import NotEnoughReplicas, NotLeader, StreamNotFound

LOG = logging.getLogger("tidelog.cluster")


class RoleHost(Protocol):
    """What a :class:`PartitionRole` needs of its node."""

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def member(self) -> bool:
        """Whether this broker holds its membership lease (a leader cut off takes nothing)."""
        ...

    @property
    def view(self) -> ClusterView: ...

    async def follow(self, role: PartitionRole, leader_id: str, leader_epoch: int) -> None:
        """Copy the leader's log into ``role``'s partition until cancelled."""
        ...


class OutsiderHost(Protocol):
    """What an :class:`Outsider` needs: the cluster's state, to name the leader."""

    @property
    def view(self) -> ClusterView: ...

    def _elsewhere(self, stream: str, number: int) -> str | None:
        """The leader's address of a stream of the cluster (None: not the cluster's)."""
        ...


class PartitionRole:
    """The :class:`ReplicaRole` of one partition on this broker: leader, follower or neither."""

    def __init__(self, host: RoleHost, partition: Partition) -> None:
        self.host = host
        self.partition = partition
        self.leader: LeaderReplica | None = None
        self.follower: FollowerReplica | None = None
        self.following: tuple[str, int] | None = None
        """(leader id, leader epoch) the fetch task follows."""
        self._task: asyncio.Task[None] | None = None
        self._listener: Callable[[int], None] | None = None
        self._acks: list[tuple[int, int, asyncio.Future[None]]] = []
        """Publishes waiting for the high watermark: (offset, arrival, future), a heap. A wait
        that ended without release (timed out, or its caller cancelled) leaves its entry
        cancelled; ``_cancelled_acks`` counts those, and the heap is rebuilt without them once
        they are more than half of it, so waits timing out while the ISR is below ``min_isr``
        (the high watermark stands still, and publishes are retried) cannot pile up."""
        self._cancelled_acks = 0
        self._ack_order = itertools.count()
        self.state: PartitionState | None = None
        self.saved_hw = -1
        self.known_hw = saved_high_watermark(partition.directory)
        """The high watermark last known here, restored from the checkpoint on a restart."""
        partition.add_start_listener(self._trim_epochs)

    def _trim_epochs(self, oldest: int) -> None:
        """Retention moved the log's start: the leader-epoch cache forgets what lies before."""
        replica = self.leader or self.follower
        if replica is not None and replica.epochs.truncate_from_start(oldest):
            save_epochs(self.partition, replica.epochs)

    # -- ReplicaRole -----------------------------------------------------------------------------

    def check_publish(self) -> None:
        if self.leader is None or not self.host.member:
            raise self.refusal()

    async def replicated(self, last_offset: int) -> None:
        leader = self.leader
        if leader is not None and leader.high_watermark >= last_offset:
            return
        deadline = time.monotonic() + self.host.settings.ack_timeout_s
        # Woken once, when the high watermark reaches ``last_offset`` (``_release``) or the
        # leadership ends (``step_down``), not at every change of the partition; the timeout
        # re-checks the leadership in case.
        released = asyncio.get_running_loop().create_future()
        heapq.heappush(self._acks, (last_offset, next(self._ack_order), released))
        try:
            while leader is not None and leader.high_watermark < last_offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    isr = ", ".join(sorted(leader.isr))
                    raise NotEnoughReplicas(
                        f"offset {last_offset} of {self.partition.stream}/"
                        f"{self.partition.number} was not copied by every in-sync replica "
                        f"within {self.host.settings.ack_timeout_s:g} s (ISR: {isr}; minIsr "
                        f"{leader.min_isr}): publish again once the replicas are back"
                    )
                await asyncio.wait([released], timeout=min(remaining, 0.5))
                if self.leader is not leader:
                    raise self._moved(last_offset)
        finally:
            if released.cancel():  # not released: its entry stays in the heap, cancelled
                self._forget_cancelled()
        if leader is None:
            raise self._moved(last_offset)

    def _release(self, high_watermark: int) -> None:
        """The leader's high watermark rose to ``high_watermark``: every publish waiting for
        an offset at or below it is acknowledged, in one pass (the waits are kept in offset
        order); cancelled entries found on top are dropped on the way."""
        acks = self._acks
        while acks and (acks[0][0] <= high_watermark or acks[0][2].cancelled()):
            released = heapq.heappop(acks)[2]
            if released.cancelled():
                self._cancelled_acks -= 1
            elif not released.done():
                released.set_result(None)

    def _forget_cancelled(self) -> None:
        """A wait ended without release: count its entry, and drop the cancelled entries once
        they are more than half of the heap (a rebuild costs the heap's length, less than twice
        the entries it drops: amortised O(1) a cancelled wait)."""
        self._cancelled_acks += 1
        if self._cancelled_acks * 2 > len(self._acks):
            self._acks = [entry for entry in self._acks if not entry[2].cancelled()]
            heapq.heapify(self._acks)
            self._cancelled_acks = 0

    def _release_all(self) -> None:
        """The leadership ended: every waiting publish looks again (and finds it moved)."""
        acks, self._acks = self._acks, []
        self._cancelled_acks = 0
        for _, _, released in acks:
            if not released.done():
                released.set_result(None)

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
        raise self.refusal()

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
        return self.host.view.brokers.get(state.leader, "")

    def refusal(self) -> NotLeader:
        """This broker does not lead the partition: who does, as far as it knows."""
        state = self.state
        return NotLeader(
            self.partition.stream,
            self.partition.number,
            self._leader_address(),
            leader_id="" if state is None else state.leader,
            leader_epoch=-1 if state is None else state.leader_epoch,
        )

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
        self._release_all()  # waits on a leader of another epoch find it moved at once
        known = self.high_watermark
        partition = self.partition
        # No rescan of the log: the partition's producer table follows every append, follower
        # copies and cuts included (broker/producers.py), so it is current at a leadership gain.
        self.leader = LeaderReplica(
            partition,
            self.host.broker_id,
            state.leader_epoch,
            state.isr,
            high_watermark=known,
            min_isr=min_isr,
            on_advance=self._release,
        )
        loop = asyncio.get_running_loop()
        leader = self.leader

        def committed(_: int) -> None:  # local appends move a lone leader's high watermark
            # Later, not inside the append's listeners (advancing raises the commit limit,
            # which calls them again); the loop's own appends need no wake-up of the loop
            # (a write to its self-pipe and a read of it, each append).
            if running_on(loop):
                loop.call_soon(leader.advance)
            else:
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
            self._release_all()  # ack waiters learn at once
            self.partition.signal.fire()

    def follow(self, leader_id: str, leader_epoch: int) -> None:
        if self.following == (leader_id, leader_epoch) and self._task is not None:
            return
        self.step_down()
        self.stop_following()
        if self.follower is None:
            self.follower = FollowerReplica(self.partition, self.host.broker_id)
            self.follower.high_watermark = self.known_hw
        self.following = (leader_id, leader_epoch)
        self._task = asyncio.create_task(
            self.host.follow(self, leader_id, leader_epoch),
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
        self.partition.remove_start_listener(self._trim_epochs)
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

    def __init__(self, host: OutsiderHost, stream: str, number: int) -> None:
        self.host = host
        self.stream = stream
        self.number = number

    def _refuse(self) -> NotLeader | StreamNotFound:
        state = self.host.view.partitions.get((self.stream, self.number))
        return NotLeader(
            self.stream,
            self.number,
            self.host._elsewhere(self.stream, self.number) or "",
            leader_id="" if state is None else state.leader,
            leader_epoch=-1 if state is None else state.leader_epoch,
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

    def __init__(self, host: OutsiderHost, partition: Partition) -> None:
        super().__init__(host, partition.stream, partition.number)

    def _refuse(self) -> NotLeader | StreamNotFound:
        view = self.host.view
        if view.revision > 0 and self.stream not in view.streams:
            # On this broker's disk, but the cluster has no such stream (deleted while this
            # broker was away): not found, rather than "no leader now; retry" for ever.
            return StreamNotFound(self.stream)
        return super()._refuse()

    def opened(self, log: Any) -> None:
        """Nothing to do: a clustered broker opens every log held at the high watermark saved
        here (``Partition``'s ``held``), and a commit limit can only be raised."""
