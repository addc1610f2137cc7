"""The consumer-group changes of a cluster as pure functions (``tidelog/cluster/groups.py``):
who coordinates a new group, how joins, leaves and a new coordinator change the record."""

from __future__ import annotations

import pytest

from tidelog.cluster.groups import joined, pick_coordinator, recoordinated, without
from tidelog.cluster.metadata import ClusterView, GroupRecord, StreamRecord
from tidelog.errors import NotEnoughReplicas, StreamNotFound


def view(*brokers: str, streams: dict[str, int] | None = None) -> ClusterView:
    found = ClusterView(brokers={b: f"127.0.0.1:{9300 + i}" for i, b in enumerate(brokers)})
    for name, partitions in (streams or {"s": 4}).items():
        found.streams[name] = StreamRecord({"partitions": partitions})
    return found


def test_a_new_group_is_coordinated_by_the_least_loaded_live_broker() -> None:
    cluster = view("b1", "b2", "b3")
    cluster.groups["a"] = GroupRecord("b1", 1, {"c": ("s",)}, {})
    cluster.groups["b"] = GroupRecord("b2", 1, {"c": ("s",)}, {})
    cluster.groups["gone"] = GroupRecord("b9", 1, {"c": ("s",)}, {})  # not a live broker
    assert pick_coordinator(cluster) == "b3"
    assert pick_coordinator(cluster, avoid="b3") == "b1"
    assert pick_coordinator(view("b1"), avoid="b1") == "b1", "the only one, even if avoided"
    with pytest.raises(NotEnoughReplicas):
        pick_coordinator(view())


def test_joins_raise_the_epoch_and_share_the_partitions() -> None:
    cluster = view("b1", "b2", streams={"s": 4, "t": 1})
    first = joined(None, "c1", ("s",), cluster)
    assert (first.coordinator, first.epoch) == ("b1", 1)
    assert first.assignments == {"c1": {"s": (0, 1, 2, 3)}}
    second = joined(first, "c2", ("s", "t"), cluster)
    assert (second.coordinator, second.epoch) == ("b1", 2)
    assert second.assignments == {"c1": {"s": (0, 2)}, "c2": {"s": (1, 3), "t": (0,)}}
    assert joined(second, "c2", ("s", "t"), cluster) is second, "the same join changes nothing"
    moved = joined(second, "c2", ("t",), cluster)
    assert moved.epoch == 3 and moved.assignments["c2"] == {"t": (0,)}
    with pytest.raises(StreamNotFound):
        joined(None, "c1", ("nowhere",), cluster)


def test_leaving_reassigns_and_the_last_leave_deletes() -> None:
    cluster = view("b1")
    group = joined(joined(None, "c1", ("s",), cluster), "c2", ("s",), cluster)
    left = without(group, {"c2"}, cluster)
    assert left is not None and left.epoch == 3
    assert left.assignments == {"c1": {"s": (0, 1, 2, 3)}}
    assert without(left, {"c1"}, cluster) is None


def test_a_new_coordinator_keeps_members_and_assignments() -> None:
    cluster = view("b1", "b2")
    group = joined(None, "c1", ("s",), cluster)
    moved = recoordinated(group, "b2")
    assert (moved.coordinator, moved.epoch) == ("b2", group.epoch + 1)
    assert (moved.members, moved.assignments) == (group.members, group.assignments)
    assert GroupRecord.from_json(moved.to_json()) == moved


def test_owners_are_bound_by_joins_and_kept_by_every_change() -> None:
    cluster = view("b1", "b2")
    group = joined(joined(None, "c1", ("s",), cluster, "alice"), "c2", ("s",), cluster)
    assert group.owners == {"c1": "alice"}
    bound = joined(group, "c2", ("s",), cluster, "bob")  # owned by nobody: bound, epoch kept
    assert (bound.owners, bound.epoch) == ({"c1": "alice", "c2": "bob"}, group.epoch)
    assert joined(bound, "c2", ("s",), cluster, "bob") is bound
    assert recoordinated(bound, "b2").owners == bound.owners
    left = without(bound, {"c2"}, cluster)
    assert left is not None and left.owners == {"c1": "alice"}
    assert GroupRecord.from_json(left.to_json()) == left
