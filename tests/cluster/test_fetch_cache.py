"""The records a leader sent last, shared with its other followers
(``tidelog/cluster/fetch_cache.py``): a fetch from inside them is answered with the same bytes
the log holds, bounded as a fetch from the log is; what lies past them comes from the log; a
divergence is still found; the cache is dropped once no follower may ask for it; and the caches
of a process keep no more than their budget."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tests.cluster.test_replication import catch_up, contents, publish, replicas

from tidelog.broker import ReadAheadBudget
from tidelog.cluster import fetch_cache
from tidelog.cluster.fetch_cache import SentRecords, record_offsets
from tidelog.cluster.replication import FollowerReplica, LeaderReplica
from tidelog.cluster.stored import StoredRecords


def stored(leader: LeaderReplica, start: int, count: int) -> StoredRecords:
    """``count`` records from ``start`` as the leader's log stores them (read from it)."""
    log = leader.partition.log
    batch = log.forward_reader(start, stop_offset=start + count - 1, past_limit=True).read(
        count, 1 << 30
    )
    data = b"".join(
        bytes(batch.data[int(p) : int(p) + int(n)])
        for p, n in zip(batch.positions, batch.sizes, strict=True)
    )
    return StoredRecords(data, batch.sizes.astype(np.int64))


def test_a_fetch_from_inside_the_sent_records_gets_their_bytes_within_its_bounds(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a"])
            await publish(parts["a"], *(b"v%d" % i for i in range(10)))
            everything = stored(leader, 0, 10)
            sent = SentRecords()
            assert not sent.take(0, 100, 1 << 20) and sent.last_offset == -1
            sent.put(everything)
            assert list(record_offsets(everything)) == list(range(10))
            assert sent.last_offset == 9
            for start, count in ((0, 100), (3, 100), (3, 4), (9, 100)):
                got = sent.take(start, count, 1 << 20)
                want = stored(leader, start, min(count, 10 - start))
                assert got.data == want.data and list(got.sizes) == list(want.sizes)
            one = int(everything.sizes[0])
            assert len(sent.take(0, 100, 2 * one)) == 2, "bytes bound the answer"
            assert len(sent.take(0, 100, 1)) == 1, "at least one record, whatever its size"
            assert not sent.take(0, 0, 1 << 20), "unless none is asked for"
            assert not sent.take(10, 100, 1 << 20), "past the last sent record: the log's"
            leader.fetch("b", 1, 0)  # b asks for everything: c (below) is not in the ISR
            leader._sent.put(everything)
            assert not leader.fetch("c", 1, 0, max_records=0).records, "none asked for"
            assert sent.crc_at(4) == int.from_bytes(stored(leader, 4, 1).data[:4], "little")
            assert sent.crc_at(10) is None

    asyncio.run(main())


def test_two_followers_get_the_leaders_bytes_and_the_second_reads_past_the_cache(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b", "c") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b", "c"])
            b, c = FollowerReplica(parts["b"], "b"), FollowerReplica(parts["c"], "c")
            for follower in (b, c):
                follower.follow(1, leader.end_offset_for)
            for name in ("b", "c"):  # each known to the leader, at offset 0
                leader.fetch(name, 1, 0, max_records=0)
            await publish(parts["a"], *(b"x%d" % i for i in range(5)))
            b.apply(leader.fetch("b", 1, 0, previous_crc=b.last_crc))
            await publish(parts["a"], *(b"y%d" % i for i in range(3)))  # past what b was sent
            hits = leader._sent.hits
            answer = leader.fetch("c", 1, 0, previous_crc=c.last_crc)
            assert leader._sent.hits == hits + 1, "c's fetch started inside what b was sent"
            assert answer.records.offset_range() == (0, 7)
            c.apply(answer)
            catch_up(leader, b, "b")
            catch_up(leader, c, "c")
            assert contents(parts["b"]) == contents(parts["a"]) == contents(parts["c"])
            assert leader.high_watermark == 7
            assert leader._sent.last_offset == -1, "both have everything: nothing kept"

    asyncio.run(main())


def test_a_divergence_is_found_against_the_sent_records(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b", "c") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b", "c"])
            leader.fetch("c", 1, 0, max_records=0)
            await publish(parts["a"], *(b"x%d" % i for i in range(5)))
            assert leader.fetch("b", 1, 0).records  # kept for c, which is behind
            crc = leader._sent.crc_at(2)
            assert crc is not None
            assert not leader.fetch("c", 1, 3, previous_crc=crc).diverged
            assert leader.fetch("c", 1, 3, previous_crc=crc ^ 1).diverged

    asyncio.run(main())


def test_a_fetch_after_what_the_follower_was_sent_is_checked_against_the_sent_crc(
    tmp_path: Path,
) -> None:
    """The leader remembers the CRC of the last record it sent each follower: a fetch from the
    next offset naming it holds the leader's record; naming another one, it has diverged."""

    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b"])
            b = FollowerReplica(parts["b"], "b")
            b.follow(1, leader.end_offset_for)
            await publish(parts["a"], *(b"x%d" % i for i in range(5)))
            after = b.apply(leader.fetch("b", 1, 0, previous_crc=b.last_crc))
            assert after == 5 and b.last_crc is not None
            assert leader._sent.last_offset == -1, "no other follower: nothing kept"
            assert not leader.fetch("b", 1, 5, previous_crc=b.last_crc).diverged
            assert leader.fetch("b", 1, 5, previous_crc=b.last_crc ^ 1).diverged

    asyncio.run(main())


def test_the_caches_keep_no_more_than_their_budget_and_give_it_back(tmp_path: Path) -> None:
    """Every cache leases its bytes from one budget: a run it has no room for is not kept (the
    next fetch reads the log), and a run replaced or cleared is given back."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a"])
            await publish(parts["a"], *(b"v%d" % i for i in range(10)))
            ten, four = stored(leader, 0, 10), stored(leader, 0, 4)
            budget = ReadAheadBudget(len(ten.data))
            first, second = SentRecords(budget), SentRecords(budget)
            first.put(ten)
            assert first.last_offset == 9 and budget.leased == len(ten.data)
            second.put(four)
            assert second.last_offset == -1 and second.refused == 1, "no room: not kept"
            assert not second.take(0, 100, 1 << 20)
            first.put(four)  # the ten are given back before the four are leased
            assert budget.leased == len(four.data)
            second.put(stored(leader, 4, 6))
            assert second.last_offset == 9
            assert budget.leased == len(four.data) + len(stored(leader, 4, 6).data)
            assert budget.leased <= budget.budget_bytes
            first.clear()
            second.clear()
            assert budget.leased == 0
            dropped = SentRecords(budget)
            dropped.put(ten)
            del dropped
            assert budget.leased == 0, "a cache dropped with its leader gives its bytes back"

    asyncio.run(main())


def test_a_leader_over_the_process_budget_keeps_nothing_and_its_followers_read_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaders share the process budget (``FETCH_CACHE``): one that finds it spent keeps no cache
    while a follower lags, and both followers still get the leader's log byte for byte."""
    monkeypatch.setattr(fetch_cache, "FETCH_CACHE", ReadAheadBudget(0))

    async def main() -> None:
        async with replicas(tmp_path, "a", "b", "c") as parts:
            leader = LeaderReplica(parts["a"], "a", 1, isr=["a", "b", "c"])
            b, c = FollowerReplica(parts["b"], "b"), FollowerReplica(parts["c"], "c")
            for follower in (b, c):
                follower.follow(1, leader.end_offset_for)
            for name in ("b", "c"):
                leader.fetch(name, 1, 0, max_records=0)
            await publish(parts["a"], *(b"x%d" % i for i in range(5)))
            b.apply(leader.fetch("b", 1, 0, previous_crc=b.last_crc))
            assert leader._sent.last_offset == -1 and leader._sent.refused == 1, "c lags"
            answer = leader.fetch("c", 1, 0, previous_crc=c.last_crc)
            assert leader._sent.hits == 0 and answer.records.offset_range() == (0, 4)
            c.apply(answer)
            catch_up(leader, b, "b")
            catch_up(leader, c, "c")
            assert contents(parts["b"]) == contents(parts["a"]) == contents(parts["c"])
            assert fetch_cache.FETCH_CACHE.leased == 0

    asyncio.run(main())
