"""ISR replication of one partition between two brokers in one process
(``tidelog/cluster/replication.py``): a follower's log becomes the leader's, byte for byte; the
high watermark is the smallest ISR log end; a stale epoch is refused; and the KIP-101 cases end
to end on real logs - a deposed leader's divergent tail is cut when it follows the new leader,
and a restarted follower keeps acknowledged records above its high watermark."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker, NewRecord, Partition
from tidelog.cluster.metadata import ClusterView
from tidelog.cluster.replication import (
    FollowerReplica,
    LeaderReplica,
    record_crc,
)
from tidelog.cluster.roles import PartitionRole, Undecided
from tidelog.errors import NotEnoughReplicas, NotLeader, StaleEpoch, StreamNotFound


def stand_in_node(broker_id: str, ack_timeout_s: float = 5.0) -> SimpleNamespace:
    """What a PartitionRole reads of its node: the ack timeout, its id, membership, the view."""
    return SimpleNamespace(
        settings=SimpleNamespace(ack_timeout_s=ack_timeout_s),
        broker_id=broker_id,
        member=True,
        view=ClusterView(),
    )


@asynccontextmanager
async def replicas(root: Path, *names: str) -> AsyncIterator[dict[str, Partition]]:
    """Partition 0 of stream ``s`` on one broker per name, each in its own data directory."""
    brokers: dict[str, Broker] = {}
    contexts = []
    try:
        for name in names:
            context = running(broker_config(root / name))
            contexts.append(context)
            brokers[name] = await context.__aenter__()
        yield {
            name: (broker.find_stream("s") or broker.create_stream("s")).partitions[0]
            for name, broker in brokers.items()
        }
    finally:
        for context in reversed(contexts):
            await context.__aexit__(None, None, None)


def contents(partition: Partition) -> list[tuple[int, int, bytes, bytes | None, dict[str, bytes]]]:
    log = partition.log
    found = []
    for batch in log.forward_reader(0, past_limit=True):  # the replica's whole log
        for record in batch.records():
            found.append(
                (record.offset, record.timestamp, record.value, record.key, dict(record.headers))
            )
    return found


async def publish(partition: Partition, *values: bytes) -> None:
    await partition.publish([NewRecord(v, key=b"k" + v, headers={"h": v}) for v in values])


def catch_up(leader: LeaderReplica, follower: FollowerReplica, name: str) -> None:
    """Fetch until the follower has everything and has told the leader so."""
    next_offset = follower.partition.log.next_offset
    for _ in range(100):
        answer = leader.fetch(
            name,
            follower.leader_epoch,
            next_offset,
            max_records=3,
            previous_crc=follower.last_crc,
        )
        next_offset = follower.apply(answer)
        if (
            not answer.records
            and not answer.diverged
            and next_offset > leader.partition.log.committed_offset
        ):
            return
    raise AssertionError("the follower did not catch up in 100 fetches")


def test_a_follower_becomes_the_leaders_copy_and_the_high_watermark_follows_the_isr(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b", "c") as parts:
            leader = LeaderReplica(parts["a"], "a", leader_epoch=1, isr=["a", "b", "c"])
            b, c = FollowerReplica(parts["b"], "b"), FollowerReplica(parts["c"], "c")
            for follower in (b, c):
                assert follower.follow(1, leader.end_offset_for) == 0
            for i in range(4):
                await publish(parts["a"], *(b"v%d-%d" % (i, j) for j in range(5)))
            assert leader.high_watermark == -1, "nobody else has anything yet"
            catch_up(leader, b, "b")
            assert contents(parts["b"]) == contents(parts["a"])
            assert leader.high_watermark == -1, "c has nothing: not committed"
            assert parts["a"].log.high_watermark == -1, "readers of the leader see nothing yet"
            leader.fetch("c", 1, 12)  # c says it holds 0..11 (it fetched them elsewhere)
            assert leader.high_watermark == 11
            catch_up(leader, c, "c")
            assert leader.high_watermark == 19
            leader.fetch("b", 1, 20)
            assert b.apply(leader.fetch("b", 1, 20)) == 20
            assert b.high_watermark == 19
            with pytest.raises(StaleEpoch, match="leader epoch 0 is not the current one"):
                leader.fetch("b", 0, 20)

    asyncio.run(main())


def test_the_high_watermark_waits_while_the_isr_is_below_min_isr(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a"], min_isr=2)
            await publish(parts["a"], b"x", b"y")
            leader.fetch("b", 1, 2)  # b is not in the ISR: it does not count
            assert leader.high_watermark == -1
            leader.isr.add("b")
            leader.fetch("b", 1, 2)
            assert leader.high_watermark == 1

    asyncio.run(main())


def test_a_deposed_leaders_divergent_tail_is_cut_when_it_follows(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            # a leads epoch 1 and writes 0..4; b copies 0..2; then a is cut off.
            old = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"])
            b = FollowerReplica(parts["b"], "b")
            b.follow(1, old.end_offset_for)
            await publish(parts["a"], b"a0", b"a1", b"a2")
            catch_up(old, b, "b")
            await publish(parts["a"], b"a3", b"a4")  # never replicated, never acked by the ISR
            # b is elected (epoch 2) and writes its own offsets 3..5.
            new = LeaderReplica(parts["b"], "b", 2, isr=["b", "a"], high_watermark=b.high_watermark)
            await publish(parts["b"], b"b3", b"b4", b"b5")
            # a comes back as a follower: it cuts 3..4 (the new leader never had them), not
            # just to its high watermark, and then copies b's.
            a = FollowerReplica(parts["a"], "a")
            a.high_watermark = 2
            assert a.follow(2, new.end_offset_for) == 3
            catch_up(new, a, "a")
            assert contents(parts["a"]) == contents(parts["b"])
            assert [v for _, _, v, _, _ in contents(parts["a"])] == [
                b"a0",
                b"a1",
                b"a2",
                b"b3",
                b"b4",
                b"b5",
            ]
            assert [(e.epoch, e.start_offset) for e in a.epochs.entries] == [(1, 0), (2, 3)]

    asyncio.run(main())


def test_a_restarted_follower_keeps_what_the_leader_has_above_its_high_watermark(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"])
            b = FollowerReplica(parts["b"], "b")
            b.follow(1, leader.end_offset_for)
            await publish(parts["a"], b"0", b"1", b"2", b"3")
            b.apply(leader.fetch("b", 1, 0))  # b has 0..3, but was told hw -1 at that fetch
            assert b.high_watermark == -1
        async with replicas(tmp_path, "a", "b") as parts:  # both restart
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"])
            b = FollowerReplica(parts["b"], "b")
            assert b.epochs.latest_epoch == 1, "the cache survived the restart"
            # Truncating to the high watermark would drop 0..3, which a then acks when b
            # fetches from 4; the epoch answer keeps them.
            assert b.follow(1, leader.end_offset_for) == 4
            leader.fetch("b", 1, 4)
            assert leader.high_watermark == 3
            assert contents(parts["b"]) == contents(parts["a"])

    asyncio.run(main())


async def foreign_tail(
    parts: dict[str, Partition], high_watermark: int
) -> tuple[LeaderReplica, FollowerReplica]:
    """a leads epoch 1 and writes 0..19; b copied 0..4, then took foreign5..7 on its own (as a
    single broker would). Returns the leader and b as after a restart, knowing
    ``high_watermark``, before it follows."""
    leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"])
    b = FollowerReplica(parts["b"], "b")
    b.follow(1, leader.end_offset_for)
    await publish(parts["a"], *(b"a%d" % i for i in range(5)))
    catch_up(leader, b, "b")
    await publish(parts["a"], *(b"a%d" % i for i in range(5, 20)))
    await publish(parts["b"], b"foreign5", b"foreign6", b"foreign7")  # offsets 5..7
    b = FollowerReplica(parts["b"], "b")
    b.high_watermark = high_watermark
    return leader, b


def test_a_follower_with_records_no_leader_wrote_in_the_same_epoch_cuts_them(
    tmp_path: Path,
) -> None:
    """A replica holds records its leader never wrote, inside the leader's own epoch (a restarted
    broker took publishes before it knew its role, or a disk went wrong): the epochs show no
    divergence, so the fetch's CRC of the record before it does. The follower cuts back until
    the logs agree and ends a byte-for-byte copy; before, it kept the foreign records, and its
    next append of the leader's older timestamps failed, every fetch, forever."""

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader, b = await foreign_tail(parts, high_watermark=4)
            assert b.follow(1, leader.end_offset_for) == 8, "the epochs see nothing to cut"
            catch_up(leader, b, "b")
            assert contents(parts["b"]) == contents(parts["a"])
            assert b.divergences == 2, "cut 7, then 5..6, then the logs agree at 4"
            leader.fetch("b", 1, 20, previous_crc=b.last_crc)
            assert leader.high_watermark == 19

    asyncio.run(main())


def test_a_divergence_check_against_a_leader_without_the_record(tmp_path: Path) -> None:
    """A follower whose record is past the leader's end diverges; one below the leader's
    oldest cannot be compared and counts as the same; a matching one does not diverge."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a"])
            await publish(parts["a"], b"x", b"y")
            crc = record_crc(parts["a"], 1)
            assert crc is not None
            assert not leader.fetch("b", 1, 2, previous_crc=crc).diverged
            assert leader.fetch("b", 1, 2, previous_crc=crc ^ 1).diverged
            assert leader.fetch("b", 1, 3, previous_crc=crc).diverged, "past its end"
            assert not leader.fetch("b", 1, 0, previous_crc=crc).diverged, "offset -1"
            assert record_crc(parts["a"], 2) is None

    asyncio.run(main())


def test_a_follower_behind_the_leaders_oldest_record_gets_what_the_leader_holds(
    tmp_path: Path,
) -> None:
    """The leader released its oldest segments (the delta queue's upkeep, or retention) before
    a new replica came: fetches from offset 0 used to answer nothing, forever."""

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            for i in range(10):
                await publish(parts["a"], *(b"v%d-%d" % (i, j) for j in range(5)))
                parts["a"].log.roll()  # a segment per batch: some can be released
            parts["a"].log.flush()
            assert await parts["a"].release_before(30)
            leader = LeaderReplica(parts["a"], "a", leader_epoch=1, isr=["a"])
            start = parts["a"].log.oldest_offset
            assert start > 3, "more than one fetch of 3 records behind"
            b = FollowerReplica(parts["b"], "b")
            assert b.follow(1, leader.end_offset_for) == 0
            catch_up(leader, b, "b")
            assert contents(parts["b"]) == contents(parts["a"])
            assert contents(parts["b"])[0][0] == start

    asyncio.run(main())


def test_a_follower_with_old_records_behind_the_leaders_oldest_starts_afresh(
    tmp_path: Path,
) -> None:
    """A replica back from a long absence holds records the leader has released since: it cuts
    them (Kafka's truncate-fully) rather than keep them before a gap, where they would read as
    held, and its epoch cache starts again with what it fetches."""

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader = LeaderReplica(parts["a"], "a", leader_epoch=1, isr=["a", "b"])
            b = FollowerReplica(parts["b"], "b")
            assert b.follow(1, leader.end_offset_for) == 0
            await publish(parts["a"], *(b"early-%d" % j for j in range(5)))
            catch_up(leader, b, "b")
            assert [r[0] for r in contents(parts["b"])] == list(range(5))
            leader.set_isr(["a"])  # b is away, out of the ISR: the leader goes on and releases
            for i in range(10):
                await publish(parts["a"], *(b"v%d-%d" % (i, j) for j in range(5)))
                parts["a"].log.roll()
            parts["a"].log.flush()
            leader.advance()
            assert await parts["a"].release_before(30)
            start = parts["a"].log.oldest_offset
            catch_up(leader, b, "b")
            assert contents(parts["b"]) == contents(parts["a"])
            assert parts["b"].log.oldest_offset == start
            assert [e.start_offset for e in b.epochs.entries] == [start]

    asyncio.run(main())


def test_a_follower_waiting_at_the_log_end_stays_caught_up_however_long(tmp_path: Path) -> None:
    """The leader holds an idle follower's fetch (up to half the lag allowed, ``fetch_wait_ms``);
    while it is held the follower has everything, so it never leaves the ISR for the wait. Once
    answered, its lag counts from that fetch's arrival, as if it had not been held: one that
    stopped while held (killed, paused) leaves as soon as it would have."""
    now = [1000.0]

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"], clock=lambda: now[0])
            await publish(parts["a"], b"x")
            leader.fetch("b", 1, 1)  # b has everything
            leader.hold("b")
            now[0] += 60
            leader.fetch("b", 1, 1, again=True)  # the held fetch looked at again: no arrival
            assert leader.lagging(5) == set(), "held at the end for a minute: still caught up"
            assert leader.caught_up("b", 5)
            leader.release("b")
            assert leader.lagging(5) == {"b"}, "answered, and no fetch since the held one"
            assert not leader.caught_up("b", 5)
            leader.fetch("b", 1, 1)
            assert leader.lagging(5) == set(), "a new fetch at the end: caught up"

    asyncio.run(main())


def test_a_diverged_follower_is_out_of_sync_and_cuts_no_committed_record_first(
    tmp_path: Path,
) -> None:
    """Foreign records, some below the high watermark the follower knows (a replica whose
    high watermark once covered a record no leader wrote): the cut-back stops at that high
    watermark first and goes below it only when a record there differs too; and from the first
    ``diverged`` the leader counts it lagging, so it leaves the ISR (it must not be elected
    while it copies again what it cut)."""

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            # once told 6, while it held foreign records
            leader, b = await foreign_tail(parts, high_watermark=6)
            assert leader.lagging(5) == set(), "in sync before it diverges"
            b.follow(1, leader.end_offset_for)
            answer = leader.fetch("b", 1, 8, previous_crc=b.last_crc)
            assert answer.diverged and not answer.records
            assert leader.lagging(5) == {"b"}, "a diverged follower is not in sync"
            assert b.apply(answer) == 7, "cut to its high watermark + 1, not below"
            catch_up(leader, b, "b")
            assert contents(parts["b"]) == contents(parts["a"])
            assert b.divergences == 2, "7 (down to the floor), then 5..6 below it"
            assert leader.lagging(5) == set(), "caught up again"

    asyncio.run(main())


def test_leadership_lost_while_waiting_for_the_isr_is_not_a_not_leader_refusal(
    tmp_path: Path,
) -> None:
    """A publish appended, then waiting for the ISR when the leader steps down, may be stored:
    "not the leader" would tell a client nothing was done, and a plain publish sent again to
    the new leader would be stored twice. It fails as NotEnoughReplicas (UNAVAILABLE), whose
    outcome is unknown."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            role = PartitionRole(stand_in_node("a"), parts["a"])  # type: ignore[arg-type]
            role.leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"], min_isr=2)
            await publish(parts["a"], b"x")
            waiting = asyncio.create_task(role.replicated(0))
            await asyncio.sleep(0.05)
            assert not waiting.done(), "b has not copied it"
            role.step_down()
            with pytest.raises(NotEnoughReplicas, match="may be stored"):
                await waiting

    asyncio.run(main())


def test_an_undecided_partition_of_a_stream_the_cluster_lacks_is_not_found(
    tmp_path: Path,
) -> None:
    """Before the node's first reading every partition answers not-leader (clients look the
    leader up); after it, one of a stream the cluster does not have (deleted while this broker
    was away) answers not found, not "no leader now; retry" for ever."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            node = SimpleNamespace(view=ClusterView(), _elsewhere=lambda s, n: None)
            role = Undecided(node, parts["a"])  # type: ignore[arg-type]
            with pytest.raises(NotLeader):
                role.check_publish()
            node.view = ClusterView(revision=7)
            with pytest.raises(StreamNotFound):
                role.check_publish()
            with pytest.raises(StreamNotFound):
                role.check_read(True)

    asyncio.run(main())
