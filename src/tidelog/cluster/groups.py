"""Consumer groups of a cluster: membership in etcd, one coordinator broker per group.

Theory of operation. A group is one etcd key, ``groups/<id>`` (:class:`GroupRecord`: its
coordinator, epoch, members with their streams, and assignments). Any broker may change it,
always by compare-and-set on the key's revision, and every change raises the epoch:

==========================  ================  ==================================================
change                      made by           what it does
==========================  ================  ==================================================
join                        any broker        creates the group on its first join (coordinator:
                                              the live broker coordinating fewest groups), adds
                                              or updates the member, reassigns the partitions
leave                       any broker        removes the member (the group with its last one)
expiry                      the coordinator   removes members whose heartbeats stopped for
                                              ``consumer_timeout_s``
new coordinator             the controller,   when the coordinator's lease is gone (it died or
                            or a report       was cut off), or when a majority of members
                                              reported it within ``coordinator_timeout_s``
==========================  ================  ==================================================

Members heartbeat by fetching their assignments from the coordinator; a broker that is not the
coordinator refuses that (FAILED_PRECONDITION naming the coordinator) so a client refreshes the
group's metadata. Heartbeats are not written to etcd: the coordinator keeps them in memory, and
a broker that becomes a group's coordinator counts every member as seen at that moment, so no
member is expired for the failover's gap. Assignments are the single broker's
(``tidelog.broker.assign_partitions``) over the stream partition counts in the cluster metadata.
A member belongs to the principal that joined as it (the record's ``owners``; the checks are the
single broker's, ``tidelog.broker.groups``, "Owners"); a broker passing a member's call on (a
heartbeat at the coordinator, a report to the controller) acts for its owner.

Every broker mirrors every group into its :class:`~tidelog.broker.groups.GroupCoordinator`
(``mirror`` mode: it saves and expires nothing): the coordinator's heartbeats live there, and a
partition's leader fences group subscribers there exactly as a single broker does (one
subscriber per group and partition; an older epoch is refused). The mirror follows the metadata
each time the cluster's view is read (every ``poll_s``); a call that finds the mirror behind
(a member, epoch or coordinator it does not know yet) reads that group from etcd first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc
from tidelog.broker import (
    Broker,
    Group,
    GroupCoordinator,
    GroupMember,
    assign_partitions,
    check_group_join,
    check_owner,
)
from tidelog.cluster.metadata import ClusterView, GroupRecord, Metadata
from tidelog.errors import (
    FailedPrecondition,
    GroupNotFound,
    NotEnoughReplicas,
    StreamNotFound,
)
from tidelog.wire import FORWARDED

LOG = logging.getLogger("tidelog.cluster")


CAS_ATTEMPTS = 20
"""Compare-and-set attempts of one change before giving up (UNAVAILABLE, retryable)."""

Change = Callable[[GroupRecord | None], GroupRecord | None]
"""The group as read -> the group to write (None: delete it; the same object: no change)."""


# -- the pure transitions ----------------------------------------------------------------------


def pick_coordinator(view: ClusterView, *, avoid: str = "") -> str:
    """The live broker coordinating the fewest groups (ties by id), other than ``avoid`` when
    there is another."""
    load = dict.fromkeys(view.brokers, 0)
    for record in view.groups.values():
        if record.coordinator in load:
            load[record.coordinator] += 1
    candidates = [b for b in load if b != avoid] or list(load)
    if not candidates:
        raise NotEnoughReplicas("no live broker to coordinate the consumer group: try again")
    return min(candidates, key=lambda b: (load[b], b))


def partition_counter(view: ClusterView) -> Callable[[str], int]:
    def count(stream: str) -> int:
        record = view.streams.get(stream)
        if record is None:
            raise StreamNotFound(stream)
        return int(record.config.get("partitions", 1))

    return count


def joined(
    record: GroupRecord | None,
    consumer_id: str,
    streams: tuple[str, ...],
    view: ClusterView,
    principal: str | None = None,
) -> GroupRecord:
    """The group with ``consumer_id`` a member consuming ``streams`` (``StreamNotFound`` for a
    stream the cluster does not have), owned by ``principal`` unless it has an owner already
    (the caller checked that ``principal`` may act as it)."""
    for stream in streams:
        if stream not in view.streams:
            raise StreamNotFound(stream)
    owners = {} if record is None else dict(record.owners)
    if not owners.get(consumer_id) and principal:
        owners[consumer_id] = principal
    if record is not None and record.members.get(consumer_id) == streams:
        if owners == record.owners:
            return record  # a member joining again with the same streams: nothing changes
        return GroupRecord(
            record.coordinator, record.epoch, record.members, record.assignments, owners
        )
    members = {} if record is None else dict(record.members)
    members[consumer_id] = streams
    return GroupRecord(
        coordinator=pick_coordinator(view) if record is None else record.coordinator,
        epoch=1 if record is None else record.epoch + 1,
        members=members,
        assignments=_assigned(members, view),
        owners=owners,
    )


def without(record: GroupRecord, gone: set[str], view: ClusterView) -> GroupRecord | None:
    """The group without the members ``gone`` (None: no member is left; the same record when
    none of them is a member)."""
    if not gone & set(record.members):
        return record
    members = {c: s for c, s in record.members.items() if c not in gone}
    if not members:
        return None
    owners = {c: o for c, o in record.owners.items() if c in members}
    return GroupRecord(
        record.coordinator, record.epoch + 1, members, _assigned(members, view), owners
    )


def recoordinated(record: GroupRecord, coordinator: str) -> GroupRecord:
    return GroupRecord(
        coordinator, record.epoch + 1, record.members, record.assignments, record.owners
    )


def _assigned(
    members: dict[str, tuple[str, ...]], view: ClusterView
) -> dict[str, dict[str, tuple[int, ...]]]:
    found = assign_partitions(members, partition_counter(view))
    return {c: {s: tuple(p) for s, p in streams.items()} for c, streams in found.items()}


# -- the broker's side ---------------------------------------------------------------------------


class GroupsHost(Protocol):
    """What the groups need of the node: its broker (whose coordinator becomes the mirror),
    identity and membership, the cluster's state and metadata store, and channels to the other
    brokers."""

    @property
    def broker(self) -> Broker: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def member(self) -> bool: ...

    @property
    def view(self) -> ClusterView:
        """The cluster's state as last read (its groups are updated in place by a change)."""
        ...

    @property
    def metadata(self) -> Metadata | None: ...

    async def fresh_view(self) -> ClusterView: ...

    def channel(self, address: str) -> grpc.aio.Channel: ...


class ClusterGroups:
    """The consumer-group calls of one broker of a cluster (``tidelog.api`` calls these instead
    of the broker's own coordinator when it runs in a cluster)."""

    def __init__(self, node: GroupsHost, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.mirror: GroupCoordinator = node.broker.groups
        self.mirror.mirror()
        self._clock = clock
        self._coordinating: set[str] = set()
        self._records: dict[str, GroupRecord] = {}
        """The records the mirror holds, kept by the same rule (never an older read)."""
        self._as_of: dict[str, int] = {}
        """Group id -> the etcd revision the mirror's copy is known true at: an older read
        (a view read while this broker wrote a newer record) is never installed over it."""
        self._reports: dict[tuple[str, int], dict[str, float]] = {}
        """(group, epoch) -> consumer -> when it reported the coordinator."""
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def consumer_timeout_s(self) -> float:
        return self.mirror.consumer_timeout_s

    @property
    def coordinator_timeout_s(self) -> float:
        return self.mirror.coordinator_timeout_s

    # -- the calls -----------------------------------------------------------------------------

    async def join(
        self, group_id: str, consumer_id: str, streams: list[str], *, principal: str | None = None
    ) -> GroupRecord:
        check_group_join(group_id, consumer_id, streams)
        wanted = tuple(streams)
        view = await self._view_with(wanted)

        def change(record: GroupRecord | None) -> GroupRecord | None:
            if record is not None:
                check_owner(record.owners.get(consumer_id, ""), principal, group_id, consumer_id)
            return joined(record, consumer_id, wanted, view, principal)

        record = await self._change(group_id, change)
        assert record is not None
        self._heartbeat_at_coordinator(group_id, consumer_id, record)
        return record

    async def leave(self, group_id: str, consumer_id: str, *, principal: str | None = None) -> None:
        view = await self._view_for(group_id)

        def change(record: GroupRecord | None) -> GroupRecord | None:
            record = _known(record, group_id, consumer_id, principal)
            return without(record, {consumer_id}, view)

        await self._change(group_id, change)

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> tuple[int, dict[str, list[int]]]:
        """The member's partitions at the group's epoch; only the coordinator answers (this is
        the member's heartbeat)."""
        if not self.node.member:
            raise NotEnoughReplicas(
                f"broker {self.node.broker_id} is cut off from the cluster's metadata and "
                f"cannot coordinate group {group_id!r} now: fetch the group's metadata from "
                f"another broker"
            )
        record = self._records.get(group_id)
        if not _current(record, consumer_id, epoch, self.node.broker_id):
            record = await self.refresh(group_id)
        record = _known(record, group_id, consumer_id, principal)
        if record.coordinator != self.node.broker_id:
            raise FailedPrecondition(
                f"broker {self.node.broker_id} is not the coordinator of group {group_id!r}: "
                f"{record.coordinator} is (epoch {record.epoch}); fetch the group's metadata"
            )
        if epoch != record.epoch:
            raise FailedPrecondition(
                f"group {group_id!r} is at epoch {record.epoch}, not {epoch}; fetch its metadata "
                f"and try again"
            )
        self._heartbeat(group_id, consumer_id)
        assigned = record.assignments.get(consumer_id, {})
        return record.epoch, {s: list(p) for s, p in assigned.items()}

    async def report_coordinator(
        self,
        group_id: str,
        consumer_id: str,
        coordinator: str,
        epoch: int,
        *,
        forwarded: bool,
        principal: str | None = None,
    ) -> None:
        """A member cannot reach the coordinator. A coordinator that is not a live broker is
        replaced at once; a live one once a majority of the members reported it within
        ``coordinator_timeout_s`` (Liftbridge's rule). Reports are counted by the controller
        (another broker hands them to it, as Liftbridge's go to its metadata leader), so
        members reporting through different brokers still add up. A report of an older
        coordinator or epoch changes nothing: the group has moved on."""
        record = _known(await self.refresh(group_id), group_id, consumer_id, principal)
        if epoch != record.epoch:
            raise FailedPrecondition(f"group {group_id!r} is at epoch {record.epoch}, not {epoch}")
        if coordinator and coordinator != record.coordinator:
            return
        view = await self.node.fresh_view()
        controller = view.controller
        if not forwarded and controller and controller != self.node.broker_id:
            address = view.brokers.get(controller)
            if address is not None and await self._hand_to_controller(
                address, group_id, consumer_id, record.coordinator, epoch
            ):
                return
        now = self._clock()
        for key, earlier in list(self._reports.items()):  # forget reports too old to count
            for member in [c for c, at in earlier.items() if now - at > self.coordinator_timeout_s]:
                del earlier[member]
            if not earlier:
                del self._reports[key]
        reports = self._reports.setdefault((group_id, epoch), {})
        reports[consumer_id] = now
        recent = sorted(reports)
        if record.coordinator in view.brokers and 2 * len(recent) <= len(record.members):
            return
        new = pick_coordinator(view, avoid=record.coordinator)

        def change(current: GroupRecord | None) -> GroupRecord | None:
            current = _known(current, group_id, consumer_id)
            if current.epoch != epoch:
                return current  # changed meanwhile (by another report, the controller)
            return recoordinated(current, new)

        written = await self._change(group_id, change)
        if written is not None and written.epoch != epoch:
            LOG.info(
                "group %s: coordinator %s -> %s (epoch %d), reported by %s",
                group_id,
                record.coordinator,
                written.coordinator,
                written.epoch,
                ", ".join(recent),
            )
        self._reports.pop((group_id, epoch), None)

    def check_subscriber(self, group_id: str, consumer_id: str, epoch: int) -> bool:
        """Whether the mirror is recent enough to admit this subscriber (else: refresh)."""
        group = self.mirror.groups.get(group_id)
        return group is not None and consumer_id in group.members and group.epoch >= epoch

    async def refresh(self, group_id: str) -> GroupRecord | None:
        """Read the group from etcd and install it in the mirror."""
        assert self.node.metadata is not None
        record, _, read_at = await self.node.metadata.group(group_id)
        self._install(group_id, record, read_at)
        return record

    # -- what the node runs --------------------------------------------------------------------

    def follow(self, view: ClusterView) -> None:
        """Install every group of a freshly read view in the mirror."""
        for group_id in [g for g in self.mirror.groups if g not in view.groups]:
            self._install(group_id, None, view.revision)
        for group_id, record in view.groups.items():
            self._install(group_id, record, view.revision)
        for group_id in [g for g in self._as_of if g not in view.groups]:
            if self._as_of[group_id] <= view.revision:  # gone, as of this read: forget it
                del self._as_of[group_id]

    async def expire(self) -> None:
        """Remove the silent members of the groups this broker coordinates."""
        for group_id in sorted(self._coordinating):
            if not self._silent(group_id, self.mirror.groups.get(group_id)):
                continue
            view = await self._view_for(group_id)

            def change(
                record: GroupRecord | None, group_id: str = group_id, view: ClusterView = view
            ) -> GroupRecord | None:
                # Decided again on the record just read and the heartbeats now: a member that
                # joined again or called meanwhile stays.
                if record is None or record.coordinator != self.node.broker_id:
                    return record
                return without(record, self._silent(group_id, record), view)

            before = self.node.view.groups.get(group_id)
            written = await self._change(group_id, change)
            gone = set(before.members if before else ()) - set(written.members if written else ())
            if gone:
                LOG.info(
                    "group %s: expired %s (silent for %g s)%s",
                    group_id,
                    ", ".join(sorted(gone)),
                    self.consumer_timeout_s,
                    "" if written is None else f", epoch {written.epoch}",
                )

    async def control(self, view: ClusterView) -> None:
        """The controller's part: a group whose coordinator is not a live broker gets one."""
        for group_id, record in sorted(view.groups.items()):
            if record.coordinator in view.brokers or not view.brokers:
                continue
            new = pick_coordinator(view)

            def change(
                current: GroupRecord | None, was: GroupRecord = record, to: str = new
            ) -> GroupRecord | None:
                if current is None or current.epoch != was.epoch:
                    return current
                return recoordinated(current, to)

            written = await self._change(group_id, change)
            if written is not None and written.epoch != record.epoch:
                LOG.info(
                    "controller: group %s coordinator %s -> %s (epoch %d)",
                    group_id,
                    record.coordinator,
                    written.coordinator,
                    written.epoch,
                )
                view.groups[group_id] = written

    def forget_revisions(self) -> None:
        """etcd's revisions went back: what was installed is no longer newer than anything."""
        self._as_of.clear()

    # -- internals -----------------------------------------------------------------------------

    def _silent(self, group_id: str, record: GroupRecord | Group | None) -> set[str]:
        """Members of ``record`` whose heartbeats this coordinator has not seen for the
        consumer timeout (a member the mirror does not hold yet is not silent)."""
        group = self.mirror.groups.get(group_id)
        if record is None or group is None:
            return set()
        now = self._clock()
        return {
            c
            for c in record.members
            if (m := group.members.get(c)) is not None
            and now - m.last_seen > self.consumer_timeout_s
        }

    async def _view_with(self, streams: tuple[str, ...]) -> ClusterView:
        """The node's view, read again when it lacks one of ``streams`` (just created)."""
        view = self.node.view
        if any(s not in view.streams for s in streams):
            view = await self.node.fresh_view()
        return view

    async def _view_for(self, group_id: str) -> ClusterView:
        """A view that has every stream the group's members consume, for reassigning."""
        record = self.node.view.groups.get(group_id)
        streams = {s for ss in (record.members.values() if record else ()) for s in ss}
        return await self._view_with(tuple(sorted(streams)))

    async def _change(self, group_id: str, change: Change) -> GroupRecord | None:
        """Apply ``change`` to the group by compare-and-set, reading it again after a race."""
        metadata = self.node.metadata
        assert metadata is not None
        for _ in range(CAS_ATTEMPTS):
            record, revision, read_at = await metadata.group(group_id)
            new = change(record)
            if new is record:
                self._install(group_id, record, read_at)
                return record
            written_at = await metadata.replace_group(group_id, revision, new)
            if written_at:
                self._install(group_id, new, written_at)
                if new is None:
                    self.node.view.groups.pop(group_id, None)
                else:
                    self.node.view.groups[group_id] = new
                return new
        raise NotEnoughReplicas(f"consumer group {group_id!r} kept changing: try again")

    def _install(self, group_id: str, record: GroupRecord | None, as_of: int) -> None:
        if as_of < self._as_of.get(group_id, 0):
            return  # read before what is installed
        self._as_of[group_id] = as_of
        groups = self.mirror.groups
        if record is None:
            groups.pop(group_id, None)
            self._records.pop(group_id, None)
            self._coordinating.discard(group_id)
            return
        self._records[group_id] = record
        now = self._clock()
        group = groups.get(group_id)
        if group is None:
            group = groups[group_id] = Group(group_id)
        was_coordinating = group_id in self._coordinating
        members: dict[str, GroupMember] = {}
        for consumer_id, streams in record.members.items():
            old = group.members.get(consumer_id)
            kept = old is not None and was_coordinating and old.streams == list(streams)
            members[consumer_id] = GroupMember(
                consumer_id,
                list(streams),
                old.last_seen if kept and old else now,
                record.owners.get(consumer_id, ""),
            )
        group.epoch = record.epoch
        group.members = members
        group.assignments = {
            c: {s: list(p) for s, p in streams.items()} for c, streams in record.assignments.items()
        }
        if record.coordinator == self.node.broker_id:
            self._coordinating.add(group_id)
        else:
            self._coordinating.discard(group_id)

    def _heartbeat(self, group_id: str, consumer_id: str) -> None:
        group = self.mirror.groups.get(group_id)
        member = None if group is None else group.members.get(consumer_id)
        if member is not None:
            member.last_seen = self._clock()

    def _heartbeat_at_coordinator(
        self, group_id: str, consumer_id: str, record: GroupRecord
    ) -> None:
        """A join counts as the member's heartbeat: here when this broker coordinates, else
        passed to the coordinator in the background (a member that stalled and joined again
        through another broker must not be expired by the coordinator's old clock)."""
        if record.coordinator == self.node.broker_id:
            self._heartbeat(group_id, consumer_id)
            return
        address = self.node.view.brokers.get(record.coordinator)
        if address is None:
            return
        stub = api_pb2_grpc.APIStub(self.node.channel(address))
        request = pb.FetchConsumerGroupAssignmentsRequest(
            groupId=group_id, consumerId=consumer_id, epoch=record.epoch
        )

        async def send() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.FetchConsumerGroupAssignments(request, timeout=2)

        task = asyncio.create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hand_to_controller(
        self, address: str, group_id: str, consumer_id: str, coordinator: str, epoch: int
    ) -> bool:
        """Pass a report on to the controller; False when it cannot be reached (the report is
        then counted here)."""
        stub = api_pb2_grpc.APIStub(self.node.channel(address))
        request = pb.ReportConsumerGroupCoordinatorRequest(
            groupId=group_id, consumerId=consumer_id, coordinator=coordinator, epoch=epoch
        )
        try:
            await stub.ReportConsumerGroupCoordinator(
                request, timeout=5, metadata=((FORWARDED, "1"),)
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            raise FailedPrecondition(error.details() or str(error.code())) from None
        return True


def _known(
    record: GroupRecord | None, group_id: str, consumer_id: str, principal: str | None = None
) -> GroupRecord:
    """``record``, which must hold ``consumer_id`` as a member ``principal`` may act as."""
    if record is None:
        raise GroupNotFound(f"no such consumer group: {group_id!r}")
    if consumer_id not in record.members:
        raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
    check_owner(record.owners.get(consumer_id, ""), principal, group_id, consumer_id)
    return record


def _current(record: GroupRecord | None, consumer_id: str, epoch: int, broker_id: str) -> bool:
    return (
        record is not None
        and consumer_id in record.members
        and record.epoch == epoch
        and record.coordinator == broker_id
    )


__all__ = ["ClusterGroups", "joined", "pick_coordinator", "recoordinated", "without"]
