"""The consumer-group state machine as tables, without I/O: its transitions, what each request
gets in each state, the join flows (MEMBER_ID_REQUIRED, static members), the protocol vote,
timeouts driven by a fake clock, and a hypothesis walk that checks its invariants after every
step."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from tidelog.kafka.group_joins import join
from tidelog.kafka.group_model import (
    Delivery,
    GroupLimits,
    JoinAnswer,
    JoinRequest,
    Step,
    SyncAnswer,
    select_protocol,
)
from tidelog.kafka.group_state import (
    TRANSITIONS,
    Event,
    Group,
    GroupState,
    IllegalTransition,
)

S = GroupState
LIMITS = GroupLimits(initial_rebalance_delay_s=0.0, min_session_timeout_s=1.0)
SESSION = 10.0
REBALANCE = 30.0
BIG = 1 << 30


def new_group(limits: GroupLimits = LIMITS) -> Group:
    ids = itertools.count(1)
    return Group("g", limits, lambda prefix: f"{prefix}-{next(ids)}")


def request(
    member_id: str = "",
    *,
    client: str = "c",
    principal: str = "alice",
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"r"),),
    known_id: bool = True,
    session: float = SESSION,
    protocol_type: str = "consumer",
) -> JoinRequest:
    return JoinRequest(
        member_id=member_id,
        instance_id=instance,
        principal=principal,
        client_id=client,
        client_host="/127.0.0.1",
        session_timeout_s=session,
        rebalance_timeout_s=REBALANCE,
        protocol_type=protocol_type,
        protocols=protocols,
        require_known_member_id=known_id,
    )


def answers(step: Step | tuple[Delivery, ...]) -> dict[str, JoinAnswer | SyncAnswer]:
    deliveries = step.deliveries if isinstance(step, Step) else step
    return {d.member_id: d.answer for d in deliveries}


def join_answers(step: Step | tuple[Delivery, ...]) -> dict[str, JoinAnswer]:
    return {k: v for k, v in answers(step).items() if isinstance(v, JoinAnswer)}


def joined(group: Group, now: float = 0.0, **kwargs: Any) -> str:
    """A new member through the v4+ flow; its member id (its join waits)."""
    first = join(group, request(**kwargs), now, BIG)
    assert first.answer == JoinAnswer(ErrorCode.member_id_required, first.member_id)
    second = join(group, request(first.member_id, **kwargs), now, BIG)
    assert second.answer is None
    return second.member_id


def stable(group: Group, count: int = 2, now: float = 0.0) -> list[str]:
    """``count`` members in a Stable group, each assigned its own id as bytes."""
    ids = []
    for n in range(count):
        first = join(group, request(client=f"c{n}"), now, BIG)
        ids.append(first.member_id)
    for member_id in ids:
        join(group, request(member_id), now, BIG)
    assert group.state is S.COMPLETING_REBALANCE, group.state
    leader = group.leader
    assert leader is not None
    assignments = {m: m.encode() for m in ids}
    step = group.sync(leader, None, "alice", group.generation, (None, None), assignments, now, BIG)
    assert group.state is S.STABLE
    assert answers(step)[leader] == SyncAnswer(ErrorCode.none, leader.encode(), "consumer", "range")
    return ids


# -- the transition table -------------------------------------------------------------------------

DOCUMENTED = {
    (S.EMPTY, Event.REBALANCE): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, Event.REBALANCE): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, Event.REBALANCE): S.PREPARING_REBALANCE,
    (S.STABLE, Event.REBALANCE): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, Event.JOINED): S.COMPLETING_REBALANCE,
    (S.PREPARING_REBALANCE, Event.JOINED_NONE): S.EMPTY,
    (S.COMPLETING_REBALANCE, Event.ASSIGNED): S.STABLE,
    (S.EMPTY, Event.UNLOADED): S.DEAD,
    (S.PREPARING_REBALANCE, Event.UNLOADED): S.DEAD,
    (S.COMPLETING_REBALANCE, Event.UNLOADED): S.DEAD,
    (S.STABLE, Event.UNLOADED): S.DEAD,
}


def test_the_transition_table_is_the_documented_one() -> None:
    assert dict(TRANSITIONS) == DOCUMENTED


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in GroupState for e in Event if (s, e) not in DOCUMENTED],
)
def test_an_event_outside_the_table_is_a_bug(state: GroupState, event: Event) -> None:
    group = new_group()
    group.state = state
    with pytest.raises(IllegalTransition):
        group._transition(event)


# -- what a current member's request gets, by state ----------------------------------------------


def group_in(state: GroupState) -> tuple[Group, str]:
    """A group in ``state`` and a current member of it (the leader)."""
    group = new_group()
    if state is S.DEAD:
        ids = stable(group)
        group.unload()
        return group, ids[0]
    ids = stable(group)
    leader = group.leader
    assert leader is not None
    if state is S.PREPARING_REBALANCE:
        follower = next(m for m in ids if m != leader)
        join(group, request(follower, protocols=(("range", b"other"),)), 1.0, BIG)
    elif state is S.COMPLETING_REBALANCE:
        for member_id in ids:
            join(group, request(member_id, protocols=(("range", b"again"),)), 1.0, BIG)
    assert group.state is state
    return group, leader


STATE_ANSWERS = [
    # state, heartbeat, commit, sync (None: it waits)
    (S.PREPARING_REBALANCE, ErrorCode.rebalance_in_progress, ErrorCode.none, "rebalance"),
    (S.COMPLETING_REBALANCE, ErrorCode.none, ErrorCode.rebalance_in_progress, "assigned"),
    (S.STABLE, ErrorCode.none, ErrorCode.none, "assignment"),
    (S.DEAD, *(ErrorCode.coordinator_not_available,) * 2, "unavailable"),
]


@pytest.mark.parametrize(("state", "beat", "commit", "sync"), STATE_ANSWERS)
def test_a_current_members_requests_by_state(
    state: GroupState, beat: ErrorCode, commit: ErrorCode, sync: str
) -> None:
    group, leader = group_in(state)
    generation = group.generation
    assert group.heartbeat(leader, None, "alice", generation, 2.0) is beat
    assert group.check_commit(leader, None, "alice", generation, 2.0) is commit
    step = group.sync(leader, None, "alice", generation, (None, None), {}, 2.0, BIG)
    got = answers(step).get(leader) if step.answer is None else step.answer
    expected = {
        "rebalance": SyncAnswer(ErrorCode.rebalance_in_progress),
        "assigned": SyncAnswer(ErrorCode.none, b"", "consumer", "range"),  # it assigned nothing
        "assignment": SyncAnswer(ErrorCode.none, leader.encode(), "consumer", "range"),
        "unavailable": SyncAnswer(ErrorCode.coordinator_not_available),
    }[sync]
    assert got == expected


@pytest.mark.parametrize(
    ("who", "principal", "generation", "instance", "expected"),
    [
        ("stranger", "alice", 1, None, ErrorCode.unknown_member_id),
        ("leader", "mallory", 1, None, ErrorCode.unknown_member_id),
        ("leader", "alice", 0, None, ErrorCode.illegal_generation),
        ("leader", "alice", 2, None, ErrorCode.illegal_generation),
        ("leader", "alice", 1, "someone-else's", ErrorCode.fenced_instance_id),
        ("leader", "alice", 1, None, ErrorCode.none),
    ],
)
def test_who_may_heartbeat_commit_and_sync(
    who: str, principal: str, generation: int, instance: str | None, expected: ErrorCode
) -> None:
    group = new_group()
    stable(group)
    if instance is not None:
        group.static[instance] = "another-member"
    member_id = group.leader if who == "leader" else "stranger-1"
    assert member_id is not None
    assert group.heartbeat(member_id, instance, principal, generation, 1.0) is expected
    assert group.check_commit(member_id, instance, principal, generation, 1.0) is expected
    step = group.sync(member_id, instance, principal, generation, (None, None), {}, 1.0, BIG)
    if expected is not ErrorCode.none:
        assert step.answer == SyncAnswer(expected)


# -- joins --------------------------------------------------------------------------------------


def test_a_v4_member_gets_its_id_first_then_the_first_generation() -> None:
    group = new_group()
    first = join(group, request(client="app"), 0.0, BIG)
    assert first.answer == JoinAnswer(ErrorCode.member_id_required, "app-1")
    assert group.state is S.EMPTY and "app-1" in group.pending
    second = join(group, request("app-1", client="app"), 0.0, BIG)
    assert second.answer is None
    assert answers(second)["app-1"] == JoinAnswer(
        ErrorCode.none, "app-1", 1, "consumer", "range", "app-1", (("app-1", None, b"r"),)
    )
    assert group.state is S.COMPLETING_REBALANCE and not group.pending


def test_before_v4_a_member_is_added_at_once() -> None:
    group = new_group()
    step = join(group, request(known_id=False), 0.0, BIG)
    assert step.answer is None
    assert join_answers(step)["c-1"].error is ErrorCode.none


def test_the_initial_delay_gathers_members_that_arrive_together() -> None:
    group = new_group(replace(LIMITS, initial_rebalance_delay_s=1.0))
    a = joined(group, 0.0, client="a")
    assert group.state is S.PREPARING_REBALANCE and group.next_deadline(0.0) == 1.0
    b = joined(group, 0.5, client="b")  # extends the delay to 1.5
    assert group.tick(1.0) == ()
    done = join_answers(group.tick(1.5))
    assert set(done) == {a, b}
    leader = done[a]
    assert leader.leader == a and leader.generation == 1
    assert [m for m, _, _ in leader.members] == [a, b]
    assert done[b].members == ()


def test_a_join_that_shares_no_protocol_or_type_is_refused() -> None:
    group = new_group()
    stable(group)
    other = join(group, request(protocols=(("roundrobin", b""),)), 1.0, BIG)
    assert other.answer == JoinAnswer(ErrorCode.inconsistent_group_protocol)
    kind = join(group, request(protocol_type="connect"), 1.0, BIG)
    assert kind.answer == JoinAnswer(ErrorCode.inconsistent_group_protocol)
    assert join(group, request(protocols=()), 1.0, BIG).answer == JoinAnswer(
        ErrorCode.inconsistent_group_protocol
    )


def test_a_lone_member_may_change_the_groups_protocol_type() -> None:
    group = new_group()
    stable(group, count=1)
    member = group.leader
    assert member is not None
    step = join(group, request(member, protocol_type="connect"), 1.0, BIG)
    assert join_answers(step)[member].protocol_type == "connect"
    assert group.protocol_type == "connect" and group.generation == 2


@pytest.mark.parametrize(
    ("preferences", "chosen"),
    [
        ([["range"], ["range"]], "range"),
        ([["range", "roundrobin"], ["roundrobin", "range"], ["roundrobin"]], "roundrobin"),
        ([["a", "b"], ["b", "a"]], "a"),  # a tie: the earliest member's preference
        ([["sticky", "range"], ["sticky", "range"], ["range"]], "range"),  # only range is common
        ([["x", "y", "z"], ["z", "y"], ["y", "z"], ["z"]], "z"),
    ],
)
def test_the_protocol_is_chosen_by_the_members_vote(
    preferences: list[list[str]], chosen: str
) -> None:
    group = new_group()
    ids = []
    for n, names in enumerate(preferences):
        protocols = tuple((name, name.encode()) for name in names)
        ids.append(join(group, request(client=f"c{n}", protocols=protocols), 0.0, BIG).member_id)
    for member_id, names in zip(ids, preferences, strict=True):
        protocols = tuple((name, name.encode()) for name in names)
        join(group, request(member_id, protocols=protocols), 0.0, BIG)
    assert group.protocol_name == chosen
    assert select_protocol(list(group.members.values())) == chosen


def test_rejoins_in_a_stable_group() -> None:
    group = new_group()
    ids = stable(group)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    same = join(group, request(follower), 1.0, BIG)
    assert same.answer is not None and same.answer.error is ErrorCode.none  # nothing changes
    assert group.state is S.STABLE
    again = join(group, request(leader), 1.0, BIG)  # the leader asks for a rebalance
    assert again.answer is None and group.state is S.PREPARING_REBALANCE
    done = answers(join(group, request(follower), 1.0, BIG))
    assert group.state is S.COMPLETING_REBALANCE and group.generation == 2
    assert set(done) == {leader, follower}


def test_a_follower_waits_for_the_leaders_assignment() -> None:
    group = new_group()
    ids = []
    for n in range(2):
        ids.append(join(group, request(client=f"c{n}"), 0.0, BIG).member_id)
    for member_id in ids:
        join(group, request(member_id), 0.0, BIG)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    waits = group.sync(follower, None, "alice", 1, (None, None), {}, 0.0, BIG)
    assert waits.answer is None and waits.deliveries == ()
    done = group.sync(leader, None, "alice", 1, ("consumer", "range"), {follower: b"F"}, 0.0, BIG)
    assert answers(done) == {
        follower: SyncAnswer(ErrorCode.none, b"F", "consumer", "range"),
        leader: SyncAnswer(ErrorCode.none, b"", "consumer", "range"),
    }


def test_a_sync_naming_another_protocol_is_refused() -> None:
    group = new_group()
    stable(group)
    leader = group.leader
    assert leader is not None
    step = group.sync(leader, None, "alice", 1, ("consumer", "sticky"), {}, 0.0, BIG)
    assert step.answer == SyncAnswer(ErrorCode.inconsistent_group_protocol)


# -- leaving and timing out ---------------------------------------------------------------------


def test_a_silent_member_expires_and_the_others_rebalance() -> None:
    group = new_group()
    ids = stable(group)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    assert group.next_deadline(0.0) == SESSION
    assert group.heartbeat(leader, None, "alice", 1, 6.0) is ErrorCode.none
    assert group.tick(SESSION) == ()  # the follower goes; nothing was waiting
    assert follower not in group.members and group.state is S.PREPARING_REBALANCE
    assert group.heartbeat(leader, None, "alice", 1, 11.0) is ErrorCode.rebalance_in_progress
    done = join_answers(join(group, request(leader), 11.0, BIG))
    assert done[leader].generation == 2 and group.state is S.COMPLETING_REBALANCE


def test_members_that_do_not_rejoin_are_removed_at_the_rebalance_timeout() -> None:
    group = new_group()
    ids = stable(group)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    assert join(group, request(leader), 1.0, BIG).answer is None
    # it heartbeats (so its session does not end first) but does not rejoin
    assert group.heartbeat(follower, None, "alice", 1, 25.0) is ErrorCode.rebalance_in_progress
    assert group.next_deadline(25.0) == 1.0 + REBALANCE
    done = answers(group.tick(1.0 + REBALANCE))
    assert list(done) == [leader] and list(group.members) == [leader]
    assert group.state is S.COMPLETING_REBALANCE and group.generation == 2


def test_a_leader_that_never_assigns_is_removed_at_the_rebalance_timeout() -> None:
    group = new_group()
    ids = []
    for n in range(2):
        ids.append(join(group, request(client=f"c{n}"), 0.0, BIG).member_id)
    for member_id in ids:
        join(group, request(member_id), 0.0, BIG)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    group.sync(follower, None, "alice", 1, (None, None), {}, 0.0, BIG)
    for now in (5.0, 10.0, 15.0, 20.0, 25.0):
        assert group.heartbeat(leader, None, "alice", 1, now) is ErrorCode.none
    done = answers(group.tick(REBALANCE))
    assert done == {follower: SyncAnswer(ErrorCode.rebalance_in_progress, b"", "consumer", "range")}
    assert list(group.members) == [follower] and group.state is S.PREPARING_REBALANCE


def test_the_last_member_leaving_empties_the_group_at_a_new_generation() -> None:
    group = new_group()
    ids = stable(group)
    assert group.leave("nobody", None, "alice", 1.0) == (ErrorCode.unknown_member_id, ())
    assert group.leave(ids[0], None, "mallory", 1.0) == (ErrorCode.unknown_member_id, ())
    assert group.leave(ids[0], None, "alice", 1.0)[0] is ErrorCode.none
    assert group.state is S.PREPARING_REBALANCE
    assert group.leave(ids[1], None, "alice", 1.0)[0] is ErrorCode.none
    assert group.state is S.EMPTY and group.generation == 2 and group.protocol_name is None
    assert group.evictable


def test_a_pending_member_id_expires_and_stops_holding_the_rebalance() -> None:
    group = new_group()
    member = joined(group, 0.0)
    assert join(group, request(client="late"), 0.0, BIG).answer == JoinAnswer(
        ErrorCode.member_id_required, "late-2"
    )
    # the first member's join completed at once, before the second asked: a new rebalance
    # waits for the pending id now
    assert join(group, request(member), 1.0, BIG).answer is not None  # Completing: same metadata
    assert group.tick(SESSION) == ()
    assert not group.pending


def test_unloading_answers_every_waiting_request_not_coordinator() -> None:
    group = new_group(replace(LIMITS, initial_rebalance_delay_s=5.0))
    member = joined(group)
    assert answers(group.unload()) == {
        member: JoinAnswer(ErrorCode.not_coordinator, member),
    }
    assert group.state is S.DEAD
    assert join(group, request(), 0.0, BIG).answer == JoinAnswer(
        ErrorCode.coordinator_not_available
    )


def test_an_abandoned_join_removes_its_member_and_the_rebalance_goes_on_without_it() -> None:
    group = new_group()
    ids = stable(group)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    assert join(group, request(follower, protocols=(("range", b"y"),)), 1.0, BIG).answer is None
    assert group.state is S.PREPARING_REBALANCE  # it waits for the leader to rejoin
    assert group.abandon(follower, JoinAnswer, 2.0) == ()  # its connection closed meanwhile
    assert list(group.members) == [leader] and group.state is S.PREPARING_REBALANCE
    # the leader's rejoin completes at once, alone, long before the rebalance timeout
    step = join(group, request(leader), 3.0, BIG)
    assert step.answer is None
    assert join_answers(step)[leader].generation == 2
    assert [m for m, _, _ in join_answers(step)[leader].members] == [leader]


def test_an_abandoned_sync_removes_its_member_and_the_others_join_again() -> None:
    group = new_group()
    ids = stable(group)
    leader = group.leader
    follower = next(m for m in ids if m != leader)
    join(group, request(leader), 1.0, BIG)  # the leader rejoins: a rebalance
    join(group, request(follower), 1.0, BIG)
    assert group.state is S.COMPLETING_REBALANCE and group.generation == 2
    assert group.sync(follower, None, "alice", 2, (None, None), {}, 1.5, BIG).answer is None
    assert group.abandon(follower, SyncAnswer, 2.0) == ()  # nobody else was waiting
    assert list(group.members) == [leader] and group.state is S.PREPARING_REBALANCE
    assert group.sync(leader, None, "alice", 2, (None, None), {}, 2.0, BIG).answer == SyncAnswer(
        ErrorCode.rebalance_in_progress
    )


def test_an_abandoned_join_of_a_static_member_keeps_it_until_it_expires() -> None:
    group = new_group(replace(LIMITS, initial_rebalance_delay_s=1.0))
    first = join(group, request(instance="i-1", client="a"), 0.0, BIG)
    second = join(group, request(instance="i-2", client="b"), 0.0, BIG)
    assert first.answer is second.answer is None
    group.tick(1.0)
    assert group.state is S.COMPLETING_REBALANCE
    group.sync(first.member_id, None, "alice", 1, (None, None), {}, 1.0, BIG)
    assert group.state is S.STABLE
    changed = request(second.member_id, instance="i-2", protocols=(("range", b"new"),))
    assert join(group, changed, 1.5, BIG).answer is None
    assert group.abandon(second.member_id, JoinAnswer, 2.0) == ()
    member = group.members[second.member_id]  # kept: it is meant to come back under i-2
    assert not member.awaiting_join and member.expires_at() == 2.0 + SESSION


# -- commits, static members, bounds ------------------------------------------------------------


def test_commits_without_a_generation_only_while_the_group_has_no_members() -> None:
    group = new_group()
    assert group.check_commit("", None, "bob", -1, 0.0) is ErrorCode.none
    stable(group)
    assert group.check_commit("", None, "bob", -1, 0.0) is ErrorCode.unknown_member_id


def test_a_static_member_back_under_a_new_id_takes_its_place_without_a_rebalance() -> None:
    group = new_group(replace(LIMITS, initial_rebalance_delay_s=1.0))
    first = join(group, request(instance="i-1", client="a"), 0.0, BIG)
    assert first.answer is None and first.member_id == "i-1-1"  # no MEMBER_ID_REQUIRED
    second = join(group, request(instance="i-2", client="b"), 0.0, BIG)
    group.tick(1.0)
    leader = group.leader
    assert leader == "i-1-1" and group.state is S.COMPLETING_REBALANCE
    group.sync(leader, None, "alice", 1, (None, None), {second.member_id: b"B"}, 0.0, BIG)
    back = join(group, request(instance="i-2", client="b"), 1.0, BIG)
    assert back.answer == JoinAnswer(ErrorCode.none, "i-2-3", 1, "consumer", "range", leader)
    assert group.state is S.STABLE and group.members["i-2-3"].assignment == b"B"
    old = second.member_id
    assert group.heartbeat(old, "i-2", "alice", 1, 1.0) is ErrorCode.fenced_instance_id
    assert group.heartbeat("i-2-3", "i-2", "alice", 1, 1.0) is ErrorCode.none
    assert join(group, request(old, instance="i-2"), 1.0, BIG).answer == JoinAnswer(
        ErrorCode.fenced_instance_id, old
    )
    intruder = join(group, request(instance="i-2", principal="mallory"), 1.0, BIG)
    assert intruder.answer == JoinAnswer(ErrorCode.fenced_instance_id)
    assert group.leave("", "i-2", "alice", 2.0)[0] is ErrorCode.none
    assert "i-2" not in group.static and group.state is S.PREPARING_REBALANCE


def test_a_static_leader_back_under_a_new_id_rebalances() -> None:
    group = new_group()
    join(group, request(instance="i-1"), 0.0, BIG)
    leader = group.leader
    assert leader is not None
    group.sync(leader, None, "alice", 1, (None, None), {}, 0.0, BIG)
    back = join(group, request(instance="i-1"), 1.0, BIG)
    assert back.answer is None
    assert join_answers(back)[back.member_id].leader == back.member_id
    assert group.generation == 2


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"session": 0.5}, ErrorCode.invalid_session_timeout),
        ({"session": 1801.0}, ErrorCode.invalid_session_timeout),
        ({"protocols": (("range", b"x" * ((1 << 20) + 1)),)}, ErrorCode.group_max_size_reached),
    ],
)
def test_joins_outside_the_limits(change: dict[str, Any], expected: ErrorCode) -> None:
    group = new_group()
    assert join(group, request(**change), 0.0, BIG).answer == JoinAnswer(expected)


def test_a_full_group_and_a_full_coordinator_refuse_new_members() -> None:
    group = new_group(replace(LIMITS, max_members=2))
    stable(group)
    assert join(group, request(), 1.0, BIG).answer == JoinAnswer(ErrorCode.group_max_size_reached)
    room = new_group()
    refused = join(room, request(protocols=(("range", b"12345"),)), 0.0, 4)
    assert refused.answer == JoinAnswer(ErrorCode.coordinator_not_available)


# -- invariants along random walks --------------------------------------------------------------


class GroupWalk(RuleBasedStateMachine):
    """Random joins, syncs, heartbeats, leaves, connections closing under a waiting request and
    the passing of time; after each step the group's invariants hold and every answer is one a
    waiting request could be given."""

    def __init__(self) -> None:
        super().__init__()
        self.group = new_group(replace(LIMITS, initial_rebalance_delay_s=0.5))
        self.now = 0.0
        self.generation = 0
        self.known: list[str] = []

    def _record(self, step: Step | tuple[Delivery, ...]) -> None:
        for delivery in step.deliveries if isinstance(step, Step) else step:
            answer = delivery.answer
            if isinstance(answer, JoinAnswer) and answer.error is ErrorCode.none:
                assert answer.generation == self.group.generation
                assert answer.member_id in self.group.members
                if answer.member_id == self.group.leader:
                    assert {m for m, _, _ in answer.members} == set(self.group.members)

    @rule(
        protocols=st.sampled_from([(("range", b"a"),), (("range", b"b"), ("rr", b""))]),
        at_once=st.booleans(),
    )
    def new_member(self, protocols: tuple[tuple[str, bytes], ...], at_once: bool) -> None:
        step = join(self.group, request(protocols=protocols), self.now, BIG)
        if step.answer is not None and step.answer.error is ErrorCode.member_id_required:
            self.known.append(step.member_id)
            if at_once:  # the client's second join, with its id
                step = join(self.group, request(step.member_id, protocols=protocols), self.now, BIG)
        self._record(step)

    @rule(pick=st.integers(0, 20), data=st.sampled_from([b"a", b"a", b"a", b"b"]))
    def rejoin(self, pick: int, data: bytes) -> None:
        if self.known:
            member_id = self.known[pick % len(self.known)]
            self._record(
                join(self.group, request(member_id, protocols=(("range", data),)), self.now, BIG)
            )

    @rule(pick=st.integers(0, 20))
    def sync(self, pick: int) -> None:
        if self.known:
            member_id = self.known[pick % len(self.known)]
            assignment = {m: m.encode() for m in self.group.members}
            step = self.group.sync(
                member_id, None, "alice", self.group.generation, (None, None), assignment,
                self.now, BIG,
            )  # fmt: skip
            self._record(step)

    @rule()
    def leader_assigns(self) -> None:
        leader = self.group.leader
        if leader is not None:
            assignment = {m: m.encode() for m in self.group.members}
            step = self.group.sync(
                leader, None, "alice", self.group.generation, (None, None), assignment,
                self.now, BIG,
            )  # fmt: skip
            self._record(step)

    @rule(pick=st.integers(0, 20))
    def heartbeat(self, pick: int) -> None:
        if self.known:
            member_id = self.known[pick % len(self.known)]
            self.group.heartbeat(member_id, None, "alice", self.group.generation, self.now)

    @rule(pick=st.integers(0, 20))
    def leave(self, pick: int) -> None:
        if self.known:
            member_id = self.known[pick % len(self.known)]
            self._record(self.group.leave(member_id, None, "alice", self.now)[1])

    @rule(pick=st.integers(0, 20))
    def connection_closes(self, pick: int) -> None:
        waiting = [
            (m.member_id, JoinAnswer if m.awaiting_join else SyncAnswer)
            for m in self.group.members.values()
            if m.awaiting_join or m.awaiting_sync
        ]
        if waiting:
            member_id, kind = waiting[pick % len(waiting)]
            self._record(self.group.abandon(member_id, kind, self.now))
            assert member_id not in self.group.members  # a dynamic member leaves at once

    @rule(seconds=st.sampled_from([0.1, 0.5, 3.0, 11.0, 31.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._record(self.group.tick(self.now))

    @invariant()
    def holds(self) -> None:
        group = self.group
        assert group.generation >= self.generation
        self.generation = group.generation
        if group.state is S.EMPTY:
            assert not group.members and group.protocol_name is None
        if group.state in (S.COMPLETING_REBALANCE, S.STABLE):
            assert group.leader in group.members and group.protocol_name is not None
        for member in group.members.values():
            assert not member.awaiting_join or group.state is S.PREPARING_REBALANCE
            assert not member.awaiting_sync or group.state is S.COMPLETING_REBALANCE
        assert set(group.static.values()) <= set(group.members)
        deadline = group.next_deadline(self.now)
        assert deadline is None or deadline > self.now
        if group.state is S.PREPARING_REBALANCE:
            assert deadline is not None  # a rebalance always ends


GroupWalk.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_group_walks = GroupWalk.TestCase
