"""Publishing through the broker: optimistic concurrency, oversized messages, read-only and
paused partitions. Every refused publish writes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.errors import IncorrectOffset, MessageTooLarge, PartitionReadonly, StreamNotFound
from tidelog.log import NewRecord

OCC = StreamConfig(optimistic_concurrency=True)


def test_expected_offset_on_an_occ_stream(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", OCC)
            log = broker.partition("s", 0).log
            assert list((await broker.publish("s", 0, [b"a"], expected_offset=0)).offsets) == [0]
            published = await broker.publish("s", 0, [b"b", b"c"], expected_offset=1)
            assert list(published.offsets) == [1, 2]
            for wrong in (0, 2, 4, 100):
                with pytest.raises(IncorrectOffset, match="incorrect expected offset") as raised:
                    await broker.publish("s", 0, [b"x", b"y"], expected_offset=wrong)
                assert (raised.value.expected, raised.value.actual) == (wrong, 3)
                assert log.newest_offset == 2 and log.high_watermark == 2
            # None skips the check.
            assert list((await broker.publish("s", 0, [b"d"])).offsets) == [3]
            assert [v for b in log.forward_reader(0) for v in b.values()] == [
                b"a",
                b"b",
                b"c",
                b"d",
            ]

    asyncio.run(body())


def test_expected_offset_is_ignored_without_occ(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            assert list((await broker.publish("s", 0, [b"a"], expected_offset=7)).offsets) == [0]
            assert list((await broker.publish("s", 0, [b"b"], expected_offset=0)).offsets) == [1]

    asyncio.run(body())


def test_concurrent_occ_writers_exactly_one_wins_each_offset(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", OCC)
            winners: list[str] = []

            async def writer(name: str) -> None:
                for _ in range(20):
                    expected = broker.partition("s", 0).log.next_offset
                    await asyncio.sleep(0)  # let the others read the same offset
                    try:
                        await broker.publish("s", 0, [name.encode()], expected_offset=expected)
                    except IncorrectOffset:
                        continue
                    winners.append(name)

            await asyncio.gather(*(writer(f"w{i}") for i in range(4)))
            log = broker.partition("s", 0).log
            stored = [v.decode() for b in log.forward_reader(0) for v in b.values()]
            assert stored == winners
            assert log.high_watermark == len(winners) - 1

    asyncio.run(body())


def test_a_message_over_the_limit_is_refused_with_both_sizes(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(max_message_bytes=1000))
            await broker.publish("s", 0, [b"x" * 1000])  # at the limit: accepted
            batch = [b"small", NewRecord(b"v" * 990, key=b"k" * 11), b"small"]
            with pytest.raises(MessageTooLarge) as raised:
                await broker.publish("s", 0, batch)
            assert (raised.value.size, raised.value.limit, raised.value.index) == (1001, 1000, 1)
            assert "1001" in str(raised.value) and "1000" in str(raised.value)
            log = broker.partition("s", 0).log
            assert log.high_watermark == 0, "nothing of the refused batch is written"

    asyncio.run(body())


def test_readonly_refuses_and_paused_resumes(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            broker.set_readonly("s", [1], True)
            with pytest.raises(PartitionReadonly, match="readonly partition"):
                await broker.publish("s", 1, [b"x"])
            assert list((await broker.publish("s", 0, [b"x"])).offsets) == [0]
            # Paused and read-only: still refused, and left paused.
            broker.pause("s", [1], resume_all=False)
            with pytest.raises(PartitionReadonly):
                await broker.publish("s", 1, [b"x"])
            assert broker.partition("s", 1).paused
            # Paused only: the publish resumes it (only it, without resume_all).
            broker.pause("s", None, resume_all=False)
            broker.set_readonly("s", None, False)
            assert list((await broker.publish("s", 0, [b"y"])).offsets) == [1]
            assert [p.paused for p in broker.stream("s").partitions] == [False, True]
            with pytest.raises(StreamNotFound):
                await broker.publish("nope", 0, [b"x"])

    asyncio.run(body())
