"""Consumer groups on one broker (Liftbridge's JoinConsumerGroup & co.).

A group is created by its first join and deleted when its last member leaves or expires. Every
membership change (join, leave, expiry) raises the group's epoch and reshuffles the
assignments: for each stream, partition 0..n-1 goes in turn to the member holding the fewest
partitions so far (members in consumer-id order). Members poll ``fetch_assignments`` with the
epoch they know: that call is also their heartbeat; a member silent for ``consumer_timeout_s``
is removed. Subscriptions made on behalf of a group carry its epoch: a partition keeps one
subscriber per group, a subscriber with a newer-or-equal epoch replaces (fences) the old one,
and one with an older epoch is refused. This broker is always the coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.errors import FailedPrecondition, GroupNotFound, InvalidArgument


@dataclass(slots=True)
class Member:
    consumer_id: str
    streams: list[str]
    last_seen: float


@dataclass(slots=True)
class Group:
    group_id: str
    epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    assignments: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    subscribers: dict[tuple[str, int], tuple[int, Callable[[], None]]] = field(default_factory=dict)
    """(stream, partition) -> (epoch of the subscriber, how to fence it)"""


class GroupCoordinator:
    def __init__(
        self,
        partition_counts: Callable[[str], int],
        *,
        consumer_timeout_s: float = 15.0,
        coordinator_timeout_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._partition_counts = partition_counts
        self.consumer_timeout_s = consumer_timeout_s
        self.coordinator_timeout_s = coordinator_timeout_s
        self._clock = clock
        self.groups: dict[str, Group] = {}

    def epoch(self, group_id: str) -> int | None:
        """The group's current epoch, or None when no such group exists."""
        group = self.groups.get(group_id)
        return None if group is None else group.epoch

    # -- membership ------------------------------------------------------------------------------

    def join(self, group_id: str, consumer_id: str, streams: list[str]) -> int:
        """Add (or refresh) a member; returns the group's epoch after the change."""
        if not group_id or not consumer_id:
            raise InvalidArgument("joining a consumer group needs a group id and a consumer id")
        if not streams:
            raise InvalidArgument("joining a consumer group needs at least one stream")
        for stream in streams:
            self._partition_counts(stream)  # raises StreamNotFound
        self.expire()
        group = self.groups.setdefault(group_id, Group(group_id))
        known = group.members.get(consumer_id)
        group.members[consumer_id] = Member(consumer_id, list(streams), self._clock())
        if known is None or known.streams != list(streams):
            self._rebalance(group)
        return group.epoch

    def leave(self, group_id: str, consumer_id: str) -> None:
        group = self._group(group_id)
        if consumer_id not in group.members:
            raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
        del group.members[consumer_id]
        self._after_removal(group)

    def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int
    ) -> tuple[int, dict[str, list[int]]]:
        """The member's partitions per stream, at the group's epoch (also its heartbeat)."""
        self.expire()
        group = self._group(group_id)
        member = group.members.get(consumer_id)
        if member is None:
            raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
        if epoch != group.epoch:
            raise FailedPrecondition(
                f"group {group_id!r} is at epoch {group.epoch}, not {epoch}; fetch its metadata "
                f"and try again"
            )
        member.last_seen = self._clock()
        return group.epoch, group.assignments.get(consumer_id, {})

    def report_coordinator(self, group_id: str, consumer_id: str, epoch: int) -> None:
        """A member suspects the coordinator. On one broker there is no other to elect: the
        report is checked (member, epoch) and changes nothing."""
        group = self._group(group_id)
        if consumer_id not in group.members:
            raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
        if epoch != group.epoch:
            raise FailedPrecondition(f"group {group_id!r} is at epoch {group.epoch}, not {epoch}")

    def expire(self) -> None:
        """Remove members silent for longer than the consumer timeout."""
        now = self._clock()
        for group in list(self.groups.values()):
            silent = [
                m for m in group.members.values() if now - m.last_seen > self.consumer_timeout_s
            ]
            for member in silent:
                del group.members[member.consumer_id]
            if silent:
                self._after_removal(group)

    # -- fencing subscribers ---------------------------------------------------------------------

    def admit(
        self,
        group_id: str,
        consumer_id: str,
        epoch: int,
        stream: str,
        partition: int,
        fence: Callable[[], None],
    ) -> Callable[[], None]:
        """Admit a group subscriber to a partition; returns how to deregister it.

        An older epoch than the partition's current group subscriber is refused; a newer or
        equal one fences (ends) that subscriber.
        """
        group = self._group(group_id)
        if consumer_id not in group.members:
            raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
        if epoch < group.epoch:
            raise FailedPrecondition(
                f"stale group epoch {epoch}: group {group_id!r} is at epoch {group.epoch}"
            )
        current = group.subscribers.get((stream, partition))
        if current is not None:
            if epoch < current[0]:
                raise FailedPrecondition(
                    f"a subscriber with a newer epoch ({current[0]}) holds {stream}/{partition}"
                )
            current[1]()
        group.subscribers[(stream, partition)] = (epoch, fence)

        def release() -> None:
            if group.subscribers.get((stream, partition), (None, None))[1] is fence:
                del group.subscribers[(stream, partition)]

        return release

    # -- internals -------------------------------------------------------------------------------

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            raise GroupNotFound(f"no such consumer group: {group_id!r}")
        return group

    def _after_removal(self, group: Group) -> None:
        if group.members:
            self._rebalance(group)
        else:
            del self.groups[group.group_id]

    def _rebalance(self, group: Group) -> None:
        group.epoch += 1
        members = sorted(group.members)
        assignments: dict[str, dict[str, list[int]]] = {m: {} for m in members}
        load = dict.fromkeys(members, 0)
        streams = sorted({s for m in group.members.values() for s in m.streams})
        for stream in streams:
            try:
                count = self._partition_counts(stream)
            except Exception:  # a stream deleted since the join: nothing to assign
                continue
            takers = [m for m in members if stream in group.members[m].streams]
            for partition in range(count):
                chosen = min(takers, key=lambda m: (load[m], m))
                assignments[chosen].setdefault(stream, []).append(partition)
                load[chosen] += 1
        group.assignments = assignments
