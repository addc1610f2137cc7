"""The delta queue's upkeep (``tidelog/sites/upkeep.py``) on an in-process broker: entries leave
in whole segments once every declared site acknowledged them, a removed site stops holding them,
a site that never acknowledges holds them until the retention backstop, and the acknowledged
positions survive a restart for the sites they were saved for."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker
from tidelog.errors import PositionTrimmed
from tidelog.sites.envelope import position, split_position
from tidelog.sites.local_site import LocalSite
from tidelog.sites.negotiation import NONE, Outcome, SinkProgress, negotiate
from tidelog.sites.registry import SITES_FILE, Site, SiteRegistry
from tidelog.sites.send_queue import QueueRetention, SendQueue, Transmission
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import decode, encode
from tidelog.sites.upkeep import ACKED_FILE, QueueUpkeep, load_acked, release_offset

SMALL = QueueRetention(segment_bytes=1024)
"""About ten records of the tests' size per segment, so releases happen in small steps."""


class FakeSender:
    """What the upkeep reads of a sender: the last position its site acknowledged."""

    def __init__(self, acked: int = NONE) -> None:
        self.acked = acked


def opened(broker: Broker, data_dir: Path, retention: QueueRetention = SMALL) -> SendQueue:
    queue = SendQueue(broker, SiteRegistry("a", data_dir / SITES_FILE), retention)
    queue.open()
    return queue


def upkeep_for(queue: SendQueue, data_dir: Path, senders: dict[str, FakeSender]) -> QueueUpkeep:
    return QueueUpkeep(queue, cast(Any, senders), data_dir, interval_s=3600.0)


async def fill(queue: SendQueue, records: int, destinations: list[str]) -> None:
    for i in range(records):
        await queue.transmit("app", [Transmission(b"%03d" % i + b"x" * 80, destinations)])


def test_the_release_offset_is_the_lowest_record_a_declared_site_needs() -> None:
    b, c = Site("b", "h:1", 0, since=5), Site("c", "h:2", 1, since=0)
    end = 100
    index = TagIndex()
    for offset in range(100):  # b in every 10th record from 10, c in every record
        index.add(offset, {0: 1, 1: 1} if offset % 10 == 0 and offset else {1: 1})
    assert release_offset([], {}, end, index) == end  # nobody needs anything
    assert release_offset([b], {}, end, index) == 10  # nothing acked: its first from its since
    assert release_offset([b], {"b": position(40, 0)}, end, index) == 50  # its next record
    assert release_offset([b], {"b": position(90, 0)}, end, index) == end  # had all of its own
    assert release_offset([b, c], {"b": position(40, 0), "c": position(12, 0)}, end, index) == 13
    assert release_offset([b, c], {"b": position(40, 0)}, end, index) == 0


def test_a_site_that_rarely_receives_does_not_pin_the_queue_nor_get_a_snapshot() -> None:
    """b received record 3 long ago and everything since went to c: once c acked it all, the
    queue may go up to its end, and b still resumes with deltas (nothing of its was trimmed),
    also after a restart that restores the index from its snapshot file."""
    b, c = Site("b", "h:1", 0, since=0), Site("c", "h:2", 1, since=0)
    index = TagIndex()
    index.add(3, {0: 1, 1: 1})
    for offset in range(4, 60):
        index.add(offset, {1: 1})
    acked = {"b": position(3, 0), "c": position(59, 0)}
    assert release_offset([b, c], acked, 60, index) == 60
    index.trim(60)
    progress = SinkProgress(last_processed=position(3, 0))
    assert negotiate(progress, index.held_from(0)).outcome is Outcome.DELTAS
    restored, _ = decode(encode(index, {0: 0, 1: 0}))
    assert negotiate(progress, restored.held_from(0)).outcome is Outcome.DELTAS
    restored.trim(61)  # nothing more of b's goes: still deltas
    assert negotiate(progress, restored.held_from(0)).outcome is Outcome.DELTAS


def test_segments_leave_only_below_every_live_sites_acknowledged_position(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 60, ["b", "c"])
            log = queue.partition.log
            assert log.segment_count > 5
            senders = {"b": FakeSender(position(45, 0)), "c": FakeSender(position(20, 0))}
            upkeep = upkeep_for(queue, tmp_path, senders)
            released = await upkeep.run_once()
            assert released, "nothing was released"
            assert 0 < log.oldest_offset <= 21  # c acked record 20 whole: it needs 21 on
            b = queue.registry.get("b").number
            assert queue.index.records_for(b, 0, 1) == [log.oldest_offset]  # index trimmed
            senders["c"].acked = position(50, 0)
            await upkeep.run_once()
            assert 21 < log.oldest_offset <= 46  # now b is the slowest
            # Every site can still go on from its position: deltas, never a snapshot.
            for site_id, sender in senders.items():
                progress = SinkProgress(last_processed=sender.acked)
                held = queue.held_from(queue.registry.get(site_id).number)
                assert negotiate(progress, held).outcome is Outcome.DELTAS
                assert not queue.lost_for(queue.registry.get(site_id).number, sender.acked)
            rest = queue.read_for(b, position(45, 0), limit=100)
            assert [split_position(e.position)[0] for e in rest] == list(range(46, 60))

    asyncio.run(main())


def test_a_removed_site_stops_holding_entries(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 40, ["b", "c"])
            senders = {"b": FakeSender(position(35, 0)), "c": FakeSender()}  # c never acked
            upkeep = upkeep_for(queue, tmp_path, senders)
            assert await upkeep.run_once() == []
            assert queue.partition.log.oldest_offset == 0
            removed = queue.registry.remove("c")
            queue.index.forget_site(removed.number)
            del senders["c"]
            assert await upkeep.run_once()
            assert 0 < queue.partition.log.oldest_offset <= 35

    asyncio.run(main())


def test_a_site_that_never_acknowledges_holds_entries_until_the_retention_backstop(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 60, ["b", "c"])
            senders = {"b": FakeSender(position(59, 0)), "c": FakeSender()}
            upkeep = upkeep_for(queue, tmp_path, senders)
            for _ in range(3):
                assert await upkeep.run_once() == []
            log = queue.partition.log
            assert log.oldest_offset == 0
            c = queue.registry.get("c").number
            assert len(queue.read_for(c, -1, limit=1000)) == 60
        # The operator bounds the queue: the broker's maintenance applies it at the next start.
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path, QueueRetention(max_bytes=2048, segment_bytes=1024))
            await broker.maintain()
            log = queue.partition.log
            assert log.oldest_offset > 0
            assert log.size_bytes <= 2048 + 1024 + 200  # the floor plus at most one segment
            upkeep = upkeep_for(queue, tmp_path, {"b": FakeSender(), "c": FakeSender()})
            await upkeep.run_once()
            assert queue.index.records_for(c, 0, 1) == [log.oldest_offset]
            # c's entries are gone: its sender must not skip them silently ...
            with pytest.raises(PositionTrimmed, match="snapshot sync"):
                queue.read_for(c, -1, limit=1000)
            # ... and negotiation sends it to a snapshot sync.
            outcome = negotiate(SinkProgress(last_processed=position(3, 0)), queue.held_from(c))
            assert outcome.outcome is Outcome.SNAPSHOT

    asyncio.run(main())


def test_acknowledged_positions_survive_a_restart_for_the_sites_they_were_saved_for(
    tmp_path: Path,
) -> None:
    async def first() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            await fill(queue, 40, ["b", "c"])
            senders = {"b": FakeSender(position(30, 0)), "c": FakeSender(position(25, 1))}
            await upkeep_for(queue, tmp_path, senders).run_once()

    async def second() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            oldest = queue.partition.log.oldest_offset
            assert oldest > 0
            # The senders have not heard from their sinks yet: the saved positions hold.
            upkeep = upkeep_for(queue, tmp_path, {"b": FakeSender(), "c": FakeSender()})
            assert upkeep.acked() == {"b": position(30, 0), "c": position(25, 1)}
            await upkeep.run_once()
            assert oldest <= queue.partition.log.oldest_offset <= 25
            # A site removed and declared again under the same id is another site.
            queue.registry.remove("c")
            queue.registry.add("c", "h:2", queue.next_offset)
            assert upkeep.acked() == {"b": position(30, 0), "c": NONE}
            assert load_acked(tmp_path / ACKED_FILE, queue.registry.list()) == {
                "b": position(30, 0)
            }

    asyncio.run(first())
    asyncio.run(second())
    (tmp_path / ACKED_FILE).write_text("{torn")
    assert load_acked(tmp_path / ACKED_FILE, []) == {}


def test_a_saved_position_past_the_queues_end_holds_nothing_back_wrongly(tmp_path: Path) -> None:
    """The queue was lost, its acknowledged positions were not: a position past the new queue's
    end is the lost queue's, and taken as acknowledged it would release what b never got."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            queue.registry.add("b", "h:1", queue.next_offset)
            await fill(queue, 30, ["b"])
            await upkeep_for(queue, tmp_path, {"b": FakeSender(position(5, 0))}).run_once()
            kept = queue.partition.log.oldest_offset
            upkeep = upkeep_for(queue, tmp_path, {"b": FakeSender()})
            assert upkeep.acked() == {"b": position(5, 0)}
            (tmp_path / ACKED_FILE).write_text(
                (tmp_path / ACKED_FILE)
                .read_text()
                .replace(str(position(5, 0)), str(position(90, 0)))
            )
            upkeep = upkeep_for(queue, tmp_path, {"b": FakeSender()})
            assert upkeep.acked() == {"b": NONE}
            await upkeep.run_once()
            assert queue.partition.log.oldest_offset == kept <= 6

    asyncio.run(main())


def test_a_failed_last_pass_does_not_stop_the_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            site = LocalSite(broker, "a", tmp_path, upkeep_interval_s=3600.0)
            await site.open()
            await site.add_site("b", "127.0.0.1:1")
            await site.transmit("app", [Transmission(b"x", ["b"])])

            async def full_disk() -> bool:
                raise OSError(28, "No space left on device")

            site.queue.save_index = full_disk  # type: ignore[method-assign]
            await site.close()  # logged, not raised: the broker still closes after it

    asyncio.run(main())
    assert "last upkeep pass failed" in caplog.text


def test_a_record_retention_removes_during_a_read_is_never_skipped(tmp_path: Path) -> None:
    """Retention runs in a thread: it may remove a record after the read checked what the
    queue holds for the site and before the read gets there. The read raises, not skips."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            queue.registry.add("b", "h:1", queue.next_offset)
            await fill(queue, 40, ["b"])
            b = queue.registry.get("b").number
            assert len(queue.read_for(b, -1, limit=1000)) == 40
            # The segments go, but the index has not followed yet (the check saw them held).
            await queue.partition.release_before(20)
            queue._follow_retention = lambda: None  # type: ignore[method-assign]
            assert queue.index.records_for(b, 0, 1) == [0]
            with pytest.raises(PositionTrimmed):
                queue.read_for(b, -1, limit=1000)
            with pytest.raises(PositionTrimmed):
                queue.read_for(b, position(2, 0), limit=3)

    asyncio.run(main())
