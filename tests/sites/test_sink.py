"""The sink side (``tidelog/sites/sink.py``) on an in-process broker: batches applied exactly once
into the receive queues, whatever the order and repeats, across a restart and a full disk."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker
from tidelog.durable import WRITE, faults
from tidelog.errors import DiskFull, InvalidArgument
from tidelog.sites.envelope import RoutedEntry
from tidelog.sites.negotiation import NONE
from tidelog.sites.sink import POSITION_HEADER, Sink, receive_queue
from tidelog.sites.windows import Framed


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    faults.clear()
    yield
    faults.clear()


def batch(prev: int, *entries: tuple[int, str, bytes]) -> Framed[Sequence[RoutedEntry]]:
    routed = tuple(RoutedEntry(p, c, v) for p, c, v in entries)
    return Framed(prev, routed[-1].position, routed)


def received(broker: Broker, client: str, source: str) -> list[tuple[int, bytes]]:
    stream = broker.find_stream(receive_queue(client, source))
    if stream is None:
        return []
    log = stream.partitions[0].log
    if log.high_watermark < 0:
        return []
    found = []
    for b in log.forward_reader(0):
        for headers, value in zip(b.headers(), b.values(), strict=True):
            found.append((int.from_bytes(headers[POSITION_HEADER], "big"), value))
    return found


B1 = batch(NONE, (3, "orders", b"o3"), (5, "audit", b"a5"), (7, "orders", b"o7"))
B2 = batch(7, (9, "orders", b"o9"), (10, "orders", b"o10"))
B3 = batch(10, (12, "audit", b"a12"))


def test_batches_land_in_their_clients_receive_queues(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            assert await sink.receive("a", B1) == 7
            assert await sink.receive("a", B2) == 10
            assert received(broker, "orders", "a") == [
                (3, b"o3"),
                (7, b"o7"),
                (9, b"o9"),
                (10, b"o10"),
            ]
            assert received(broker, "audit", "a") == [(5, b"a5")]

    asyncio.run(main())


def test_early_batches_wait_and_repeats_are_dropped(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            assert await sink.receive("a", B3) == NONE  # early: waits for B1 and B2
            assert await sink.receive("a", B2) == NONE
            assert await sink.receive("a", B1) == 12  # the gap closes: all three apply
            for resent in (B1, B2, B3):
                assert await sink.receive("a", resent) == 12
            assert [p for p, _ in received(broker, "orders", "a")] == [3, 7, 9, 10]
            assert [p for p, _ in received(broker, "audit", "a")] == [5, 12]

    asyncio.run(main())


def test_after_a_restart_the_queues_say_what_was_applied(tmp_path: Path) -> None:
    async def first() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            await sink.receive("a", B1)
            await sink.receive("other", batch(NONE, (1, "orders", b"x1")))

    async def second() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            assert sink.last_processed("a") == 7
            assert sink.last_processed("other") == 1
            assert sink.last_processed("never") == NONE
            assert await sink.receive("a", B1) == 7  # the resend of an applied batch: dropped
            assert await sink.receive("a", B2) == 10
            assert [p for p, _ in received(broker, "orders", "a")] == [3, 7, 9, 10]

    asyncio.run(first())
    asyncio.run(second())


def test_a_failed_append_is_applied_once_when_resent(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            await sink.receive("a", batch(NONE, (1, "orders", b"o1")))
            faults.fail(receive_queue("audit", "a"), op=WRITE)
            with pytest.raises(DiskFull):
                await sink.receive("a", B1)  # o3 applied, a5 fails, o7 never tried
            assert faults.hits, "the fault was never reached"
            assert sink.last_processed("a") == 3
            assert (
                await sink.receive(
                    "a", batch(1, *[(e.position, e.client, e.payload) for e in B1.entries])
                )
                == 7
            )
            assert [p for p, _ in received(broker, "orders", "a")] == [1, 3, 7]
            assert [p for p, _ in received(broker, "audit", "a")] == [5]

    asyncio.run(main())


def test_a_streams_first_batch_from_an_unknown_source_starts_its_window(tmp_path: Path) -> None:
    """The sender of a site declared after it stored entries starts after the last position
    before the site's ``since``: its first batch on a stream says so, and applies."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            late = batch(65535, (65536, "late", b"hello"))
            assert await sink.receive("x", late) == NONE  # not the stream's first: early
            assert await sink.receive("a", late, opening=True) == 65536
            assert received(broker, "late", "a") == [(65536, b"hello")]
            following = batch(65536, (131072, "late", b"again"))
            assert await sink.receive("a", following, opening=True) == 131072  # keeps its place
            stale = batch(7, (9, "late", b"stale"))
            assert await sink.receive("a", stale, opening=True) == 131072  # a duplicate
            assert [p for p, _ in received(broker, "late", "a")] == [65536, 131072]

    asyncio.run(main())


def test_a_failed_first_append_reopens_where_the_sender_started(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            faults.fail(receive_queue("late", "a"), op=WRITE)
            with pytest.raises(DiskFull):
                await sink.receive("a", batch(65535, (65536, "late", b"hello")), opening=True)
            faults.clear()
            # The resend is not the stream's first batch: the window kept the sender's start.
            assert await sink.receive("a", batch(65535, (65536, "late", b"hello"))) == 65536
            assert received(broker, "late", "a") == [(65536, b"hello")]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("source", "bad", "match"),
    [
        ("a", Framed(NONE, 5, (RoutedEntry(5, "c", b""), RoutedEntry(4, "c", b""))), "in order"),
        ("a", Framed(NONE, 9, (RoutedEntry(5, "c", b""),)), "must end with the entry at 9"),
        ("a", Framed(NONE, 5, (RoutedEntry(5, "no.dots", b""),)), "invalid site id"),
        ("b", B1, "this site"),
    ],
)
def test_malformed_batches_apply_nothing(
    tmp_path: Path, source: str, bad: Framed[Sequence[RoutedEntry]], match: str
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b")
            with pytest.raises(InvalidArgument, match=match):
                await sink.receive(source, bad)
            assert sink.last_processed(source) == NONE
            assert not [s for s in broker.list_streams() if s.name.startswith("__lrq_recv")]

    asyncio.run(main())
