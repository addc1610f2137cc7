"""The Kafka group coordinator of one server: the asyncio shell around :mod:`group_state`.

The state machine decides; this shell keeps the groups by id, lets a JoinGroup or SyncGroup wait
for its answer, and wakes each group when its next deadline comes (one timer per group, set
again after everything that happens to it). It is the only place with a clock (the event
loop's) and futures.

Invariants:

- one request waits per (group, member, JoinGroup or SyncGroup): a second one from the same
  member (a client that timed out and asked again) answers the first ``REBALANCE_IN_PROGRESS``;
- a waiting request whose task is cancelled (its connection closed, the listener stopped)
  removes its member at once (a static member: leaves it as if it had gone quiet, so it expires
  unless it comes back; ``Group.abandon``): nothing waits for an answer nobody will read;
- the bytes every group holds (members' metadata and assignments) stay under
  ``max_total_bytes``, groups under ``max_groups`` (the least recently used Empty group is
  evicted for a new one; none evictable: ``COORDINATOR_NOT_AVAILABLE``, retriable);
- per identified principal too: the bytes of its members under ``max_bytes_per_principal``,
  the groups it created (by its first join or commit) under ``max_groups_per_principal`` (its
  own least recently used Empty group is evicted for a new one), so one principal cannot deny
  the others their groups. Anonymous callers cannot be told apart: they share the global
  bounds only;
- a member's rebalance timeout is at most ``max_rebalance_timeout_s``;
- :meth:`Coordinator.close` (the server drains) cancels every timer and answers every waiting
  request ``NOT_COORDINATOR``; a closed coordinator answers ``COORDINATOR_NOT_AVAILABLE``.

Where a group lives. Its committed offsets are cursors named ``__group:<group id>`` in the
cursor stream (``tidelog.access.GROUP_CURSOR_PREFIX``: a group's positions, as tidelog's own
groups keep theirs). The group's coordinator is the broker that leads the cursor partition a
cursor keyed by that name alone hashes to (CRC-32 of the name, modulo the partitions, as the
cursor store places keys): on a single broker, this broker. Membership lives in this memory
only; a restart or a move of that partition's leadership loses it, and the members join again,
as Kafka's do when their coordinator moves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
import weakref
import zlib
from collections.abc import Callable, Mapping
from typing import Final

from kio.schema.errors import ErrorCode

from tidelog.access import ANONYMOUS, GROUP_CURSOR_PREFIX, Kind, Operation
from tidelog.broker import MAX_CURSOR_ID_BYTES
from tidelog.control import Control
from tidelog.errors import TidelogError
from tidelog.kafka.group_joins import join
from tidelog.kafka.group_model import (
    Answer,
    Delivery,
    GroupLimits,
    JoinAnswer,
    JoinRequest,
    Step,
    SyncAnswer,
)
from tidelog.kafka.group_state import Group, GroupState
from tidelog.kafka.session import Session

LOG = logging.getLogger("tidelog.kafka")


def cursor_id(group_id: str) -> str:
    """The cursor that holds ``group_id``'s committed offsets."""
    return GROUP_CURSOR_PREFIX + group_id


async def coordinator_broker(control: Control, group_id: str) -> str | None:
    """The broker id that coordinates ``group_id`` (module docstring); None: no leader now."""
    store = await control.cursors()
    name = store.stream.name
    number = zlib.crc32(cursor_id(group_id).encode()) % len(store.stream.partitions)
    info = control.describe_stream(name)
    partition = None if info is None else info.partitions.get(number)
    return partition.leader if partition is not None and partition.leader else None


async def refusal(
    session: Session, group_id: str, operation: Operation = Operation.GROUP
) -> ErrorCode | None:
    """Why a call about ``group_id`` is refused, or None: an empty group id, or one too long to
    name a cursor (``INVALID_GROUP_ID``); the caller may not ``operation`` the group
    (``GROUP_AUTHORIZATION_FAILED``); another broker coordinates it (``NOT_COORDINATOR``), or
    none does now (``COORDINATOR_NOT_AVAILABLE``)."""
    if not group_id or len(cursor_id(group_id).encode()) > MAX_CURSOR_ID_BYTES:
        return ErrorCode.invalid_group_id
    if not session.allowed(operation, Kind.GROUP, group_id):
        return ErrorCode.group_authorization_failed
    try:
        broker = await coordinator_broker(session.control, group_id)
    except TidelogError as error:
        LOG.warning("kafka group %r has no coordinator now: %s", group_id, error)
        return ErrorCode.coordinator_not_available
    if broker is None:
        return ErrorCode.coordinator_not_available
    return None if broker == session.control.broker_id else ErrorCode.not_coordinator


def _member_id(prefix: str) -> str:
    """Kafka's shape: the client id (or instance id), a dash, a UUID."""
    return f"{prefix}-{uuid.uuid4()}"


class Coordinator:
    """The groups this server coordinates (module docstring)."""

    def __init__(self, limits: GroupLimits | None = None) -> None:
        self.limits = limits or GroupLimits()
        self.groups: dict[str, Group] = {}
        """By id, least recently used first."""
        self.closed = False
        self._waiting: dict[tuple[str, str, type[Answer]], asyncio.Future[Answer]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._sizes: dict[str, int] = {}
        self._total = 0
        self._shares: dict[str, dict[str, int]] = {}
        """Each group's bytes by the principal of the members holding them."""
        self._spent: dict[str, int] = {}
        """Bytes held by each principal's members, every group together."""
        self._founders: dict[str, str] = {}
        """The principal that created each group (its first join or commit)."""
        self._founded: dict[str, int] = {}
        """Groups kept that each principal created."""
        self._seen: dict[str, tuple[GroupState, int]] = {}
        """What the log said last of each group (a line per change of state or generation)."""

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def room(self) -> int:
        """Bytes of metadata and assignments the groups may still take."""
        return max(self.limits.max_total_bytes - self._total, 0)

    def room_for(self, principal: str) -> int:
        """Bytes ``principal``'s members may still take: the global room, and an identified
        principal's own budget."""
        if principal == ANONYMOUS:
            return self.room
        own = self.limits.max_bytes_per_principal - self._spent.get(principal, 0)
        return max(min(self.room, own), 0)

    def find(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    # -- requests --------------------------------------------------------------------------------

    async def join(self, group_id: str, request: JoinRequest) -> JoinAnswer:
        if self.closed:
            return JoinAnswer(ErrorCode.coordinator_not_available, request.member_id)
        group = self._use(group_id)
        created = group is None
        if group is None:
            if request.member_id:  # a member of a group this coordinator does not know
                return JoinAnswer(ErrorCode.unknown_member_id, request.member_id)
            group = self._create(group_id, request.principal)
            if group is None:
                return JoinAnswer(ErrorCode.coordinator_not_available)
        if request.rebalance_timeout_s > self.limits.max_rebalance_timeout_s:
            request = dataclasses.replace(
                request, rebalance_timeout_s=self.limits.max_rebalance_timeout_s
            )
        step = join(group, request, self._now(), self.room_for(request.principal))
        if created and isinstance(step.answer, JoinAnswer) and group.evictable:
            self._drop(group_id)  # refused before anyone joined: no trace of it is kept
            return step.answer
        answer = await self._answer(group, step, JoinAnswer)
        assert isinstance(answer, JoinAnswer)
        return answer

    async def sync(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        principal: str,
        generation: int,
        protocol: tuple[str | None, str | None],
        assignments: Mapping[str, bytes],
    ) -> SyncAnswer:
        if self.closed:
            return SyncAnswer(ErrorCode.coordinator_not_available)
        group = self._use(group_id)
        if group is None:
            return SyncAnswer(ErrorCode.unknown_member_id)
        step = group.sync(
            member_id,
            instance_id,
            principal,
            generation,
            protocol,
            assignments,
            self._now(),
            self.room_for(principal),
        )
        answer = await self._answer(group, step, SyncAnswer)
        assert isinstance(answer, SyncAnswer)
        return answer

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        principal: str,
        generation: int,
    ) -> ErrorCode:
        group = None if self.closed else self._use(group_id)
        if group is None:
            return (
                ErrorCode.coordinator_not_available if self.closed else ErrorCode.unknown_member_id
            )
        code = group.heartbeat(member_id, instance_id, principal, generation, self._now())
        self._settle(group, ())
        return code

    def check_commit(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        principal: str,
        generation: int,
    ) -> ErrorCode:
        """Whether an OffsetCommit may be stored (``Group.check_commit``). A commit without a
        generation for a group not known yet makes it known, Empty, as Kafka's does."""
        if self.closed:
            return ErrorCode.coordinator_not_available
        group = self._use(group_id)
        if group is None:
            if generation >= 0:
                return ErrorCode.illegal_generation
            # listed from now on, when there is room; allowed either way
            self._create(group_id, principal)
            return ErrorCode.none
        code = group.check_commit(member_id, instance_id, principal, generation, self._now())
        self._settle(group, ())
        return code

    def leave(
        self, group_id: str, member_id: str, instance_id: str | None, principal: str
    ) -> ErrorCode:
        if self.closed:
            return ErrorCode.coordinator_not_available
        group = self._use(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        code, deliveries = group.leave(member_id, instance_id, principal, self._now())
        self._settle(group, deliveries)
        return code

    def close(self) -> None:
        """Drop every group: timers cancelled, waiting requests answered NOT_COORDINATOR."""
        if self.closed:
            return
        self.closed = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for group in self.groups.values():
            self._deliver(group.group_id, group.unload())
        for key, future in self._waiting.items():
            if not future.done():
                future.set_result(_answer_of(key[2], ErrorCode.not_coordinator))
        self._waiting.clear()
        self.groups.clear()
        self._seen.clear()
        self._sizes.clear()
        self._total = 0
        self._shares.clear()
        self._spent.clear()
        self._founders.clear()
        self._founded.clear()

    # -- inside ----------------------------------------------------------------------------------

    def _use(self, group_id: str) -> Group | None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            self.groups[group_id] = group  # most recently used last
        return group

    def _create(self, group_id: str, principal: str) -> Group | None:
        """A new group ``principal`` creates; None when neither the coordinator nor the
        principal has room for one and no Empty group can make it (module docstring)."""
        over = self._founded.get(principal, 0) >= self.limits.max_groups_per_principal
        if (
            principal != ANONYMOUS
            and over
            and not self._evict(lambda g: self._founders.get(g.group_id) == principal)
        ):
            return None
        if len(self.groups) >= self.limits.max_groups and not self._evict(lambda _: True):
            return None
        group = self.groups[group_id] = Group(group_id, self.limits, _member_id)
        self._founders[group_id] = principal
        self._founded[principal] = self._founded.get(principal, 0) + 1
        return group

    def _evict(self, which: Callable[[Group], bool]) -> bool:
        """Forget the least recently used Empty group ``which`` accepts; whether one was."""
        victim = next((g for g in self.groups.values() if g.evictable and which(g)), None)
        if victim is None:
            return False
        victim.unload()
        self._drop(victim.group_id)
        return True

    def _drop(self, group_id: str) -> None:
        self.groups.pop(group_id, None)
        handle = self._timers.pop(group_id, None)
        if handle is not None:
            handle.cancel()
        self._total -= self._sizes.pop(group_id, 0)
        self._charge(group_id, {})
        founder = self._founders.pop(group_id, None)
        if founder is not None:
            self._founded[founder] -= 1
            if not self._founded[founder]:
                del self._founded[founder]
        self._seen.pop(group_id, None)

    def _charge(self, group_id: str, shares: dict[str, int]) -> None:
        """Make ``shares`` (bytes by principal) the group's part of each principal's bytes."""
        for principal, size in self._shares.pop(group_id, {}).items():
            self._spent[principal] -= size
            if not self._spent[principal]:
                del self._spent[principal]
        for principal, size in shares.items():
            self._spent[principal] = self._spent.get(principal, 0) + size
        if shares:
            self._shares[group_id] = shares

    async def _answer(self, group: Group, step: Step, kind: type[Answer]) -> Answer:
        if step.answer is not None:
            self._settle(group, step.deliveries)
            return step.answer
        key = (group.group_id, step.member_id, kind)
        earlier = self._waiting.pop(key, None)
        if earlier is not None and not earlier.done():
            earlier.set_result(_answer_of(kind, ErrorCode.rebalance_in_progress, step.member_id))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        self._settle(group, step.deliveries)
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.get(key) is future:
                del self._waiting[key]
                if self.groups.get(group.group_id) is group:
                    self._settle(group, group.abandon(step.member_id, kind, self._now()))
            raise

    def _settle(self, group: Group, deliveries: tuple[Delivery, ...]) -> None:
        """Hand out ``deliveries``, count the group's bytes, set its timer again."""
        self._deliver(group.group_id, deliveries)
        seen = self._seen.get(group.group_id)
        if seen != (group.state, group.generation):
            self._seen[group.group_id] = (group.state, group.generation)
            LOG.info(
                "kafka group %r: %s, generation %d, %d members",
                group.group_id,
                group.state.value,
                group.generation,
                len(group.members),
            )
        size = group.size
        self._total += size - self._sizes.get(group.group_id, 0)
        self._sizes[group.group_id] = size
        shares: dict[str, int] = {}
        for member in group.members.values():
            if member.size:
                shares[member.principal] = shares.get(member.principal, 0) + member.size
        self._charge(group.group_id, shares)
        handle = self._timers.pop(group.group_id, None)
        if handle is not None:
            handle.cancel()
        if group.state is GroupState.DEAD or self.closed:
            return
        deadline = group.next_deadline(self._now())
        if deadline is not None:
            self._timers[group.group_id] = asyncio.get_running_loop().call_at(
                deadline, self._tick, group, deadline
            )

    def _deliver(self, group_id: str, deliveries: tuple[Delivery, ...]) -> None:
        for delivery in deliveries:
            key = (group_id, delivery.member_id, type(delivery.answer))
            future = self._waiting.pop(key, None)
            if future is not None and not future.done():
                future.set_result(delivery.answer)

    def _tick(self, group: Group, deadline: float) -> None:
        self._timers.pop(group.group_id, None)
        if self.groups.get(group.group_id) is not group:
            return
        # the loop may run a timer a hair before its time: never let the group see an earlier now
        self._settle(group, group.tick(max(self._now(), deadline)))


def _answer_of(kind: type[Answer], code: ErrorCode, member_id: str = "") -> Answer:
    return JoinAnswer(code, member_id) if kind is JoinAnswer else SyncAnswer(code)


_COORDINATORS: Final[weakref.WeakKeyDictionary[Control, Coordinator]] = weakref.WeakKeyDictionary()


def coordinator_of(control: Control) -> Coordinator:
    """The server's coordinator (one per control, so every connection shares it), closed when
    the server drains."""
    found = _COORDINATORS.get(control)
    if found is None:
        found = _COORDINATORS[control] = Coordinator()
        control.when_draining(found.close)
    return found
