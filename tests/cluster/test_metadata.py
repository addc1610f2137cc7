"""Cluster metadata on a real etcd (``tidelog/cluster/metadata.py``): membership that ends with
a broker's lease (its record with a Kafka address or without), one controller at a time,
partition changes as compare-and-set on the partition epoch, raced, and streams larger than one
etcd transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.etcd import running_etcd

from tidelog.cluster.etcd_client import endpoint
from tidelog.cluster.metadata import (
    GroupRecord,
    Metadata,
    PartitionState,
    StreamRecord,
    member_record,
)
from tidelog.errors import MetadataUnavailable


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as url:
        yield url


def test_a_broker_is_a_member_while_its_lease_lives(etcd: str) -> None:
    async def main() -> None:
        async with Metadata.connect(etcd, "members") as meta:
            one = await meta.register("b1", "127.0.0.1:9301", ttl_s=2)
            two = await meta.register("b2", "127.0.0.1:9302", ttl_s=2)
            assert await meta.brokers() == {"b1": "127.0.0.1:9301", "b2": "127.0.0.1:9302"}
            with pytest.raises(ValueError, match="held by a live broker"):
                await meta.register("b1", "127.0.0.1:9309")
            await asyncio.sleep(3)  # refreshed: still members after their time to live
            assert set(await meta.brokers()) == {"b1", "b2"}
            await one.close()  # leaving revokes at once
            assert set(await meta.brokers()) == {"b2"}
            await two.lapse()  # a killed broker: gone once its lease expires
            deadline = time.monotonic() + 10
            while await meta.brokers():
                assert time.monotonic() < deadline, "the lapsed lease did not expire"
                await asyncio.sleep(0.2)

    asyncio.run(main())


def test_a_member_record_carries_its_kafka_address_and_older_records_read_without(
    etcd: str,
) -> None:
    async def main() -> None:
        async with Metadata.connect(etcd, "kafka-members") as meta:
            with_kafka = await meta.register("b1", "127.0.0.1:9301", 2, kafka="127.0.0.1:9092")
            without = await meta.register("b2", "127.0.0.1:9302", 2)
            # As a broker from before Kafka listeners wrote it: the address alone.
            assert member_record("127.0.0.1:9302") == b'{"address": "127.0.0.1:9302"}'
            view = await meta.view()
            assert view.brokers == {"b1": "127.0.0.1:9301", "b2": "127.0.0.1:9302"}
            assert view.kafka == {"b1": "127.0.0.1:9092"}
            assert await meta.brokers() == view.brokers
            await with_kafka.close()
            await without.close()
            assert (await meta.view()).kafka == {}

    asyncio.run(main())


def test_one_controller_at_a_time_and_the_next_after_it_dies(etcd: str) -> None:
    async def main() -> None:
        async with Metadata.connect(etcd, "election") as meta:
            one = await meta.register("b1", "h:1", ttl_s=2)
            two = await meta.register("b2", "h:2", ttl_s=2)
            results = await asyncio.gather(meta.campaign("b1", one), meta.campaign("b2", two))
            assert sorted(results) == [False, True]
            winner = await meta.controller()
            assert winner in ("b1", "b2")
            assert await meta.campaign(winner, one if winner == "b1" else two)  # already it
            await (one if winner == "b1" else two).close()
            other = "b2" if winner == "b1" else "b1"
            assert await meta.campaign(other, two if winner == "b1" else one)
            assert await meta.controller() == other
            await (two if winner == "b1" else one).close()
            assert await meta.controller() is None

    asyncio.run(main())


def test_partition_changes_are_compare_and_set_on_the_epoch(etcd: str) -> None:
    first = PartitionState(("b1", "b2", "b3"), "b1", ("b1", "b2", "b3"))

    async def main() -> None:
        async with Metadata.connect(etcd, "cas") as meta:
            assert await meta.create_partition("orders", 0, first)
            assert not await meta.create_partition("orders", 0, first)
            shrunk = PartitionState(first.replicas, "b1", ("b1", "b2"))
            written = await meta.update_partition("orders", 0, 0, shrunk)
            assert written is not None and written.partition_epoch == 1
            assert await meta.update_partition("orders", 0, 0, first) is None, "a stale epoch"
            assert await meta.update_partition("nowhere", 0, 0, first) is None
            assert await meta.partitions("orders") == {0: written}

            # Racers each read the state and try to move it on from the epoch they saw: for
            # every epoch exactly one wins, whatever the interleaving.
            async def racer(name: str) -> int:
                wins = 0
                for _ in range(20):
                    seen = await meta.partition("orders", 0)
                    assert seen is not None
                    mine = PartitionState(seen.replicas, name, seen.isr, 0, seen.leader_epoch + 1)
                    if await meta.update_partition("orders", 0, seen.partition_epoch, mine):
                        wins += 1
                return wins

            wins = await asyncio.gather(*(racer(f"b{i}") for i in range(1, 4)))
            final = await meta.partition("orders", 0)
            assert final is not None
            assert final.partition_epoch == 1 + sum(wins), "no lost update, no double win"
            assert final.leader_epoch == sum(wins)

    asyncio.run(main())


def test_group_changes_are_compare_and_set_on_the_revision(etcd: str) -> None:
    def record(epoch: int, *members: str) -> GroupRecord:
        return GroupRecord("b1", epoch, {m: ("s",) for m in members}, {})

    async def main() -> None:
        async with Metadata.connect(etcd, "groups") as meta:
            assert (await meta.group("g"))[:2] == (None, 0)
            assert await meta.replace_group("g", 0, record(1, "c1"))
            assert not await meta.replace_group("g", 0, record(1, "c2")), "it exists already"
            found, revision, read_at = await meta.group("g")
            assert found == record(1, "c1") and read_at >= revision
            assert await meta.replace_group("g", revision, record(2, "c1", "c2"))
            assert not await meta.replace_group("g", revision, None), "a stale revision"
            assert (await meta.view()).groups == {"g": record(2, "c1", "c2")}

            # Racers add themselves from what they read: none is lost.
            async def racer(name: str) -> None:
                while True:
                    seen, at, _ = await meta.group("g")
                    assert seen is not None
                    mine = record(seen.epoch + 1, *seen.members, name)
                    if await meta.replace_group("g", at, mine):
                        return

            await asyncio.gather(*(racer(f"r{i}") for i in range(8)))
            final, revision, _ = await meta.group("g")
            assert final is not None and final.epoch == 10
            assert set(final.members) == {"c1", "c2"} | {f"r{i}" for i in range(8)}
            assert await meta.replace_group("g", revision, None)  # the last leave deletes it
            assert (await meta.group("g"))[:2] == (None, 0)

    asyncio.run(main())


def test_an_unreachable_etcd_is_a_clear_error(tmp_path: Path) -> None:
    with running_etcd(tmp_path / "gone") as url:
        pass  # stopped: nothing listens there now

    async def main() -> None:
        with pytest.raises(MetadataUnavailable, match="cannot be reached"):
            async with Metadata.connect(url, "x") as meta:
                await meta.brokers()

    asyncio.run(main())
    assert endpoint("127.0.0.1:2379") == ("127.0.0.1", 2379, False)
    assert endpoint("https://etcd:2380") == ("etcd", 2380, True)
    with pytest.raises(ValueError, match="HOST:PORT"):
        endpoint("https://")


def _states(count: int, leader: str = "b1") -> list[PartitionState]:
    return [PartitionState((leader,), leader, (leader,)) for _ in range(count)]


def test_a_stream_larger_than_one_transaction_is_created_whole_or_not_seen(etcd: str) -> None:
    # etcd refuses a transaction of more than 128 operations: 300 partitions take several.
    records = [StreamRecord({"partitions": 300})] * 2 + [StreamRecord({"partitions": 1})]

    async def main() -> None:
        async with Metadata.connect(etcd, "large") as meta:
            results = await asyncio.gather(
                meta.create_stream("wide", records[0], _states(300, "b1")),
                meta.create_stream("wide", records[1], _states(300, "b2")),
                meta.create_stream("wide", records[2], _states(1, "b3")),
            )
            assert sorted(results) == [False, False, True], "one creator wins the name"
            winner = results.index(True)
            view = await meta.view()
            assert view.streams["wide"] == records[winner]
            mine = {n: state for (name, n), state in view.partitions.items() if name == "wide"}
            assert sorted(mine) == list(range(records[winner].config["partitions"]))
            assert {state.leader for state in mine.values()} == {f"b{winner + 1}"}, (
                "the winner's partitions only"
            )
            assert not await meta.create_stream("wide", records[0], _states(300))

            assert await meta.create_stream("flags", records[0], _states(300))
            assert await meta.set_readonly("flags", list(range(300)), True)
            assert len((await meta.view()).readonly) == 300
            assert await meta.set_readonly("flags", list(range(300)), False)
            assert not (await meta.view()).readonly
            assert not await meta.set_readonly("nowhere", list(range(300)), True)

    asyncio.run(main())


def test_a_dead_creators_partitions_are_unseen_and_replaced(etcd: str) -> None:
    async def main() -> None:
        async with Metadata.connect(etcd, "dead") as meta:
            # What a creator killed part way leaves: its claim, under a lease that will not be
            # refreshed again, and some partitions, without the stream's key.
            client = meta._client
            lease = await client.lease(1)
            await client.put(meta._key("creating", "wide"), b"dead", lease)
            for n in (0, 1, 250):
                state = PartitionState(("b9",), "b9", ("b9",))
                await meta.create_partition("wide", n, state)
            assert not [k for k in (await meta.view()).partitions if k[0] == "wide"]
            record = StreamRecord({"partitions": 200})
            assert not await meta.create_stream("wide", record, _states(200)), "claimed"
            deadline = time.monotonic() + 10
            while not await meta.create_stream("wide", record, _states(200)):
                assert time.monotonic() < deadline, "the dead creator's claim never expired"
                await asyncio.sleep(0.3)
            view = await meta.view()
            assert view.streams["wide"] == record
            mine = {n: state for (name, n), state in view.partitions.items() if name == "wide"}
            assert sorted(mine) == list(range(200)), "the dead creator's partition 250 is gone"
            assert {state.leader for state in mine.values()} == {"b1"}
            assert await meta.delete_stream("wide")
            assert await meta.partitions("wide") == {}
            assert not await meta.delete_stream("wide")

            # Left by a dead creator, then a small stream of the name: written in steps too,
            # so the leftovers go first.
            for n in (0, 1, 250):
                await meta.create_partition("small", n, PartitionState(("b9",), "b9", ("b9",)))
            assert await meta.create_stream("small", StreamRecord({"partitions": 2}), _states(2))
            view = await meta.view()
            assert sorted(n for (name, n) in view.partitions if name == "small") == [0, 1]
            assert {view.partitions["small", n].leader for n in (0, 1)} == {"b1"}

    asyncio.run(main())


def test_a_delete_leaves_a_creation_under_way_alone(etcd: str) -> None:
    async def main() -> None:
        async with Metadata.connect(etcd, "racing") as meta:
            # A creator in steps holds the claim and has written some partitions; a delete of
            # the name must not remove them, or the stream would be completed without them.
            lease = await meta._client.lease(5)
            await meta._client.put(meta._key("creating", "wide"), b"creator", lease)
            for n in range(3):
                await meta.create_partition("wide", n, PartitionState(("b1",), "b1", ("b1",)))
            assert not await meta.delete_stream("wide")
            assert sorted(await meta.partitions("wide")) == [0, 1, 2]
            await lease.revoke()

    asyncio.run(main())
