"""The source side's delta queue (``tidelog/sites/send_queue.py``) and the site registry
(``registry.py``) on an in-process broker: payloads stored once and tagged, bad calls refused
whole, the tag index rebuilt after a restart, numbers of removed sites never leaking."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker
from tidelog.errors import InvalidArgument, SiteExists, SiteNotFound
from tidelog.sites.envelope import decode, split_position
from tidelog.sites.registry import SITES_FILE, SiteRegistry
from tidelog.sites.send_queue import DELTA_QUEUE, SendQueue, Transmission


def opened(broker: Broker, data_dir: Path) -> SendQueue:
    registry = SiteRegistry("a", data_dir / SITES_FILE)
    queue = SendQueue(broker, registry)
    queue.open()
    return queue


def test_payloads_are_stored_once_and_read_per_site(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            queue.registry.add("b", "127.0.0.1:9301", queue.next_offset)
            queue.registry.add("c", "127.0.0.1:9302", queue.next_offset)
            positions = await queue.transmit(
                "app",
                [
                    Transmission(b"to-b", ["b"]),
                    Transmission(b"to-both", ["b", "c"]),
                    Transmission(b"to-c", ["c"]),
                ],
            )
            assert [split_position(p) for p in positions] == [(0, 0), (0, 1), (0, 2)]
            more = await queue.transmit("app", [Transmission(b"later-c", ["c"])])
            assert split_position(more[0]) == (1, 0)
            b, c = queue.registry.get("b").number, queue.registry.get("c").number
            assert queue.index.records_for(b, 0, 10) == [0]
            assert queue.index.records_for(c, 0, 10) == [0, 1]
            (batch,) = list(queue.partition.log.forward_reader(0))
            first = decode(batch.values()[0])
            assert [e.payload for e in first.entries] == [b"to-b", b"to-both", b"to-c"]
            assert first.client == "app"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("client", "items", "error", "match"),
    [
        ("app", [Transmission(b"x", ["nowhere"])], SiteNotFound, "unknown site 'nowhere'"),
        ("app", [Transmission(b"x", [])], InvalidArgument, "at least one destination"),
        ("app", [Transmission(b"x", ["a"])], InvalidArgument, "this site"),
        ("app", [], InvalidArgument, "at least one payload"),
        ("no.dots", [Transmission(b"x", ["b"])], InvalidArgument, "invalid client name"),
        ("app", [Transmission(b"x" * 300_000, ["b"])], InvalidArgument, "over the limit"),
        # one bad item refuses the whole call
        ("app", [Transmission(b"ok", ["b"]), Transmission(b"x", ["zz"])], SiteNotFound, "zz"),
    ],
)
def test_a_bad_call_stores_nothing(
    tmp_path: Path, client: str, items: list[Transmission], error: type, match: str
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            queue.registry.add("b", "127.0.0.1:9301", queue.next_offset)
            with pytest.raises(error, match=match):
                await queue.transmit(client, items)
            assert queue.next_offset == 0

    asyncio.run(main())


def test_the_tag_index_is_rebuilt_after_a_restart(tmp_path: Path) -> None:
    async def first() -> list[list[int]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            for i in range(20):
                destinations = ["b"] if i % 3 else ["b", "c"]
                await queue.transmit("app", [Transmission(b"%d" % i, destinations)])
            return [queue.index.records_for(n, 0, 100) for n in range(2)]

    async def second() -> list[list[int]]:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            assert [s.site_id for s in queue.registry.list()] == ["b", "c"]
            return [queue.index.records_for(n, 0, 100) for n in range(2)]

    before = asyncio.run(first())
    assert before[0] == list(range(20)) and len(before[1]) == 7
    assert asyncio.run(second()) == before


def test_a_new_site_never_inherits_a_removed_sites_entries(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            old = queue.registry.add("old", "h:1", queue.next_offset)
            await queue.transmit("app", [Transmission(b"for-old", ["old"])])
            queue.registry.remove("old")
            new = queue.registry.add("new", "h:2", queue.next_offset)
            assert new.number == old.number  # the number is reused ...
            await queue.transmit("app", [Transmission(b"for-new", ["new"])])
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            # ... but after a rebuild the old record is not listed under it.
            assert queue.index.records_for(new.number, 0, 10) == [1]

    asyncio.run(main())


def test_storage_is_about_the_payload_bytes_whatever_the_destinations(tmp_path: Path) -> None:
    async def main() -> float:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site, port in (("b", 1), ("c", 2)):
                queue.registry.add(site, f"h:{port}", queue.next_offset)
            payload = bytes(range(100))
            for _ in range(20):
                await queue.transmit("app", [Transmission(payload, ["b", "c"]) for _ in range(100)])
            stored = queue.partition.log.size_bytes + 20 * (queue.next_offset)  # + index entries
            return stored / (2000 * len(payload))

    amplification = asyncio.run(main())
    assert amplification < 1.1, amplification


def test_the_registry_refuses_what_it_cannot_route(tmp_path: Path) -> None:
    registry = SiteRegistry("a", tmp_path / SITES_FILE)
    registry.add("b", "127.0.0.1:9301", 0)
    with pytest.raises(SiteExists):
        registry.add("b", "127.0.0.1:9302", 0)
    for site_id, address, match in (
        ("a", "h:1", "own id"),
        ("bad.id", "h:1", "invalid site id"),
        ("c", "no-port", "HOST:PORT"),
        ("c", "h:70000", "HOST:PORT"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            registry.add(site_id, address, 0)
    # Docker Compose service names hold underscores.
    registry.add("d", "tidelog_site_d:9301", 0)
    registry.add("e", "_svc.site-e.example:9302", 0)
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        registry.add("f", "under_score..host:1", 0)
    assert SiteRegistry("a", tmp_path / SITES_FILE).list() == registry.list()
    (tmp_path / SITES_FILE).write_text("{not json")
    with pytest.raises(InvalidArgument, match="cannot read the site registry"):
        SiteRegistry("a", tmp_path / SITES_FILE)
    assert DELTA_QUEUE.startswith("__")


def test_a_sender_reads_whole_records_up_to_its_limits(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            queue.registry.add("b", "h:1", queue.next_offset)
            queue.registry.add("c", "h:2", queue.next_offset)
            for call in range(5):
                items = [
                    Transmission(b"%d-%03d" % (call, i), ["b"] if i % 2 else ["c"])
                    for i in range(300)
                ]
                await queue.transmit("app", items)
            b = queue.registry.get("b").number
            first = queue.read_for(b, -1, limit=200)
            assert len(first) == 150 * 2  # whole records: 150 entries for b in each
            assert [e.payload for e in first[:2]] == [b"0-001", b"0-003"]
            assert all(x.position < y.position for x, y in itertools.pairwise(first))
            rest = queue.read_for(b, first[-1].position, limit=10_000)
            assert len(rest) == 3 * 150 and rest[0].payload == b"2-001"
            small = queue.read_for(b, -1, limit=10_000, max_bytes=100)
            assert len(small) == 150  # the first record, however small max_bytes is
            middle = queue.read_for(b, first[10].position, limit=1)
            assert middle[0].position == first[11].position and len(middle) == 139

    asyncio.run(main())


def test_the_index_counts_each_sites_entries_whatever_the_mix_of_destinations(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = opened(broker, tmp_path)
            for site_id in ("b", "c", "d"):
                queue.registry.add(site_id, "127.0.0.1:1", queue.next_offset)
            choices = [["b"], ["c", "d"], ["b", "c", "d"], ["d"], ["d", "b"]]
            items = [Transmission(b"%d" % i, choices[i * 7 % 5]) for i in range(300)]
            positions = await queue.transmit("app", items[:120])
            positions += await queue.transmit("app", items[120:])
            assert positions == sorted(set(positions)) and len(positions) == 300
            for site_id in ("b", "c", "d"):
                number = queue.registry.get(site_id).number
                wanted = sum(site_id in item.destinations for item in items)
                assert queue.index.entries_for(number, 0) == wanted
                got = queue.read_for(number, -1, 1000)
                assert [e.payload for e in got] == [
                    i.payload for i in items if site_id in i.destinations
                ]

    asyncio.run(main())
