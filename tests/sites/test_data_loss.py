"""A source that lost part of its data (docs/replication.md, "Positions that never repeat"): its
delta queue alone (the registry kept), a tail a power loss cut, or its whole data directory. Its
sinks must never be sent an entry at a position they processed, a stale acknowledgement must not
release what they never got, and a registry changed at an end below its lifts stays readable.

The sender runs whole against an in-memory sink (``fake_sink.py``); the site, its queue and its
registry run on an in-process broker."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.broker.brokertools import broker_config, running
from tests.sites.fake_sink import FakeCall, answering, progress, run_until

from tidelog.sites.envelope import position
from tidelog.sites.local_site import LocalSite
from tidelog.sites.negotiation import NONE
from tidelog.sites.positions import MAX_RECORD
from tidelog.sites.registry import SITES_FILE, SiteRegistry
from tidelog.sites.send_queue import DELTA_QUEUE, QueueRetention, SendQueue, Transmission
from tidelog.sites.sender import Sender
from tidelog.sites.snapshots import Snapshots
from tidelog.sites.sync_states import SyncState
from tidelog.sites.tag_index_file import TAG_INDEX_FILE

P = position
SMALL = QueueRetention(segment_bytes=1024)
"""About ten records of the tests' size per segment, so releases happen in small steps."""


def lose_the_queue(data_dir: Path) -> None:
    """The delta queue and its tag index are gone; everything else of the data directory is
    kept (the registry, the saved acknowledgements)."""
    shutil.rmtree(data_dir / "streams" / DELTA_QUEUE)
    (data_dir / TAG_INDEX_FILE).unlink(missing_ok=True)


async def transmit(site: LocalSite | SendQueue, to: list[str], count: int) -> list[int]:
    answered: list[int] = []
    for i in range(count):
        answered += await site.transmit("jobs", [Transmission(b"entry%d" % i, to)])
    return answered


def sender_for(queue: SendQueue, snapshots: Snapshots, site_id: str) -> Sender:
    return Sender(queue, snapshots, queue.registry.get(site_id), "a", ack_timeout_s=60.0)


@asynccontextmanager
async def source_site(
    data_dir: Path, retention: QueueRetention | None = None
) -> AsyncIterator[LocalSite]:
    """Site ``a`` over ``data_dir`` on an in-process broker, open (no upkeep of its own: the
    tests run it); closed at the end."""
    async with running(broker_config(data_dir)) as broker:
        site = LocalSite(broker, "a", data_dir, retention, upkeep_interval_s=3600.0)
        await site.open()
        try:
            yield site
        finally:
            await site.close()


@asynccontextmanager
async def source_queue(data_dir: Path) -> AsyncIterator[tuple[SendQueue, Snapshots]]:
    """Site ``a``'s delta queue and snapshots over ``data_dir`` on an in-process broker, open,
    without the site around them (the tests drive a sender themselves)."""
    async with running(broker_config(data_dir)) as broker:
        queue = SendQueue(broker, SiteRegistry("a", data_dir / SITES_FILE))
        queue.open()
        snapshots = Snapshots(broker, queue.registry, queue)
        snapshots.open()
        yield queue, snapshots


# -- the delta queue lost, the registry kept -------------------------------------------------------


def test_a_heard_site_the_new_queue_passed_before_its_hello_gets_no_delta_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b processed old0..old9 (last: P(9, 0)). The queue is lost, the registry is not, and
    nothing was saved about b's acks. 15 entries are stored before the sender hears b, so the
    queue's next position is past what b reports: it must still be refused (b processed entries
    this queue never gave it), never resumed after P(9, 0), which skips new0..new9."""
    kept = tmp_path / "kept" / SITES_FILE
    kept.parent.mkdir()

    async def main() -> None:
        async with running(broker_config(tmp_path / "old")) as broker:
            queue = SendQueue(broker, SiteRegistry("a", kept))
            queue.open()
            queue.registry.add("b", "h:1", queue.next_offset)
            queue.registry.heard("b")
            known = (await transmit(queue, ["b"], 10))[-1]
        async with running(broker_config(tmp_path / "new")) as broker:
            queue = SendQueue(broker, SiteRegistry("a", kept))
            queue.open()
            snapshots = Snapshots(broker, queue.registry, queue)
            snapshots.open()
            new = await transmit(queue, ["b"], 15)
            assert new[0] <= known < new[-1] < queue.next_position()
            sender = sender_for(queue, snapshots, "b")
            call = FakeCall(progress(last_processed=known))
            with answering(monkeypatch, [call]):
                await run_until(
                    sender,
                    lambda: (
                        bool(call.delta_positions())
                        or sender.session.state is SyncState.SNAPSHOT_SYNC
                    ),
                )
            assert call.delta_positions() == [], "deltas after a position this queue never gave"
            assert "beyond" in queue.registry.get("b").resync, "owed a snapshot sync, kept"
            assert queue.next_position() > known, "new entries take positions above it"

    asyncio.run(main())


def test_a_saved_ack_past_the_end_raises_the_floor_at_open(tmp_path: Path) -> None:
    """The upkeep saved b's acknowledgement of P(9, 0); the queue is lost. At open, before any
    transmit, the floor rises above it and b is owed a snapshot sync: new entries never take a
    position b processed, and the stale acknowledgement releases nothing b did not get."""

    async def main() -> None:
        async with source_site(tmp_path) as site:
            await site.add_site("b", "127.0.0.1:1")
            site.registry.heard("b")
            known = (await transmit(site, ["b"], 10))[-1]
            site.senders["b"].acked = known  # as if b acknowledged it; the upkeep saves it
            await site.upkeep.run_once()
        lose_the_queue(tmp_path)
        async with source_site(tmp_path) as site:
            b = site.registry.get("b")
            assert "beyond" in b.resync, b
            assert site.queue.next_position() > known
            (new,) = await transmit(site, ["b"], 1)
            assert new > known
            assert site.queue.read_for(b.number, NONE, 100).positions.tolist() == [new]
        assert "beyond" in SiteRegistry("a", tmp_path / SITES_FILE).get("b").resync, "kept"

    asyncio.run(main())


def test_lifts_past_the_end_are_rebased_at_open(tmp_path: Path) -> None:
    """c was lifted at its first contact (a segment at offset 5); entries went on to offset 9,
    and b acknowledged the last. The queue is lost: at open the segment past the end is
    replaced by one at the end above every position known given, c's own lift still has the
    segment it needs, and the registry reads again."""

    async def main() -> None:
        async with source_site(tmp_path) as site:
            await site.add_site("b", "127.0.0.1:1")
            await site.add_site("c", "127.0.0.1:2")
            site.registry.heard("b")
            await transmit(site, ["b", "c"], 5)
            await site.change_site(lambda end: site.registry.lift("c", P(20, 0), end))
            known = (await transmit(site, ["b", "c"], 5))[-1]
            assert known == P(30, 0)
            site.senders["b"].acked = known
            await site.upkeep.run_once()
        lose_the_queue(tmp_path)
        async with source_site(tmp_path) as site:
            c = site.registry.get("c")
            seen = site.registry.positions_for(c)  # raised before: no segment for c's lift
            assert all(start <= 0 for start, _ in site.registry.positions.segments)
            (new,) = await transmit(site, ["b", "c"], 1)
            assert new > known, "above every position given before the loss"
            assert seen.position(0) == new, "c sees the position the transmit answered"
        again = SiteRegistry("a", tmp_path / SITES_FILE)
        assert again.positions_for(again.get("c")).position(0) == new

    asyncio.run(main())


def test_a_site_declared_past_the_end_counts_from_it(tmp_path: Path) -> None:
    """b was declared at offset 40 of the lost queue. The entries stored for it after the loss,
    at offsets below 40, are its own: the upkeep holds them, and they are still its after a
    restart that rebuilds the tag index from the queue."""

    async def main() -> None:
        async with source_site(tmp_path, SMALL) as site:
            await site.add_site("c", "127.0.0.1:2")
            await transmit(site, ["c"], 40)
            await site.add_site("b", "127.0.0.1:1")
            assert site.registry.get("b").since == 40
        lose_the_queue(tmp_path)
        async with source_site(tmp_path, SMALL) as site:
            new = await transmit(site, ["b"], 30)
            await site.upkeep.run_once()
            assert site.queue.oldest_offset() == 0, "b holds what it never acknowledged"
        (tmp_path / TAG_INDEX_FILE).unlink()  # as after a crash: the index is rebuilt
        async with source_site(tmp_path, SMALL) as site:
            b = site.registry.get("b")
            assert site.queue.read_for(b.number, NONE, 100).positions.tolist() == new

    asyncio.run(main())


# -- a floor raised or a lift made at an end below a segment --------------------------------------


def test_a_floor_raised_below_a_lifted_sites_segment_keeps_the_registry_whole(
    tmp_path: Path,
) -> None:
    """c was lifted at offset 100 (its lifted entries at records 201..210, the segment from 211);
    the queue is then lost and b, heard before, reports P(99, 0) at end 0. Every site's
    positions still read, the registry reopens, and new entries start above the segment."""
    path = tmp_path / SITES_FILE
    registry = SiteRegistry("a", path)
    registry.add("b", "h:1", 0)
    registry.heard("b")
    registry.add("c", "h:2", 90)
    registry.lift("c", P(200, 0), end=100)
    registry.refuse("b", P(99, 0), end=0, reason="refused: beyond")
    for site in registry.list():
        assert registry.positions_for(site).position(site.since) >= P(211, 0)
    again = SiteRegistry("a", path)
    assert again.positions == registry.positions
    assert again.positions_for(again.get("c")) == registry.positions_for(registry.get("c"))
    assert again.positions.position(0) >= P(211, 0)
    # A lift made at an end below an existing segment, likewise.
    registry.add("d", "h:3", 0)
    registry.lift("d", P(5, 0), end=0)
    for site in registry.list():
        registry.positions_for(site)
    assert SiteRegistry("a", path).positions == registry.positions


def test_a_registry_written_without_a_lifted_sites_segment_is_read(tmp_path: Path) -> None:
    """What the previous version wrote after a floor raised below a lifted site's segment: c's
    lift began at 100, the segments start at 0. The registry is read, and c's positions never
    fall below its own lift."""
    path = tmp_path / SITES_FILE
    registry = SiteRegistry("a", path)
    registry.add("c", "h:2", 90)
    registry.lift("c", P(200, 0), end=100)
    document: dict[str, Any] = registry.document()
    document["lifts"] = [[0, 100]]
    registry.restore(document)
    c = registry.get("c")
    seen = registry.positions_for(c)
    assert [seen.position(o) for o in (90, 99, 100)] == [P(201, 0), P(210, 0), P(211, 0)]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_positions_stay_whole_across_losses(data: st.DataObject) -> None:
    """Appends, declarations, lifts, floors raised, and losses of the queue's tail (its end goes
    back; the registry is fitted to it as at open, knowing the highest position given): every
    site's positions read and rise with its records, a lifted site always has the segment its
    lift began, each position names one record, and after a loss every record takes a
    position above all those given before it."""
    registry = SiteRegistry("a", None)
    end = 0
    given_before = NONE
    floor_from = 0  # records from here on were stored after the last loss
    for step in range(data.draw(st.integers(1, 14))):
        action = data.draw(st.sampled_from(["append", "declare", "lift", "raise", "lose"]))
        sites = registry.list()
        if action == "append":
            end += data.draw(st.integers(1, 4))
        elif action == "declare" and len(sites) < 6:
            registry.add(f"s{step}", "h:1", end)
        elif action == "lift" and sites:
            site = data.draw(st.sampled_from(sites))
            if site.heard:
                continue
            first = registry.positions_for(site).position(site.since)
            learned = data.draw(st.integers(first, first + P(30, 0)))
            registry.lift(site.site_id, learned, end)
        elif action == "raise" and sites:
            site = data.draw(st.sampled_from(sites))
            registry.refuse(site.site_id, data.draw(st.integers(0, P(60, 0))), end, "refused")
        elif action == "lose" and sites:
            given_before = max(given_before, _highest_given(registry, end))
            end = data.draw(st.integers(0, end))
            registry.fit_queue_end(end, {sites[0].site_id: given_before})
            floor_from = end
    owner: dict[int, int] = {}
    views = [(registry.positions, 0)]
    views += [(registry.positions_for(s), s.since) for s in registry.list()]
    segments = dict(registry.positions.segments)
    for site in registry.list():
        if site.lift:
            assert segments.get(site.lifted_below, -1) >= site.lift, "the segment its lift began"
    for view, since in views:
        seen = [view.position(o) for o in range(since, end + 3)]
        assert seen == sorted(set(seen)), "positions rise with offsets"
        for offset, at in zip(range(since, end + 3), seen, strict=True):
            assert owner.setdefault(at, offset) == offset, f"{at} names two records"
            assert view.record_of(at) == offset
            if offset >= floor_from:
                assert at > given_before, "a position given before the loss repeats"


def _highest_given(registry: SiteRegistry, end: int) -> int:
    views = [registry.positions, *(registry.positions_for(s) for s in registry.list())]
    return max(view.position(end) - 1 for view in views)


def test_a_change_a_sender_learned_counts_from_the_settled_end(tmp_path: Path) -> None:
    """On a cluster the records above the high watermark may be cut by a failover: a lift or a
    raised floor counts from the settled end, as a new site's ``since`` does."""

    async def main() -> None:
        ends: list[int] = []
        async with source_site(tmp_path) as site:
            await site.add_site("b", "127.0.0.1:1")
            await transmit(site, ["b"], 5)

            async def settled_end() -> int:
                return 3  # records 3 and 4 are not in sync yet

            site.queue.settled_end = settled_end  # type: ignore[method-assign]

            def change(end: int) -> Any:
                ends.append(end)
                return site.registry.get("b")

            await site.change_site(change)
        assert ends == [3]

    asyncio.run(main())


# -- snapshot ids ----------------------------------------------------------------------------------


def test_snapshot_ids_never_repeat_after_a_lost_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b started snapshot 5 of this source's lost incarnation and applied snapshot 4. The
    rebuilt source's requests start at offset 0 again; its next snapshot id must be above 5,
    or a snapshot it breaks off is followed by deltas (the sink's started would be below its
    applied) - and the floor is kept."""

    async def main() -> None:
        async with source_queue(tmp_path) as (queue, snapshots):
            queue.registry.add("b", "h:1", queue.next_offset)
            sender = sender_for(queue, snapshots, "b")
            reported = progress(snapshot_started=5, snapshot_transferred=4, snapshot_applied=4)
            asked: list[int] = []

            def requested() -> bool:
                wanted = snapshots._wanted.get("b")
                asked.extend([] if wanted is None else [wanted.snapshot])
                return bool(asked)

            with answering(monkeypatch, [FakeCall(reported)]):
                await run_until(sender, requested)
            assert asked and asked[0] > 5, asked
        async with source_queue(tmp_path) as (queue, snapshots):
            assert (await snapshots.request(queue.registry.get("b"))).snapshot > asked[0]

    asyncio.run(main())


# -- room for positions ----------------------------------------------------------------------------


def test_a_lift_with_no_room_left_is_refused_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A registry whose floor already stands near 2**62 (the previous version believed a report
    just under it): a site's lift cannot fit. Its sender says so in the site's status and the
    log, and sends nothing."""

    async def main() -> None:
        async with source_queue(tmp_path) as (queue, snapshots):
            queue.registry.add("c", "h:2", 0)
            await transmit(queue, ["c"], 10)
            document = queue.registry.document()
            document["lifts"] = [[10, MAX_RECORD - 20]]
            queue.registry.restore(document)
            before = queue.registry.document()
            sender = sender_for(queue, snapshots, "c")
            call = FakeCall(progress(last_processed=P(5, 0)))
            with answering(monkeypatch, [call]):
                await run_until(sender, lambda: "site c" in sender.status.reason)
            assert "site c" in sender.status.reason and "nothing sent" in sender.status.reason
            assert call.delta_positions() == [] and queue.registry.document() == before

    with caplog.at_level(logging.WARNING, logger="tidelog.sites"):
        asyncio.run(main())
    assert any("site c" in r.getMessage() and "room" in r.getMessage() for r in caplog.records)


# -- a broken snapshot and the first contact -------------------------------------------------------


def test_a_broken_snapshot_is_sent_again_even_when_nothing_was_replicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink started a snapshot and never received it whole, and has no delta: the "nothing
    replicated yet" shortcut (deltas from the site's ``since``) must not skip the snapshot."""

    async def main() -> None:
        async with source_queue(tmp_path) as (queue, snapshots):
            queue.registry.add("b", "h:1", queue.next_offset)
            await transmit(queue, ["b"], 3)
            sender = sender_for(queue, snapshots, "b")
            call = FakeCall(progress(snapshot_started=0))
            states: list[SyncState] = []

            def decided() -> bool:
                states.append(sender.session.state)
                return bool(call.delta_positions()) or "b" in snapshots._wanted

            with answering(monkeypatch, [call]):
                await run_until(sender, decided)
            assert call.delta_positions() == [] and states[-1] is SyncState.SNAPSHOT_SYNC

    asyncio.run(main())


def test_a_new_site_with_nothing_started_still_takes_the_shortcut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with source_queue(tmp_path) as (queue, snapshots):
            queue.registry.add("b", "h:1", queue.next_offset)
            answered = await transmit(queue, ["b"], 3)
            sender = sender_for(queue, snapshots, "b")
            call = FakeCall(progress())
            with answering(monkeypatch, [call]):
                await run_until(sender, lambda: len(call.delta_positions()) == 3)
            assert call.delta_positions() == answered

    asyncio.run(main())
