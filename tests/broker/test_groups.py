"""Consumer groups: balanced assignments, epochs, expiry, and fencing of stale subscribers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StartPosition, StreamConfig, SubscribeRequest
from tidelog.broker.groups import GroupCoordinator
from tidelog.errors import FailedPrecondition, Fenced, GroupNotFound, InvalidArgument


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def coordinator(clock: Clock, partitions: dict[str, int]) -> GroupCoordinator:
    return GroupCoordinator(lambda s: partitions[s], consumer_timeout_s=10, clock=clock)


def test_assignments_are_balanced_and_change_with_membership() -> None:
    clock = Clock()
    groups = coordinator(clock, {"a": 4, "b": 3})
    e1 = groups.join("g", "c1", ["a", "b"])
    assert groups.fetch_assignments("g", "c1", e1) == (e1, {"a": [0, 1, 2, 3], "b": [0, 1, 2]})
    e2 = groups.join("g", "c2", ["a", "b"])
    assert e2 > e1
    _, one = groups.fetch_assignments("g", "c1", e2)
    _, two = groups.fetch_assignments("g", "c2", e2)
    for stream, count in (("a", 4), ("b", 3)):
        assert sorted(one.get(stream, []) + two.get(stream, [])) == list(range(count))
    total = [sum(map(len, x.values())) for x in (one, two)]
    assert abs(total[0] - total[1]) <= 1
    with pytest.raises(FailedPrecondition):
        groups.fetch_assignments("g", "c1", e1)  # a stale epoch
    groups.leave("g", "c2")
    _, alone = groups.fetch_assignments("g", "c1", groups.groups["g"].epoch)
    assert alone == {"a": [0, 1, 2, 3], "b": [0, 1, 2]}
    groups.leave("g", "c1")
    assert "g" not in groups.groups  # the last member left
    with pytest.raises(GroupNotFound):
        groups.fetch_assignments("g", "c1", 0)


def test_silent_members_expire() -> None:
    clock = Clock()
    groups = coordinator(clock, {"a": 2})
    groups.join("g", "c1", ["a"])
    epoch = groups.join("g", "c2", ["a"])
    refreshed = 0
    for _ in range(3):
        clock.now += 6
        try:
            groups.fetch_assignments("g", "c1", epoch)  # c1's heartbeat; c2 stays silent
        except FailedPrecondition:  # c2 expired: the epoch moved; refresh as a client does
            refreshed += 1
            epoch = groups.groups["g"].epoch
            groups.fetch_assignments("g", "c1", epoch)
    assert refreshed == 1
    assert set(groups.groups["g"].members) == {"c1"}
    assert groups.fetch_assignments("g", "c1", epoch)[1] == {"a": [0, 1]}


def test_joins_are_checked() -> None:
    groups = coordinator(Clock(), {"a": 1})
    with pytest.raises(InvalidArgument):
        groups.join("", "c", ["a"])
    with pytest.raises(InvalidArgument):
        groups.join("g", "c", [])
    with pytest.raises(KeyError):
        groups.join("g", "c", ["missing"])  # the broker's lookup raises StreamNotFound


def test_a_newer_subscriber_fences_the_older_and_an_older_is_refused(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            await broker.publish("s", 0, [b"x"])
            await broker.publish("s", 1, [b"x"])
            epoch = broker.groups.join("g", "c1", ["s"])  # c1 alone: both partitions
            request = SubscribeRequest(start=StartPosition.EARLIEST)
            firsts = [broker.subscribe("s", p, request, group=("g", "c1", epoch)) for p in (0, 1)]
            newer = broker.groups.join("g", "c2", ["s"])
            (moved,) = broker.groups.fetch_assignments("g", "c2", newer)[1]["s"]
            batches = firsts[moved].batches()
            assert len(await anext(batches)) == 1
            # c2, assigned the partition at the newer epoch, takes it from c1.
            second = broker.subscribe("s", moved, request, group=("g", "c2", newer))
            with pytest.raises(Fenced):
                await asyncio.wait_for(anext(batches), 5)
            with pytest.raises(FailedPrecondition):
                broker.subscribe("s", moved, request, group=("g", "c1", epoch))  # stale epoch
            await second.batches().aclose()
            await firsts[1 - moved].batches().aclose()

    asyncio.run(body())


def test_a_group_subscriber_of_a_partition_not_assigned_to_it_is_refused_and_fences_nobody(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            await broker.publish("s", 0, [b"x"])
            await broker.publish("s", 1, [b"y"])
            broker.groups.join("g", "c1", ["s"])
            epoch = broker.groups.join("g", "c2", ["s"])
            owners = {
                c: broker.groups.fetch_assignments("g", c, epoch)[1]["s"] for c in ("c1", "c2")
            }
            mine, theirs = owners["c1"][0], owners["c2"][0]
            request = SubscribeRequest(start=StartPosition.EARLIEST)
            owner = broker.subscribe("s", theirs, request, group=("g", "c2", epoch))
            batches = owner.batches()
            assert len(await anext(batches)) == 1
            with pytest.raises(FailedPrecondition, match=f"partition {theirs} of 's' is not"):
                broker.subscribe("s", theirs, request, group=("g", "c1", epoch))
            assert mine != theirs
            await broker.publish("s", theirs, [b"z"])
            assert len(await asyncio.wait_for(anext(batches), 5)) == 1, "c2 is not fenced"
            await batches.aclose()

    asyncio.run(body())
