"""The controller's decisions (``tidelog/cluster/placement.py``): placement with balanced
leaders, elections only from the ISR, ISR shrink and expand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.cluster.metadata import PartitionState
from tidelog.cluster.placement import (
    EVERY_BROKER,
    align,
    colocated,
    elect,
    expand_isr,
    follow_anchor,
    place,
    shrink_isr,
    widen,
)
from tidelog.errors import InvalidArgument


def test_placement_spreads_leaders_and_replicas() -> None:
    states = place(6, 3, ["b3", "b1", "b2"])
    assert [s.leader for s in states] == ["b1", "b2", "b3", "b1", "b2", "b3"]
    assert states[1].replicas == ("b2", "b3", "b1") == states[1].isr
    assert place(2, EVERY_BROKER, ["a", "b"])[0].replicas == ("a", "b")
    # brokers leading partitions already get new ones last
    assert [s.leader for s in place(2, 1, ["a", "b", "c"], {"a": 3, "b": 1})] == ["c", "b"]


@pytest.mark.parametrize("factor", [0, 4, -2])
def test_a_replication_factor_the_live_brokers_cannot_hold_is_refused(factor: int) -> None:
    with pytest.raises(InvalidArgument, match="live brokers"):
        place(1, factor, ["a", "b", "c"])
    with pytest.raises(InvalidArgument, match="no live broker"):
        place(1, 1, [])


@given(
    st.integers(1, 24),
    st.integers(1, 5),
    st.sets(st.sampled_from([f"b{i}" for i in range(7)]), min_size=1),
)
def test_placement_invariants(partitions: int, factor: int, brokers: set[str]) -> None:
    factor = min(factor, len(brokers))
    states = place(partitions, factor, sorted(brokers))
    leads = {b: sum(s.leader == b for s in states) for b in brokers}
    assert max(leads.values()) - min(leads.values()) <= 1
    for state in states:
        assert len(set(state.replicas)) == factor and state.replicas[0] == state.leader
        assert state.isr == state.replicas


def test_an_election_picks_the_first_live_isr_member_and_never_an_outsider() -> None:
    state = PartitionState(("a", "b", "c"), "a", ("a", "c"), partition_epoch=4, leader_epoch=2)
    assert elect(state, {"a", "b", "c"}) is None  # the leader lives: nothing to do
    moved = elect(state, {"b", "c"})
    assert moved is not None
    assert (moved.leader, moved.isr, moved.leader_epoch) == ("c", ("c",), 3)
    # b is live but outside the ISR: it may lack acknowledged records
    assert elect(state, {"b"}) is None


def test_isr_shrinks_without_the_leader_and_expands_in_replica_order() -> None:
    state = PartitionState(("a", "b", "c"), "b", ("a", "b", "c"))
    shrunk = shrink_isr(state, {"a", "b"})
    assert shrunk is not None and shrunk.isr == ("b", "c")
    assert shrink_isr(shrunk, {"x"}) is None
    grown = expand_isr(shrunk, "a")
    assert grown is not None and grown.isr == ("a", "b", "c")
    assert expand_isr(grown, "a") is None and expand_isr(grown, "z") is None


def test_a_colocated_stream_lives_and_leads_with_its_anchor() -> None:
    anchor = PartitionState(("b1", "b2", "b3"), "b2", ("b2", "b3"), leader_epoch=4)
    (state,) = colocated(1, anchor)
    assert state.leader == "b2" and state.replicas == ("b2", "b1", "b3")
    assert state.isr == ("b2", "b3"), "not b1, out of the anchor's ISR"
    live = {"b1", "b2", "b3"}
    # The anchor's leader takes over once in the ISR, with a new leader epoch...
    apart = PartitionState(("b1", "b2", "b3"), "b1", ("b1", "b2"), leader_epoch=7)
    moved = follow_anchor(apart, anchor, live)
    assert moved is not None and moved.leader == "b2" and moved.leader_epoch == 8
    assert moved.isr == apart.isr and moved.replicas == apart.replicas
    # ...and not before it is in sync, nor when dead, nor twice, nor during a reassignment.
    assert follow_anchor(PartitionState(apart.replicas, "b1", ("b1", "b3")), anchor, live) is None
    assert follow_anchor(apart, anchor, {"b1", "b3"}) is None
    assert follow_anchor(moved, anchor, live) is None
    moving = PartitionState(apart.replicas, "b1", apart.isr, target=("b1", "b2"))
    assert follow_anchor(moving, anchor, live) is None
    with pytest.raises(InvalidArgument):
        colocated(1, PartitionState((), "", ()))


def test_an_internal_stream_placed_on_too_few_brokers_widens_when_more_are_live() -> None:
    lone = PartitionState(("b1",), "b1", ("b1",), partition_epoch=3)
    wider = widen(lone, 3, {"b1", "b2", "b3", "b4"}, ["b1", "b3", "b2", "b4"])
    assert wider is not None
    assert wider.target == ("b1", "b3", "b2") and wider.replicas == ("b1", "b3", "b2")
    assert wider.isr == ("b1",) and wider.leader == "b1", "the new ones join once caught up"
    assert widen(lone, 3, {"b1"}, ["b1"]) is None, "nobody to add"
    assert widen(wider, 3, {"b1", "b2", "b3"}, ["b2"]) is None, "moving already"
    full = PartitionState(("b1", "b2", "b3"), "b1", ("b1",))
    assert widen(full, 3, {"b1", "b2", "b3", "b4"}, ["b4"]) is None, "enough replicas"
    down = PartitionState(("b1", "b2"), "b1", ("b1",))
    assert widen(down, 3, {"b1", "b3"}, ["b3"]) is None, "never while a replica is down"


def test_a_colocated_stream_moves_to_its_anchors_replicas() -> None:
    live = {"b1", "b2", "b3", "b4"}
    anchor = PartitionState(("b1", "b2", "b4"), "b1", ("b1", "b2", "b4"))  # b3 replaced by b4
    state = PartitionState(("b1", "b2", "b3"), "b1", ("b1", "b2"))
    moving = align(state, anchor, live - {"b3"})
    assert moving is not None and moving.target == ("b1", "b2", "b4")
    assert align(moving, anchor, live) is None, "moving already"
    assert (
        align(state, PartitionState(anchor.replicas, "b1", ("b1",), target=("b1",)), live) is None
    )
    assert align(state, anchor, {"b1", "b2"}) is None, "an anchor replica is down"
    same = PartitionState(("b4", "b2", "b1"), "b2", ("b2",))
    assert align(same, anchor, live) is None, "the same brokers"
