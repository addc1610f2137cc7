"""The asyncio shell around the group state machine: joins and syncs that wait, timers that
expire members, a waiting request that goes away, closing, and the bounds on groups and bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kio.schema.errors import ErrorCode
from tests.kafka.kafka_wire import run

from tidelog.kafka.group_coordinator import Coordinator, coordinator_of
from tidelog.kafka.group_model import GroupLimits, JoinAnswer, JoinRequest
from tidelog.kafka.group_state import GroupState

FAST = GroupLimits(min_session_timeout_s=0.05, initial_rebalance_delay_s=0.0)


def joining(
    member_id: str = "",
    session: float = 0.5,
    metadata: bytes = b"m",
    client: str = "c",
    rebalance: float = 2.0,
) -> JoinRequest:
    return JoinRequest(
        member_id=member_id,
        instance_id=None,
        principal="alice",
        client_id=client,
        client_host="/127.0.0.1",
        session_timeout_s=session,
        rebalance_timeout_s=rebalance,
        protocol_type="consumer",
        protocols=(("range", metadata),),
        require_known_member_id=True,
    )


async def member_id_of(coordinator: Coordinator, group: str = "g", client: str = "c") -> str:
    answer = await coordinator.join(group, joining(client=client))
    assert answer.error is ErrorCode.member_id_required
    return answer.member_id


async def soon(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "did not happen in time"
        await asyncio.sleep(0.01)


def test_members_that_join_together_are_answered_together() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(replace(FAST, initial_rebalance_delay_s=0.2))
        a = await member_id_of(coordinator, client="a")
        b = await member_id_of(coordinator, client="b")
        first, second = await asyncio.gather(
            coordinator.join("g", joining(a)), coordinator.join("g", joining(b))
        )
        assert first.generation == second.generation == 1
        assert first.leader == second.leader == a
        assert [m for m, _, _ in first.members] == [a, b] and second.members == ()
        # the follower's sync waits for the leader's
        follower = asyncio.create_task(coordinator.sync("g", b, None, "alice", 1, (None, None), {}))
        await asyncio.sleep(0.05)
        assert not follower.done()
        mine = await coordinator.sync("g", a, None, "alice", 1, (None, None), {b: b"B", a: b"A"})
        assert mine.assignment == b"A" and (await follower).assignment == b"B"
        coordinator.close()

    run(scenario)


def test_a_silent_member_is_expired_by_the_timer() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(FAST)
        a = await member_id_of(coordinator, client="a")
        await coordinator.join("g", joining(a))
        await coordinator.sync("g", a, None, "alice", 1, (None, None), {a: b"A"})
        group = coordinator.find("g")
        assert group is not None and group.state is GroupState.STABLE
        await soon(lambda: group.state is GroupState.EMPTY)  # no heartbeat for 0.5 s
        assert group.generation == 2 and not coordinator._timers
        coordinator.close()

    run(scenario)


def test_a_waiting_join_that_goes_away_is_released() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(FAST)
        a = await member_id_of(coordinator, client="a")
        await coordinator.join("g", joining(a))
        await coordinator.sync("g", a, None, "alice", 1, (None, None), {})
        b = await member_id_of(coordinator, client="b")
        waiting = asyncio.create_task(coordinator.join("g", joining(b)))
        await asyncio.sleep(0.05)
        group = coordinator.find("g")
        assert group is not None and group.members[b].awaiting_join
        waiting.cancel()  # its connection closed
        await asyncio.sleep(0)
        assert b not in group.members and not coordinator._waiting  # removed at once
        # a rejoins and goes on alone at once, not after b's rebalance timeout
        started = asyncio.get_running_loop().time()
        answer = await coordinator.join("g", joining(a, rebalance=10.0))
        assert answer.error is ErrorCode.none and list(group.members) == [a]
        assert answer.generation == 2 and asyncio.get_running_loop().time() - started < 1.0
        coordinator.close()

    run(scenario)


def test_a_second_join_of_the_same_member_answers_the_first() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(FAST)
        a = await member_id_of(coordinator, client="a")
        await coordinator.join("g", joining(a))
        await coordinator.sync("g", a, None, "alice", 1, (None, None), {})
        b = await member_id_of(coordinator, client="b")
        first = asyncio.create_task(coordinator.join("g", joining(b)))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(coordinator.join("g", joining(b)))
        await asyncio.sleep(0.02)
        assert (await first) == JoinAnswer(ErrorCode.rebalance_in_progress, b)
        assert not second.done()
        await coordinator.join("g", joining(a))
        assert (await second).generation == 2
        coordinator.close()

    run(scenario)


def test_closing_answers_the_waiting_and_stops_every_timer() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(replace(FAST, initial_rebalance_delay_s=10.0))
        a = await member_id_of(coordinator)
        waiting = asyncio.create_task(coordinator.join("g", joining(a)))
        await asyncio.sleep(0.02)
        assert coordinator._timers
        coordinator.close()
        assert (await waiting).error is ErrorCode.not_coordinator
        assert not coordinator._timers and not coordinator.groups
        later = await coordinator.join("g", joining())
        assert later.error is ErrorCode.coordinator_not_available
        assert (
            coordinator.heartbeat("g", a, None, "alice", 1) is ErrorCode.coordinator_not_available
        )

    run(scenario)


def test_groups_are_bounded_and_the_least_recently_used_empty_one_makes_room() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(replace(FAST, max_groups=2))
        assert coordinator.check_commit("one", "", None, "bob", -1) is ErrorCode.none
        assert coordinator.check_commit("two", "", None, "bob", -1) is ErrorCode.none
        assert coordinator.check_commit("one", "", None, "bob", -1) is ErrorCode.none  # used
        await member_id_of(coordinator, "three")  # "two" is evicted for it
        assert set(coordinator.groups) == {"one", "three"}
        # "three" holds a member id handed out: not evictable; "one" is
        await member_id_of(coordinator, "four")
        assert set(coordinator.groups) == {"three", "four"}
        refused = await coordinator.join("five", joining())
        assert refused.error is ErrorCode.coordinator_not_available
        assert coordinator.check_commit("gone", "", None, "bob", 3) is ErrorCode.illegal_generation
        coordinator.close()

    run(scenario)


def test_the_bytes_every_group_holds_are_bounded() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(replace(FAST, max_total_bytes=100))
        a = await member_id_of(coordinator, "g1")
        await coordinator.join("g1", joining(a, metadata=b"x" * 60))
        assert coordinator.room == 40
        b = await member_id_of(coordinator, "g2")
        refused = await coordinator.join("g2", joining(b, metadata=b"y" * 60))
        assert refused.error is ErrorCode.coordinator_not_available
        assert coordinator.leave("g1", a, None, "alice") is ErrorCode.none
        assert coordinator.room == 100
        answer = await coordinator.join("g2", joining(b, metadata=b"y" * 60))
        assert answer.error is ErrorCode.none
        coordinator.close()

    run(scenario)


def test_a_refused_first_join_leaves_no_group_behind() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(FAST)
        answer = await coordinator.join("g", joining(session=0.001))
        assert answer.error is ErrorCode.invalid_session_timeout
        assert not coordinator.groups
        unknown = await coordinator.join("g", joining("someone"))
        assert unknown.error is ErrorCode.unknown_member_id and not coordinator.groups

    run(scenario)


class DrainingControl:
    """What ``coordinator_of`` reads of a control: its drain callbacks."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return lambda: None


def test_one_coordinator_per_server_closed_when_it_drains() -> None:
    control: Any = DrainingControl()
    other: Any = DrainingControl()
    coordinator = coordinator_of(control)
    assert coordinator_of(control) is coordinator
    assert coordinator_of(other) is not coordinator
    for callback in control.callbacks:
        callback()
    assert coordinator.closed and not coordinator_of(other).closed
