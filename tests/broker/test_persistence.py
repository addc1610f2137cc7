"""Stream metadata survives a broker restart (close, then a new Broker on the same data_dir):
streams, their settings and partitions, paused/read-only flags, ``resume_all``, the broker id and
the data itself; deleted streams stay deleted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import Partition0, broker_config, running

from tidelog.broker import StreamConfig
from tidelog.errors import StreamNotFound
from tidelog.wire import CURSORS_STREAM

SETTINGS = StreamConfig(
    partitions=3,
    subject="orders.subject",
    retention_messages=100,
    segment_max_bytes=8192,
    optimistic_concurrency=True,
)


def test_streams_settings_and_flags_survive_a_restart(tmp_path: Path) -> None:
    config = broker_config(tmp_path)

    async def first_run() -> tuple[str, dict[str, int], list[tuple[int, int]]]:
        async with running(config) as broker:
            broker.create_stream("orders", SETTINGS)
            broker.create_stream("audit")
            records = Partition0(broker, "orders").append([0, 1, 2], [3])
            await broker.publish("orders", 2, [b"p2-0", b"p2-1"])
            await broker.publish("audit", 0, [b"a0"])
            broker.pause("orders", [1, 2], resume_all=False)
            broker.set_readonly("audit", None, True)
            created = {name: s.created_ns for name, s in broker.streams.items()}
            return broker.broker_id, created, records

    async def second_run(
        broker_id: str, created: dict[str, int], records: list[tuple[int, int]]
    ) -> None:
        async with running(config) as broker:
            assert set(broker.streams) == {CURSORS_STREAM, "orders", "audit"}
            assert broker.broker_id == broker_id
            orders = broker.stream("orders")
            assert orders.config == SETTINGS
            assert orders.subject == "orders.subject"
            assert {n: s.created_ns for n, s in broker.streams.items()} == created
            assert [p.paused for p in orders.partitions] == [False, True, True]
            assert [p.readonly for p in orders.partitions] == [False, False, False]
            # A paused partition still reports the offsets it holds.
            assert orders.partition(2).high_watermark == 1
            assert orders.partition(2).newest_offset == 1
            assert orders.partition(1).high_watermark == -1
            audit = broker.stream("audit")
            assert [p.readonly for p in audit.partitions] == [True]
            assert not audit.partition(0).paused
            log = orders.partition(0).log
            assert log.high_watermark == 3
            got = [
                (o, t)
                for batch in log.forward_reader(0)
                for o, t in zip(batch.offsets.tolist(), batch.timestamps.tolist(), strict=True)
            ]
            assert got == records
            # Publishing resumes a paused partition; that too is remembered.
            assert list((await broker.publish("orders", 2, [b"p2-2"])).offsets) == [2]

    async def third_run() -> None:
        async with running(config) as broker:
            orders = broker.stream("orders")
            assert [p.paused for p in orders.partitions] == [False, True, False]
            assert orders.partition(2).log.high_watermark == 2

    broker_id, created, records = asyncio.run(first_run())
    asyncio.run(second_run(broker_id, created, records))
    asyncio.run(third_run())


def test_resume_all_survives_a_restart(tmp_path: Path) -> None:
    config = broker_config(tmp_path)

    async def pause() -> None:
        async with running(config) as broker:
            broker.create_stream("s", StreamConfig(partitions=3))
            broker.pause("s", [0, 1, 2], resume_all=True)

    async def wake_one() -> None:
        async with running(config) as broker:
            stream = broker.stream("s")
            assert [p.paused for p in stream.partitions] == [True, True, True]
            assert stream.resume_all
            await broker.publish("s", 1, [b"wake"])
            assert [p.paused for p in stream.partitions] == [False, False, False]

    async def check() -> None:
        async with running(config) as broker:
            stream = broker.stream("s")
            assert [p.paused for p in stream.partitions] == [False, False, False]
            assert not stream.resume_all
            assert stream.partition(1).log.high_watermark == 0

    asyncio.run(pause())
    asyncio.run(wake_one())
    asyncio.run(check())


def test_a_deleted_stream_stays_deleted(tmp_path: Path) -> None:
    config = broker_config(tmp_path)

    async def create_and_delete() -> None:
        async with running(config) as broker:
            broker.create_stream("gone", StreamConfig(partitions=2))
            await broker.publish("gone", 0, [b"x", b"y"])
            await broker.delete_stream("gone")

    async def check() -> None:
        async with running(config) as broker:
            assert "gone" not in broker.streams
            with pytest.raises(StreamNotFound):
                broker.stream("gone")
            # The name is free again, and the new stream starts empty.
            broker.create_stream("gone")
            assert broker.partition("gone", 0).log.high_watermark == -1

    asyncio.run(create_and_delete())
    assert not (tmp_path / "streams" / "gone").exists()
    asyncio.run(check())


def test_broker_id_is_generated_once(tmp_path: Path) -> None:
    config = broker_config(tmp_path)

    async def broker_id() -> str:
        async with running(config) as broker:
            return broker.broker_id

    first = asyncio.run(broker_id())
    assert first
    assert asyncio.run(broker_id()) == first
    assert (tmp_path / "broker-id").read_text().strip() == first
