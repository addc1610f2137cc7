"""One Kafka consumer group under the classic protocol, as a state machine without I/O.

The clients run the assignors; the coordinator only gathers the members, picks a protocol they
all speak, names a leader, hands the leader everyone's metadata and hands each member what the
leader assigned it. This module decides all of that; the asyncio shell
(:mod:`tidelog.kafka.group_coordinator`) owns the clock's timers and the requests that wait.

Theory of operation. A group moves through five states (Kafka's names, shown by DescribeGroups)
by the events of :data:`TRANSITIONS`, and nothing else changes its state:

====================  ===========  ====================
state                 event        next state
====================  ===========  ====================
Empty                 REBALANCE    PreparingRebalance
PreparingRebalance    REBALANCE    PreparingRebalance
CompletingRebalance   REBALANCE    PreparingRebalance
Stable                REBALANCE    PreparingRebalance
PreparingRebalance    JOINED       CompletingRebalance
PreparingRebalance    JOINED_NONE  Empty
CompletingRebalance   ASSIGNED     Stable
any but Dead          UNLOADED     Dead
====================  ===========  ====================

- **REBALANCE**: a member joins, rejoins with other metadata (or is the leader), leaves or is
  expired. Members that were waiting for their assignment (CompletingRebalance) are answered
  ``REBALANCE_IN_PROGRESS`` and join again.
- **JOINED**: every member has sent its JoinGroup (and no member id handed out by
  ``MEMBER_ID_REQUIRED`` is still unused), or the rebalance timeout (the largest of the members')
  has passed, which removes those that did not rejoin. The generation goes up by one, every
  waiting join is answered, the leader's with every member's metadata for the chosen protocol.
  With nobody left it is **JOINED_NONE** instead, and the group is Empty at the new generation.
- **ASSIGNED**: the leader's SyncGroup; every waiting SyncGroup is answered with its share.
- **UNLOADED**: the coordinator drops the group (it closes, or evicts an Empty group to make
  room); waiting requests are answered ``NOT_COORDINATOR``, so clients find the coordinator
  again.

A group that starts from Empty waits ``initial_rebalance_delay_s`` before completing, extended by
each member that joins meanwhile (up to the rebalance timeout), so consumers started together land
in one generation instead of one each. Kafka's default is 3 s, tuned for fleets of consumers
restarting at once; tidelog's is 0.1 s: long enough for the members of one process or one
deployment step to arrive together, short enough that a lone consumer starts at once.

What each request gets in each state, from a member that is known, is its own, and names the
current generation, is :data:`HEARTBEAT_ANSWERS`, :data:`COMMIT_ANSWERS` and :meth:`Group.sync`
(JoinGroup's decisions are :mod:`tidelog.kafka.group_joins`). Before that: an unknown member id
(or one another principal joined as) is ``UNKNOWN_MEMBER_ID``; a static member's instance id held
by another member id is ``FENCED_INSTANCE_ID``; another generation is ``ILLEGAL_GENERATION``.

Liveness. Each member is heard from by its joins, syncs, heartbeats and commits; one not heard
from for its session timeout is removed (a REBALANCE). A member whose JoinGroup or SyncGroup is
waiting is not expired meanwhile: the rebalance timeout bounds both waits. A waiting request
whose connection closes (:meth:`Group.abandon`) removes a dynamic member at once, so nobody
waits for a client that is gone. At its end, members
that have not rejoined are removed (PreparingRebalance), or, when the leader has not sent the
assignment, those that have not sent their SyncGroup, the leader among them (CompletingRebalance,
as Kafka's newer coordinator does).

Static membership (``group.instance.id``, KIP-345) is served in a simple form: an instance id
names one member; a join under it with no member id takes that member's place under a new member
id (the old one is fenced). Kafka then skips the rebalance; here it is skipped only when the
group is Stable, the replaced member was not the leader and its metadata is unchanged (else the
group rebalances). Members are removed at the rebalance timeout whether static or not.

Bounds (:class:`~tidelog.kafka.group_model.GroupLimits`): members per group, the metadata one
join may carry, and the bytes of metadata and assignments a group holds (:attr:`Group.size`),
which the shell sums over every group.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from tidelog.kafka.group_model import (
    Answer,
    Delivery,
    GroupLimits,
    JoinAnswer,
    JoinRequest,
    Member,
    Pending,
    Step,
    SyncAnswer,
    select_protocol,
)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Event(enum.Enum):
    REBALANCE = "rebalance"
    JOINED = "joined"
    JOINED_NONE = "joined, nobody left"
    ASSIGNED = "assigned"
    UNLOADED = "unloaded"


_S = GroupState
TRANSITIONS: Final[Mapping[tuple[GroupState, Event], GroupState]] = {
    (_S.EMPTY, Event.REBALANCE): _S.PREPARING_REBALANCE,
    (_S.PREPARING_REBALANCE, Event.REBALANCE): _S.PREPARING_REBALANCE,
    (_S.COMPLETING_REBALANCE, Event.REBALANCE): _S.PREPARING_REBALANCE,
    (_S.STABLE, Event.REBALANCE): _S.PREPARING_REBALANCE,
    (_S.PREPARING_REBALANCE, Event.JOINED): _S.COMPLETING_REBALANCE,
    (_S.PREPARING_REBALANCE, Event.JOINED_NONE): _S.EMPTY,
    (_S.COMPLETING_REBALANCE, Event.ASSIGNED): _S.STABLE,
    **{(s, Event.UNLOADED): _S.DEAD for s in GroupState if s is not _S.DEAD},
}
"""The only ways a group's state changes (module docstring)."""

HEARTBEAT_ANSWERS: Final[Mapping[GroupState, ErrorCode]] = {
    _S.EMPTY: ErrorCode.unknown_member_id,
    _S.PREPARING_REBALANCE: ErrorCode.rebalance_in_progress,
    _S.COMPLETING_REBALANCE: ErrorCode.none,  # between its join and its sync: keep it alive
    _S.STABLE: ErrorCode.none,
    _S.DEAD: ErrorCode.coordinator_not_available,
}
"""A heartbeat from a current member, by state."""

COMMIT_ANSWERS: Final[Mapping[GroupState, ErrorCode]] = {
    _S.EMPTY: ErrorCode.unknown_member_id,
    _S.PREPARING_REBALANCE: ErrorCode.none,  # it learns of the rebalance from its heartbeat
    _S.COMPLETING_REBALANCE: ErrorCode.rebalance_in_progress,
    _S.STABLE: ErrorCode.none,
    _S.DEAD: ErrorCode.coordinator_not_available,
}
"""An offset commit from a current member at the current generation, by state."""


class IllegalTransition(Exception):
    """A bug: an event the table has no entry for in the group's state."""


@dataclass
class Group:
    """One group's state machine (module docstring). Every method takes the time ``now``
    (seconds, monotonic); JoinGroup's decisions are :func:`tidelog.kafka.group_joins.join`."""

    group_id: str
    limits: GroupLimits
    new_member_id: Callable[[str], str]
    """A fresh member id from a client id or instance id (the shell's: a UUID)."""
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    """By member id, in the order they joined (the first is leader when none is)."""
    pending: dict[str, Pending] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)
    """Instance id -> member id."""
    complete_not_before: float = 0.0
    """PreparingRebalance: the initial delay's end."""
    initial_until: float = 0.0
    """PreparingRebalance from Empty: how far the initial delay may be extended."""
    rebalance_deadline: float = 0.0
    """PreparingRebalance: when members that have not rejoined are removed; CompletingRebalance:
    when members that have not sent their SyncGroup are (the leader has not assigned)."""
    _out: list[Delivery] = field(default_factory=list)

    # -- queries ---------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of metadata and assignments held."""
        return sum(m.size for m in self.members.values())

    @property
    def evictable(self) -> bool:
        return self.state is GroupState.EMPTY and not self.pending

    def next_deadline(self, now: float) -> float | None:
        """The next time :meth:`tick` may change something (None: none is due)."""
        times = [p.expires_at for p in self.pending.values()]
        times += [t for m in self.members.values() if (t := m.expires_at()) is not None]
        if self.state is GroupState.PREPARING_REBALANCE and self.complete_not_before > now:
            times.append(self.complete_not_before)
        if self.state in (GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE):
            times.append(self.rebalance_deadline)
        later = [t for t in times if t > now]
        return min(later) if later else None

    # -- the members' requests -------------------------------------------------------------------

    def sync(
        self,
        member_id: str,
        instance_id: str | None,
        principal: str,
        generation: int,
        protocol: tuple[str | None, str | None],
        assignments: Mapping[str, bytes],
        now: float,
        room: int,
    ) -> Step:
        """A SyncGroup: REBALANCE_IN_PROGRESS while Preparing; the member's assignment when
        Stable; while Completing it waits, and the leader's (``assignments``: member id ->
        assignment, of which ``room`` bytes may be kept) answers everyone. ``protocol``: the
        (type, name) it names (v5+; None: unnamed)."""
        code = self.check_member(member_id, instance_id, principal, generation)
        if code is not None:
            return Step(member_id, SyncAnswer(code))
        kind, name = protocol
        if (kind is not None and kind != self.protocol_type) or (
            name is not None and name != self.protocol_name
        ):
            return Step(member_id, SyncAnswer(ErrorCode.inconsistent_group_protocol))
        member = self.members[member_id]
        member.last_heard = now
        if self.state is GroupState.PREPARING_REBALANCE:
            return Step(member_id, SyncAnswer(ErrorCode.rebalance_in_progress))
        if self.state is GroupState.STABLE:
            return Step(member_id, self._sync_answer(member, ErrorCode.none))
        member.awaiting_sync = True
        if member_id == self.leader:
            if sum(len(assignments.get(m, b"")) for m in self.members) > room:
                # Kafka's answer when it cannot store an assignment: everyone starts over
                self._propagate_assignment(ErrorCode.unknown_server_error)
                self.rebalance(now)
            else:
                for other in self.members.values():
                    other.assignment = bytes(assignments.get(other.member_id, b""))
                    other.last_heard = now
                self._transition(Event.ASSIGNED)
                self._propagate_assignment(ErrorCode.none)
        return Step(member_id, None, self.flush())

    def heartbeat(
        self, member_id: str, instance_id: str | None, principal: str, generation: int, now: float
    ) -> ErrorCode:
        code = self.check_member(member_id, instance_id, principal, generation)
        if code is not None:
            return code
        self.members[member_id].last_heard = now
        return HEARTBEAT_ANSWERS[self.state]

    def check_commit(
        self, member_id: str, instance_id: str | None, principal: str, generation: int, now: float
    ) -> ErrorCode:
        """Whether an OffsetCommit may be stored. A commit with no generation (-1) is allowed
        while the group has no members: a consumer that assigns itself its partitions."""
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if instance_id is not None and self.fenced(member_id, instance_id):
            return ErrorCode.fenced_instance_id
        if generation < 0 and self.state is GroupState.EMPTY:
            return ErrorCode.none
        code = self.check_member(member_id, instance_id, principal, generation)
        if code is not None:
            return code
        answer = COMMIT_ANSWERS[self.state]
        if answer is ErrorCode.none:
            self.members[member_id].last_heard = now
        return answer

    def leave(
        self, member_id: str, instance_id: str | None, principal: str, now: float
    ) -> tuple[ErrorCode, tuple[Delivery, ...]]:
        """A LeaveGroup of one member (by member id, or by instance id alone)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, ()
        if member_id and instance_id is not None and self.fenced(member_id, instance_id):
            return ErrorCode.fenced_instance_id, ()
        pending = self.pending.get(member_id)
        if pending is not None and pending.principal == principal:
            del self.pending[member_id]
            self.maybe_complete(now)
            return ErrorCode.none, self.flush()
        if instance_id is not None and instance_id in self.static:
            member = self.members.get(self.static[instance_id])
        else:
            member = self.members.get(member_id)
        if member is None or member.principal != principal:
            return ErrorCode.unknown_member_id, ()
        self.remove(member, now)
        return ErrorCode.none, self.flush()

    def abandon(self, member_id: str, answer: type[Answer], now: float) -> tuple[Delivery, ...]:
        """A waiting join (``JoinAnswer``) or sync (``SyncAnswer``) whose request went away
        (its connection closed): a dynamic member is removed at once, as by a LeaveGroup, so
        the rebalance goes on without it; a static member (an instance id, which is meant to
        come back) is only no longer waiting, heard from now, and expires unless it returns."""
        member = self.members.get(member_id)
        if member is None:
            return ()
        if answer is JoinAnswer:
            member.awaiting_join = False
        else:
            member.awaiting_sync = False
        member.last_heard = now
        if member.instance_id is None:
            self.remove(member, now)
        return self.flush()

    # -- time and the coordinator ----------------------------------------------------------------

    def tick(self, now: float) -> tuple[Delivery, ...]:
        """Expire what is due: unused member ids, silent members, the rebalance's waits."""
        for member_id, pending in list(self.pending.items()):
            if pending.expires_at <= now:
                del self.pending[member_id]
        for member in list(self.members.values()):
            expires = member.expires_at()
            if expires is not None and expires <= now and member.member_id in self.members:
                self.remove(member, now)
        if self.state is GroupState.COMPLETING_REBALANCE and now >= self.rebalance_deadline:
            for member in [m for m in self.members.values() if not m.awaiting_sync]:
                if member.member_id in self.members:
                    self.remove(member, now)
        self.maybe_complete(now)
        return self.flush()

    def unload(self) -> tuple[Delivery, ...]:
        """The coordinator drops the group: every waiting request is answered NOT_COORDINATOR."""
        if self.state is GroupState.DEAD:
            return ()
        for member in self.members.values():
            if member.awaiting_join:
                self.deliver(member, JoinAnswer(ErrorCode.not_coordinator, member.member_id))
            if member.awaiting_sync:
                self.deliver(member, SyncAnswer(ErrorCode.not_coordinator))
            member.awaiting_join = member.awaiting_sync = False
        self._transition(Event.UNLOADED)
        return self.flush()

    # -- what joins and leaves do (group_joins.py calls these) -----------------------------------

    def add(self, member_id: str, request: JoinRequest, now: float) -> Step:
        """A new member, waiting for the rebalance its arrival starts (or extends)."""
        if not self.members:
            self.protocol_type = request.protocol_type
        self.members[member_id] = Member(
            member_id,
            request.instance_id,
            request.principal,
            request.client_id,
            request.client_host,
            request.session_timeout_s,
            request.rebalance_timeout_s,
            request.protocols,
            now,
        )
        if request.instance_id is not None:
            self.static[request.instance_id] = member_id
        if self.state is GroupState.PREPARING_REBALANCE and now < self.initial_until:
            # the initial delay goes on while members keep arriving
            delay = self.limits.initial_rebalance_delay_s
            self.complete_not_before = min(now + delay, self.initial_until)
        return self.wait_for_rebalance(self.members[member_id], now)

    def wait_for_rebalance(self, member: Member, now: float) -> Step:
        """``member``'s JoinGroup waits for the rebalance, started now unless one is under way."""
        member.awaiting_join = True
        if self.state is not GroupState.PREPARING_REBALANCE:
            self.rebalance(now)
        self.maybe_complete(now)
        return Step(member.member_id, None, self.flush())

    def rebalance(self, now: float) -> None:
        """Start a rebalance (REBALANCE): waiting syncs are told to join again."""
        if self.state is GroupState.COMPLETING_REBALANCE:
            self._propagate_assignment(ErrorCode.rebalance_in_progress)
        timeout = max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)
        if self.state is GroupState.EMPTY:
            delay = self.limits.initial_rebalance_delay_s
            self.complete_not_before = now + delay
            self.initial_until = now + max(timeout, delay)
            self.rebalance_deadline = self.initial_until
        elif self.state is not GroupState.PREPARING_REBALANCE:
            self.complete_not_before = now
            self.initial_until = 0.0
            self.rebalance_deadline = now + timeout
        self._transition(Event.REBALANCE)

    def maybe_complete(self, now: float) -> None:
        """Complete the rebalance if everyone has joined (after the initial delay) or its
        timeout has passed."""
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        everyone = not self.pending and all(m.awaiting_join for m in self.members.values())
        if now >= self.rebalance_deadline or (everyone and now >= self.complete_not_before):
            self._complete(now)

    def join_answer(self, member: Member) -> JoinAnswer:
        """The current generation, as ``member``'s JoinGroup is answered (the leader's with
        every member's metadata for the chosen protocol)."""
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == self.leader:
            members = tuple(
                (m.member_id, m.instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()
            )
        return JoinAnswer(
            ErrorCode.none,
            member.member_id,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader or "",
            members,
        )

    def check_member(
        self, member_id: str, instance_id: str | None, principal: str, generation: int
    ) -> ErrorCode | None:
        """None when the request comes from a current member, as itself, at this generation."""
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if instance_id is not None and self.fenced(member_id, instance_id):
            return ErrorCode.fenced_instance_id
        member = self.members.get(member_id)
        if member is None or member.principal != principal:
            return ErrorCode.unknown_member_id
        if generation != self.generation:
            return ErrorCode.illegal_generation
        return None

    def fenced(self, member_id: str, instance_id: str) -> bool:
        """Whether ``instance_id`` belongs to a member other than ``member_id``."""
        held = self.static.get(instance_id)
        return held is not None and held != member_id

    def remove(self, member: Member, now: float) -> None:
        """A member leaves or is expired: its waiting requests are answered
        ``UNKNOWN_MEMBER_ID`` and the group rebalances."""
        if member.awaiting_join:
            self.deliver(member, JoinAnswer(ErrorCode.unknown_member_id, member.member_id))
        if member.awaiting_sync:
            self.deliver(member, SyncAnswer(ErrorCode.unknown_member_id))
        member.awaiting_join = member.awaiting_sync = False
        self._forget(member)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.rebalance(now)
        self.maybe_complete(now)

    def deliver(self, member: Member, answer: Answer) -> None:
        self._out.append(Delivery(member.member_id, answer))

    def flush(self) -> tuple[Delivery, ...]:
        """The answers decided since the last flush."""
        out, self._out = tuple(self._out), []
        return out

    # -- inside ----------------------------------------------------------------------------------

    def _complete(self, now: float) -> None:
        for member in list(self.members.values()):
            if not member.awaiting_join:
                self._forget(member)
        self.pending.clear()
        self.generation += 1
        if not self.members:
            self.protocol_type = self.protocol_name = self.leader = None
            self._transition(Event.JOINED_NONE)
            return
        self.protocol_name = select_protocol(list(self.members.values()))
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self._transition(Event.JOINED)
        self.rebalance_deadline = now + max(m.rebalance_timeout_s for m in self.members.values())
        for member in self.members.values():
            member.assignment = b""
            member.last_heard = now
            member.awaiting_join = False
            self.deliver(member, self.join_answer(member))

    def _sync_answer(self, member: Member, code: ErrorCode) -> SyncAnswer:
        return SyncAnswer(code, member.assignment, self.protocol_type, self.protocol_name)

    def _propagate_assignment(self, code: ErrorCode) -> None:
        for member in self.members.values():
            if code is not ErrorCode.none:
                member.assignment = b""
            if member.awaiting_sync:
                member.awaiting_sync = False
                self.deliver(member, self._sync_answer(member, code))

    def _forget(self, member: Member) -> None:
        del self.members[member.member_id]
        instance = member.instance_id
        if instance is not None and self.static.get(instance) == member.member_id:
            del self.static[instance]
        if self.leader == member.member_id:
            self.leader = None

    def _transition(self, event: Event) -> None:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"a group {self.state.value} cannot take {event}") from None
