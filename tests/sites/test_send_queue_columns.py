"""The delta queue over columnar records: a data directory of version 1 records still reads,
and the records a transmit decoded serve every site's sender without another read
(``tidelog/sites/send_queue.py``, ``envelope.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.broker.brokertools import broker_config, running
from tests.sites.test_envelope_and_tag_index import encode_version_1

from tidelog.broker import Broker
from tidelog.log import FlushPolicy, LogConfig
from tidelog.sites import queue_reads
from tidelog.sites.envelope import Entry, EntryKind, RoutingRecord, mask_of, split_position
from tidelog.sites.registry import SITES_FILE, SiteRegistry
from tidelog.sites.send_queue import SendQueue, Transmission


def opened(broker: Broker, data_dir: Path) -> SendQueue:
    queue = SendQueue(broker, SiteRegistry("a", data_dir / SITES_FILE))
    queue.open()
    return queue


def counting_reads(queue: SendQueue) -> list[int]:
    """Patch the queue's log so that each reader it opens is counted."""
    opened_at: list[int] = []
    log = queue.partition.log
    original = log.forward_reader

    def forward_reader(start: int, **kwargs: Any) -> Any:
        opened_at.append(start)
        return original(start, **kwargs)

    log.forward_reader = forward_reader  # type: ignore[method-assign]
    return opened_at


def test_version_1_records_read_after_an_upgrade_beside_version_2_ones(tmp_path: Path) -> None:
    async def before_the_upgrade() -> tuple[int, int]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            b = queue.registry.add("b", "h:1", queue.next_offset).number
            c = queue.registry.add("c", "h:2", queue.next_offset).number
            old = [
                RoutingRecord(
                    EntryKind.DELTA,
                    "app",
                    0,
                    tuple(
                        Entry(mask_of([b] if i % 2 else [b, c]), b"v1-%d-%d" % (r, i))
                        for i in range(5)
                    ),
                )
                for r in range(3)
            ]
            await queue.partition.publish([encode_version_1(r) for r in old])
            return b, c

    async def after_it(b: int, c: int) -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            assert queue.records_read_at_open == 3
            await queue.transmit("app", [Transmission(b"v2-%d" % i, ["b", "c"]) for i in range(4)])
            to_b = queue.read_for(b, -1, limit=1000)
            to_c = queue.read_for(c, -1, limit=1000)
            old_b = [b"v1-%d-%d" % (r, i) for r in range(3) for i in range(5)]
            old_c = [b"v1-%d-%d" % (r, i) for r in range(3) for i in range(0, 5, 2)]
            new = [b"v2-%d" % i for i in range(4)]
            assert [e.payload for e in to_b] == old_b + new
            assert [e.payload for e in to_c] == old_c + new
            assert [split_position(e.position)[0] for e in to_c] == [0] * 3 + [1] * 3 + [2] * 3 + [
                3
            ] * 4
            assert queue.index.entries_for(c, 0) == 13

    asyncio.run(after_it(*asyncio.run(before_the_upgrade())))


def test_senders_share_what_a_transmit_decoded(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            b = queue.registry.add("b", "h:1", queue.next_offset).number
            c = queue.registry.add("c", "h:2", queue.next_offset).number
            reads = counting_reads(queue)
            for call in range(10):
                items = [Transmission(b"%d-%d" % (call, i), ["b", "c"]) for i in range(50)]
                await queue.transmit("app", items)
            to_b = queue.read_for(b, -1, limit=10_000)
            to_c = queue.read_for(c, -1, limit=10_000)
            assert reads == []  # both from memory: nothing read or decoded again
            assert list(to_b) == list(to_c) and len(to_b) == 500

    asyncio.run(main())


@pytest.mark.parametrize("kept_bytes", [0, 40, 300, 1 << 20])
def test_reads_are_the_same_from_memory_from_disk_and_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_bytes: int
) -> None:
    """Whatever part of the queue is in memory (none, a record or two, all of it), a site
    reads the same entries as a fresh server reading them all from disk."""
    monkeypatch.setattr(queue_reads, "DECODED_BYTES", kept_bytes)
    choices = [["b"], ["c"], ["b", "c"]]

    async def run(fill: bool) -> list[list[tuple[int, str, bytes]]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            if fill:
                for site_id in ("b", "c"):
                    queue.registry.add(site_id, "h:1", queue.next_offset)
                for call in range(12):
                    items = [
                        Transmission(b"%d.%d" % (call, i), choices[(call + i) % 3])
                        for i in range(1 + call % 4)
                    ]
                    await queue.transmit("app" if call % 2 else "kv", items)
            found = []
            for site_id in ("b", "c"):
                number = queue.registry.get(site_id).number
                entries, after = [], -1
                while batch := queue.read_for(number, after, limit=3):
                    entries += [(e.position, e.client, e.payload) for e in batch]
                    after = batch[-1].position
                found.append(entries)
            return found

    live = asyncio.run(run(fill=True))
    assert asyncio.run(run(fill=False)) == live
    assert sum(len(f) for f in live) == sum(
        len(choices[(call + i) % 3]) for call in range(12) for i in range(1 + call % 4)
    )


DESTINATIONS = [["b"], ["c"], ["b", "c"], ["c", "b"]]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.lists(
            st.tuples(st.binary(max_size=200), st.sampled_from(DESTINATIONS)),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=6,
    ),
    limit=st.integers(1, 50),
)
@example(calls=[[(b"", ["b"])], [(b"", ["b"])]], limit=1)  # found by this test: see read_for
def test_any_calls_read_back_per_site_in_order_across_small_records(
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[list[tuple[bytes, list[str]]]],
    limit: int,
) -> None:
    """Records of at most 1,000 bytes, so a call spreads over several: each site reads exactly
    its payloads, in order, whatever its read limit."""
    data_dir = tmp_path_factory.mktemp("q")
    log = LogConfig(flush_policy=FlushPolicy.NEVER, retention_age_s=None, max_message_bytes=1000)

    async def main() -> None:
        async with running(broker_config(data_dir, log=log)) as broker:
            queue = opened(broker, data_dir)
            for site_id in ("b", "c"):
                queue.registry.add(site_id, "h:1", queue.next_offset)
            positions: list[int] = []
            for call in calls:
                got = await queue.transmit_columns(
                    "app", [p for p, _ in call], [d for _, d in call]
                )
                assert len(got) == len(call)
                positions += got
            assert positions == sorted(set(positions))
            sizes = [len(v) for b in queue.partition.log.forward_reader(0) for v in b.values()]
            assert max(sizes) <= 1000
            if any(sum(len(p) for p, _ in call) > 1000 for call in calls):
                assert len(sizes) > len(calls)  # a call spread over several records
            for site_id in ("b", "c"):
                number = queue.registry.get(site_id).number
                read, after = [], -1
                while batch := queue.read_for(number, after, limit=limit):
                    read += list(batch)
                    after = batch[-1].position
                wanted = [
                    (at, p)
                    for at, (p, d) in zip(positions, (i for c in calls for i in c), strict=True)
                    if site_id in d
                ]
                assert [(e.position, e.payload) for e in read] == wanted

    asyncio.run(main())
