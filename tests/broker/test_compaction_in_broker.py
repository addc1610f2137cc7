"""A stream created with compaction keeps the latest value per key through maintenance; so does
``__cursors``, and the cursors stay right."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.log import NewRecord
from tidelog.wire import CURSORS_STREAM


def test_maintenance_compacts_streams_that_ask_for_it(tmp_path: Path) -> None:
    async def body() -> None:
        config = broker_config(tmp_path)
        async with running(config) as broker:
            broker.create_stream("kv", StreamConfig(compact=True, segment_max_bytes=4096))
            broker.create_stream("plain", StreamConfig(segment_max_bytes=4096))
            for stream in ("kv", "plain"):
                for i in range(200):
                    await broker.publish(stream, 0, [NewRecord(b"v%d" % i, key=b"k%d" % (i % 5))])
            await broker.maintain()
            kv = [r.offset for r in broker.partition("kv", 0).log.forward_reader(0).records()]
            plain = list(broker.partition("plain", 0).log.forward_reader(0).records())
            assert len(plain) == 200  # not compacted
            assert len(kv) < 200
            latest = {
                r.key: r.value for r in broker.partition("kv", 0).log.forward_reader(0).records()
            }
            assert latest == {b"k%d" % k: b"v%d" % (195 + k) for k in range(5)}
            assert kv == sorted(kv)

    asyncio.run(body())


def test_cursors_survive_compaction_of_their_stream_and_a_restart(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            assert broker.stream(CURSORS_STREAM).config.compact
            cursors = broker.partition(CURSORS_STREAM, 0)
            broker.create_stream("orders")
            for i in range(300):
                await broker.cursors.set(f"c{i % 3}", "orders", 0, i)
            cursors.log.roll()
            await broker.maintain()
            remaining = sum(1 for _ in cursors.log.forward_reader(0).records())
            assert remaining <= 3 + 1  # the latest per key, plus what the active segment holds
            assert [await broker.cursors.fetch(f"c{k}", "orders", 0) for k in range(3)] == [
                297,
                298,
                299,
            ]
        async with running(broker_config(tmp_path)) as broker:
            assert [await broker.cursors.fetch(f"c{k}", "orders", 0) for k in range(3)] == [
                297,
                298,
                299,
            ]

    asyncio.run(body())
