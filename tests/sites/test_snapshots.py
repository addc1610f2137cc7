"""Snapshot sync's two ends on an in-process broker: the source's snapshot queue
(``tidelog/sites/snapshots.py``: only the wanted snapshot is accepted, begin / entries / end in
that order, refused calls store nothing) and the sink (``sink.py``: start, entries and end land
in the receive queues as marked records, and what it persisted survives a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker
from tidelog.errors import FailedPrecondition, InvalidArgument, SiteNotFound
from tidelog.log import FlushPolicy, LogConfig
from tidelog.sites.envelope import EntryKind, RoutedEntry, position
from tidelog.sites.negotiation import NONE, Outcome, SinkProgress, negotiate
from tidelog.sites.registry import SITES_FILE, SiteRegistry
from tidelog.sites.send_queue import SendQueue, Transmission
from tidelog.sites.sink import Sink, SnapshotFrame, receive_queue
from tidelog.sites.snapshots import Snapshots, SnapshotTrimmed
from tidelog.sites.windows import Framed
from tidelog.wire import KIND_HEADER, POSITION_HEADER, SNAPSHOT_REQUESTS


def source(broker: Broker, data_dir: Path) -> Snapshots:
    registry = SiteRegistry("a", data_dir / SITES_FILE)
    queue = SendQueue(broker, registry)
    queue.open()
    snapshots = Snapshots(broker, registry, queue)
    snapshots.open()
    for site_id in ("b", "c"):
        registry.add(site_id, "127.0.0.1:1", queue.next_offset)
    return snapshots


def test_a_snapshot_is_one_begin_entries_and_one_end_for_the_wanted_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            snapshots = source(broker, tmp_path)
            await snapshots.deltas.transmit("kv", [Transmission(b"d0", ["b"])])  # record 0
            b, c = snapshots.registry.get("b"), snapshots.registry.get("c")
            wanted = await snapshots.request(b)
            other = await snapshots.request(c)
            requests = broker.find_stream(SNAPSHOT_REQUESTS)
            assert requests is not None and requests.partitions[0].newest_offset == 1

            with pytest.raises(FailedPrecondition, match="not begun"):
                await snapshots.write("b", wanted.snapshot, [("kv", b"x")])
            with pytest.raises(FailedPrecondition, match="waits for snapshot 0, not snapshot 7"):
                await snapshots.write("b", 7, [], begin=True)
            with pytest.raises(SiteNotFound):
                await snapshots.write("nowhere", 0, [], begin=True)
            with pytest.raises(InvalidArgument, match="invalid client name"):
                await snapshots.write("b", wanted.snapshot, [("bad name", b"x")], begin=True)
            assert wanted.start_offset is None, "a refused begin stores nothing"

            covered = await snapshots.write("b", wanted.snapshot, [("kv", b"k1")], begin=True)
            assert covered == position(1, 0) - 1  # the delta queue's last entry
            await snapshots.write("c", other.snapshot, [("kv", b"for-c")], begin=True)
            with pytest.raises(FailedPrecondition, match="is begun"):
                await snapshots.write("b", wanted.snapshot, [], begin=True)
            await snapshots.write("b", wanted.snapshot, [("kv", b"k2"), ("jobs", b"j1")])
            await snapshots.write("b", wanted.snapshot, [], end=True)
            with pytest.raises(FailedPrecondition, match="is ended"):
                await snapshots.write("b", wanted.snapshot, [("kv", b"late")])

            assert wanted.start_offset is not None
            records = snapshots.read(wanted, wanted.start_offset, 100)
            assert [(r.kind, r.client, r.payloads) for r in records] == [
                (EntryKind.SNAPSHOT_START, "snapshot", (covered.to_bytes(8, "big"),)),
                (EntryKind.SNAPSHOT_ENTRY, "kv", (b"k1",)),
                (EntryKind.SNAPSHOT_ENTRY, "kv", (b"k2",)),
                (EntryKind.SNAPSHOT_ENTRY, "jobs", (b"j1",)),
                (EntryKind.SNAPSHOT_END, "snapshot", ((-1).to_bytes(8, "big", signed=True),)),
            ], "c's snapshot, written in between, is not read for b"
            assert snapshots.read(wanted, records[2].offset, 1)[0].payloads == (b"k2",)

            replaced = await snapshots.request(b)  # a newer request replaces the older
            with pytest.raises(FailedPrecondition, match="not snapshot 0"):
                await snapshots.write("b", wanted.snapshot, [], begin=True)
            assert replaced.snapshot == 2

    asyncio.run(main())


def received(broker: Broker, client: str, source: str) -> list[tuple[str, int, bytes]]:
    """(kind, position, payload) of each record of a receive queue."""
    stream = broker.find_stream(receive_queue(client, source))
    assert stream is not None
    found = []
    for batch in stream.partitions[0].log.forward_reader(0):
        for headers, value in zip(batch.headers(), batch.values(), strict=True):
            kind = headers.get(KIND_HEADER, b"delta").decode()
            found.append((kind, int.from_bytes(headers[POSITION_HEADER], "big"), value))
    return found


def batch(prev: int, *entries: tuple[int, str, bytes]) -> Framed[Sequence[RoutedEntry]]:
    routed = tuple(RoutedEntry(p, c, v) for p, c, v in entries)
    return Framed(prev, routed[-1].position, routed)


def test_a_sink_applies_a_snapshot_into_every_queue_of_its_source(tmp_path: Path) -> None:
    async def first() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            await sink.receive("a", batch(NONE, (3, "audit", b"a3"), (5, "kv", b"old")))
            with pytest.raises(InvalidArgument, match="was not started"):
                await sink.receive_snapshot("a", SnapshotFrame(4, 100, entries=[("kv", b"x")]))
            assert await sink.receive_snapshot("a", SnapshotFrame(4, 100, start=True)) is None
            frame = SnapshotFrame(4, 100, entries=[("kv", b"k1"), ("jobs", b"j1")])
            assert await sink.receive_snapshot("a", frame) is None
            assert sink.progress("a").snapshot_started == 4
            assert sink.progress("a").snapshot_applied == NONE
            assert await sink.receive_snapshot("a", SnapshotFrame(4, 100, end=True)) == 4
            assert sink.progress("a") == SinkProgress(4, 4, 4, last_processed=100)
            assert received(broker, "kv", "a") == [
                ("delta", 5, b"old"),
                ("snapshot_start", 100, b""),
                ("snapshot_entry", 100, b"k1"),
                ("snapshot_end", 100, b""),
            ]
            # a client the snapshot does not mention: its state from this source is now empty
            assert [k for k, _, _ in received(broker, "audit", "a")][1:] == [
                "snapshot_start",
                "snapshot_end",
            ]
            assert [k for k, _, _ in received(broker, "jobs", "a")] == [
                "snapshot_start",
                "snapshot_entry",
                "snapshot_end",
            ]
            # deltas resume after the covered position; older ones are duplicates
            assert await sink.receive("a", batch(99, (100, "kv", b"dup"))) == 100
            assert await sink.receive("a", batch(100, (101, "kv", b"new"))) == 101
            # a transfer that breaks: started, never ended
            await sink.receive_snapshot("a", SnapshotFrame(9, 150, start=True))

    async def second() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            progress = sink.progress("a")
            assert progress == SinkProgress(9, 4, 4, last_processed=150)
            assert negotiate(progress, 0).outcome is Outcome.SNAPSHOT, "a new snapshot, whole"

    asyncio.run(first())
    asyncio.run(second())


def test_a_snapshot_retention_cut_into_is_reported_not_shipped_with_a_hole(tmp_path: Path) -> None:
    log = LogConfig(
        flush_policy=FlushPolicy.NEVER,
        retention_age_s=None,
        segment_max_bytes=256,
        retention_messages=2,
    )

    async def main() -> None:
        async with running(broker_config(tmp_path, log=log)) as broker:
            snapshots = source(broker, tmp_path)
            wanted = await snapshots.request(snapshots.registry.get("b"))
            await snapshots.write("b", wanted.snapshot, [], begin=True)
            for i in range(6):  # a record of 300 bytes each: a segment each
                await snapshots.write("b", wanted.snapshot, [("kv", b"%d" % i * 300)])
            assert wanted.start_offset == 0
            assert len(snapshots.read(wanted, 0, 100)) == 7
            await broker.maintain()
            assert snapshots.queue.log.oldest_offset > 0
            with pytest.raises(SnapshotTrimmed, match="snapshot 0 before they were sent"):
                snapshots.read(wanted, 0, 100)

    asyncio.run(main())
