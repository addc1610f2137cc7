"""A broker's mirror of the cluster's consumer groups (``ClusterGroups``), against a stand-in
for the node and its etcd: a metadata read that started before this broker's own write must
never take the mirror back, and heartbeats decide expiry on the record being changed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from tidelog.broker import GroupCoordinator
from tidelog.cluster.groups import ClusterGroups
from tidelog.cluster.metadata import ClusterView, GroupRecord, StreamRecord
from tidelog.errors import FailedPrecondition


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeMetadata:
    """One group in a dict, with etcd-like revisions."""

    record: GroupRecord | None = None
    revision: int = 1
    changed_at: int = 0

    async def group(self, group_id: str) -> tuple[GroupRecord | None, int, int]:
        return self.record, self.changed_at, self.revision

    async def replace_group(self, group_id: str, revision: int, record: GroupRecord | None) -> int:
        if revision != self.changed_at:
            return 0
        self.revision += 1
        self.record, self.changed_at = record, self.revision
        return self.revision


@dataclass
class FakeBroker:
    groups: GroupCoordinator


@dataclass
class FakeNode:
    broker: FakeBroker
    metadata: FakeMetadata
    broker_id: str = "b1"
    member: bool = True
    view: ClusterView = field(default_factory=ClusterView)


def record(epoch: int, *members: str) -> GroupRecord:
    return GroupRecord("b1", epoch, {m: ("s",) for m in members}, {m: {} for m in members})


def make(clock: Clock) -> tuple[ClusterGroups, FakeNode]:
    coordinator = GroupCoordinator(lambda _: 2, consumer_timeout_s=10, clock=clock)
    node = FakeNode(FakeBroker(coordinator), FakeMetadata())
    node.view.brokers["b1"] = "127.0.0.1:1"
    node.view.streams["s"] = StreamRecord({"partitions": 2})
    return ClusterGroups(node, clock=clock), node  # type: ignore[arg-type]


def test_an_older_read_never_takes_the_mirror_back() -> None:
    groups, node = make(Clock())
    node.metadata.record, node.metadata.changed_at, node.metadata.revision = (
        record(2, "a", "b"),
        7,
        7,
    )
    asyncio.run(groups.refresh("g"))
    stale = ClusterView(revision=5, brokers=node.view.brokers, streams=node.view.streams)
    stale.groups["g"] = record(1, "a")  # read before "b" joined
    node.view = stale  # as the node's step does with each read ...
    groups.follow(stale)  # ... and then hands it to the groups
    assert groups.mirror.groups["g"].epoch == 2
    assert set(groups.mirror.groups["g"].members) == {"a", "b"}
    with pytest.raises(FailedPrecondition, match="epoch 2, not 1"):
        asyncio.run(groups.fetch_assignments("g", "a", 1))
    assert asyncio.run(groups.fetch_assignments("g", "b", 2))[0] == 2
    newer = ClusterView(revision=9, brokers=node.view.brokers, streams=node.view.streams)
    groups.follow(newer)  # the group is gone as of revision 9
    assert "g" not in groups.mirror.groups


def test_expiry_spares_a_member_that_called_meanwhile() -> None:
    clock = Clock()
    groups, node = make(clock)
    node.metadata.record, node.metadata.changed_at, node.metadata.revision = (
        record(1, "a", "b"),
        3,
        3,
    )
    asyncio.run(groups.refresh("g"))
    node.view.groups["g"] = record(1, "a", "b")
    clock.now = 11.0  # both silent for longer than the 10 s timeout ...
    asyncio.run(groups.fetch_assignments("g", "a", 1))  # ... but "a" calls just before expiry
    asyncio.run(groups.expire())
    assert node.metadata.record is not None
    assert set(node.metadata.record.members) == {"a"}
    assert node.metadata.record.epoch == 2
    clock.now = 15.0
    asyncio.run(groups.expire())  # nobody silent: nothing written
    assert node.metadata.record.epoch == 2
