"""The tag index's snapshot (``tidelog/sites/tag_index_file.py``) and its use at the send queue's
open: restored plus only the records after it, or rebuilt whole when it is missing, damaged or
does not fit the queue; sites changed since it was written never inherit its lists."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker
from tidelog.sites.registry import SITES_FILE, SiteRegistry
from tidelog.sites.send_queue import QueueRetention, SendQueue, Transmission
from tidelog.sites.site_state import STATE_CONFIG, STATE_STREAM, StateStream
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import TAG_INDEX_FILE, decode, encode


def sample_index() -> TagIndex:
    index = TagIndex()
    for offset in range(40):
        index.add(offset, {0: 1 + offset % 3} if offset % 4 else {0: 2, 5: 1})
    index.trim(7)
    return index


def test_a_snapshot_decodes_to_the_same_index() -> None:
    index = sample_index()
    restored, since = decode(encode(index, {0: 0, 5: 3}))
    assert since == {0: 0, 5: 3}
    assert (restored.covers, restored.oldest) == (index.covers, index.oldest)
    for site in (0, 5):
        assert restored.records_for(site, 0, 100) == index.records_for(site, 0, 100)
        for start in range(0, 41, 5):
            assert restored.entries_for(site, start) == index.entries_for(site, start)
    empty, _ = decode(encode(TagIndex(), {}))
    assert empty.covers == -1 and empty.records_for(0, 0, 10) == []


def test_any_damage_is_refused() -> None:
    data = encode(sample_index(), {0: 0, 5: 3})
    rng = random.Random(13)
    for _ in range(200):
        at = rng.randrange(len(data))
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        with pytest.raises(ValueError, match="tag index snapshot"):
            decode(bytes(damaged))
    for cut in (0, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError, match="tag index snapshot"):
            decode(data[:cut])


SMALL = QueueRetention(segment_bytes=1024)


def opened(broker: Broker, data_dir: Path, *, snapshot: bool = True) -> SendQueue:
    queue = SendQueue(
        broker,
        SiteRegistry("a", data_dir / SITES_FILE),
        SMALL,
        index_file=data_dir / TAG_INDEX_FILE if snapshot else None,
    )
    queue.open()
    return queue


async def fill(queue: SendQueue, records: int) -> None:
    for i in range(records):
        destinations = ["b"] if i % 3 else ["b", "c"]
        await queue.transmit("app", [Transmission(b"%d" % i, destinations)] * (1 + i % 4))


def index_view(queue: SendQueue) -> list[tuple[list[int], int]]:
    return [
        (queue.index.records_for(n, 0, 10_000), queue.index.entries_for(n, 0)) for n in range(3)
    ]


def test_a_restart_reads_only_the_records_after_the_snapshot(tmp_path: Path) -> None:
    async def first() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 50)
            assert await queue.save_index()
            assert not await queue.save_index()  # unchanged: not written again
            await fill(queue, 7)  # the tail, after the snapshot (a crash: no save at close)

    async def second() -> tuple[int, list[tuple[list[int], int]]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            return queue.records_read_at_open, index_view(queue)

    async def rebuilt() -> tuple[int, list[tuple[list[int], int]]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path, snapshot=False)
            return queue.records_read_at_open, index_view(queue)

    asyncio.run(first())
    read, restored = asyncio.run(second())
    full_read, full = asyncio.run(rebuilt())
    assert (read, full_read) == (7, 57)
    assert restored == full
    assert full[0][1] > 0 and full[1][1] > 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "beyond-the-queue", "trimmed-past"])
def test_an_unusable_snapshot_falls_back_to_a_full_rebuild(tmp_path: Path, damage: str) -> None:
    path = tmp_path / TAG_INDEX_FILE

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 40)
            await queue.save_index()
            expected = index_view(queue)
            if damage == "trimmed-past":
                await fill(queue, 40)  # records after the snapshot ...
                await queue.partition.release_before(60)  # ... some of them gone since
                assert queue.partition.log.oldest_offset > 40
                queue.index.trim(queue.partition.log.oldest_offset)
                expected = index_view(queue)
        data = path.read_bytes()
        if damage == "garbage":
            path.write_bytes(b"\x00" * len(data))
        elif damage == "truncated":
            path.write_bytes(data[: len(data) // 2])
        elif damage == "beyond-the-queue":
            index = TagIndex()
            index.add(10_000, {0: 1})
            path.write_bytes(encode(index, {0: 0}))
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            log = queue.partition.log
            assert queue.records_read_at_open == log.newest_offset - log.oldest_offset + 1
            assert index_view(queue) == expected

    asyncio.run(main())


def test_sites_changed_after_the_snapshot_never_inherit_its_lists(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            old = queue.registry.add("old", "h:1", queue.next_offset)
            kept = queue.registry.add("kept", "h:2", queue.next_offset)
            await queue.transmit("app", [Transmission(b"for-old", ["old", "kept"])])
            await queue.save_index()
            # After the snapshot, without another one (a crash): the number changes hands.
            queue.registry.remove("old")
            new = queue.registry.add("new", "h:3", queue.next_offset)
            assert new.number == old.number
            await queue.transmit("app", [Transmission(b"for-new", ["new"])])
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            assert queue.records_read_at_open == 1
            assert queue.index.records_for(new.number, 0, 10) == [1]
            assert queue.index.records_for(kept.number, 0, 10) == [0]

    asyncio.run(main())


def test_after_a_restart_every_site_is_held_from_the_queues_front(tmp_path: Path) -> None:
    """A site that lost entries before the restart is never resumed with deltas past them: a
    restored index holds each site from just past the newest record for it that retention
    removed (the snapshot saved after the trim knows it), a rebuilt one from the queue's front.
    (Where the front falls depends on the records' sizes: the expected values are derived.)"""

    async def first() -> int:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 60)
            await queue.partition.release_before(30)  # as retention would
            c = queue.registry.get("c").number
            assert queue.held_from(c) > 0  # known while running ...
            assert await queue.save_index()
            return queue.partition.log.oldest_offset

    async def second(snapshot: bool) -> tuple[int, list[int]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path, snapshot=snapshot)
            return queue.records_read_at_open, [queue.held_from(n) for n in range(2)]

    oldest = asyncio.run(first())
    assert oldest > 0
    # ... and after: held from just past the newest record for it that retention removed
    # (the snapshot knows it; c gets every third record), never from below it.
    newest_lost_c = max(i for i in range(oldest) if i % 3 == 0)
    assert asyncio.run(second(snapshot=True)) == (0, [oldest, newest_lost_c + 1])
    assert asyncio.run(second(snapshot=False))[1] == [oldest, oldest]  # rebuilt: the front


def test_a_clusters_rebuilt_index_holds_each_site_from_where_the_last_one_did(
    tmp_path: Path,
) -> None:
    """A cluster's queue has no snapshot file (it would be one broker's): the index's trim marks
    are kept in ``__lrq_state``, so the next broker to run the site, rebuilding its index from
    the queue, holds each site from where the last one did, not every site from the front
    (which sent a quiet site a snapshot after every failover)."""

    def with_state(broker: Broker) -> SendQueue:
        partition = broker.internal_stream(STATE_STREAM, STATE_CONFIG).partitions[0]
        queue = SendQueue(broker, SiteRegistry("a", tmp_path / SITES_FILE), SMALL)
        queue.state = StateStream(partition)
        queue.open()
        return queue

    async def first() -> tuple[int, list[int]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = with_state(broker)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 60)
            queue.partition.log.flush()
            await queue.partition.release_before(30)  # as the upkeep would
            queue.index.trim(queue.partition.log.oldest_offset)
            assert await queue.save_index()
            assert not await queue.save_index(), "saved once until they move"
            return queue.partition.log.oldest_offset, [queue.held_from(n) for n in range(2)]

    async def second() -> list[int]:
        async with running(broker_config(tmp_path)) as broker:
            queue = with_state(broker)
            assert queue.records_read_at_open > 0, "rebuilt from the queue"
            return [queue.held_from(n) for n in range(2)]

    oldest, held = asyncio.run(first())
    c_held = max(i for i in range(oldest) if i % 3 == 0) + 1
    assert held == [oldest, c_held] and c_held < oldest
    assert asyncio.run(second()) == held
