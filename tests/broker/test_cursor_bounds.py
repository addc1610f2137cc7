"""What a cursor may name and how many a stream may have (``broker/cursors.py``, "Bounds"):
nothing is stored for a refused set, and the count of ids per stream survives a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.broker.config import MAX_CURSOR_ID_BYTES
from tidelog.errors import (
    DiskFull,
    InvalidArgument,
    LimitReached,
    PartitionNotFound,
    StreamNotFound,
)
from tidelog.wire import CURSORS_STREAM


def test_a_cursor_names_a_partition_that_exists_and_an_id_of_bounded_length(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            with pytest.raises(StreamNotFound):
                await broker.cursors.set("c", "missing", 0, 1)
            with pytest.raises(PartitionNotFound):
                await broker.cursors.set("c", "s", 2, 1)
            with pytest.raises(PartitionNotFound):
                await broker.cursors.set("c", "s", -1, 1)
            with pytest.raises(InvalidArgument, match=f"at most {MAX_CURSOR_ID_BYTES}"):
                await broker.cursors.set("é" * (MAX_CURSOR_ID_BYTES // 2 + 1), "s", 0, 1)
            await broker.cursors.set("c" * MAX_CURSOR_ID_BYTES, "s", 1, 3)  # the longest id
            assert await broker.cursors.fetch("c" * MAX_CURSOR_ID_BYTES, "s", 1) == 3
            written = broker.partition(CURSORS_STREAM, 0).log.high_watermark
            assert written == 0, "only the accepted set was stored"

    asyncio.run(body())


def test_a_stream_has_at_most_max_cursors_per_stream_ids_also_after_a_restart(
    tmp_path: Path,
) -> None:
    config = broker_config(tmp_path, max_cursors_per_stream=3, cursor_partitions=2)

    async def fill() -> None:
        async with running(config) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            broker.create_stream("t")
            for name in ("a", "b", "c"):
                await broker.cursors.set(name, "s", 0, 1)
            await broker.cursors.set("a", "s", 1, 2)  # another partition of a known id
            await broker.cursors.set("c", "s", 0, 5)  # a known id again
            with pytest.raises(LimitReached, match="max_cursors_per_stream") as refused:
                await broker.cursors.set("d", "s", 0, 1)
            assert refused.value.setting == "max_cursors_per_stream"
            await broker.cursors.set("d", "t", 0, 1)  # each stream has its own count
            assert await broker.cursors.fetch("d", "s", 0) == -1

    async def after_restart() -> None:
        async with running(config) as broker:
            assert broker.cursors.cursor_ids("s") == 3
            with pytest.raises(LimitReached):
                await broker.cursors.set("e", "s", 1, 1)
            await broker.cursors.set("b", "s", 1, 7)
            assert await broker.cursors.fetch("b", "s", 1) == 7

    asyncio.run(fill())
    asyncio.run(after_restart())


def test_concurrent_first_sets_of_an_id_count_it_once_whichever_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first sets of one new id at once, the first failing (a full disk): the second one
    stored the id, so it stays counted; and an id whose every set failed is not counted."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            calls = 0
            for partition in broker.cursors.stream.partitions:
                publish = partition.publish

                async def failing_first(*args: Any, _publish: Any = publish, **kw: Any) -> Any:
                    nonlocal calls
                    calls += 1
                    mine = calls
                    await asyncio.sleep(0.01)  # both sets are in flight
                    if mine == 1:
                        raise DiskFull("the first set's write")
                    return await _publish(*args, **kw)

                monkeypatch.setattr(partition, "publish", failing_first)
            first = asyncio.create_task(broker.cursors.set("c", "s", 0, 1))
            second = asyncio.create_task(broker.cursors.set("c", "s", 1, 2))
            with pytest.raises(DiskFull):
                await first
            await second
            assert await broker.cursors.fetch("c", "s", 1) == 2
            assert broker.cursors.cursor_ids("s") == 1, "stored, so counted"
            calls = 0  # the next first set fails alone: not counted
            with pytest.raises(DiskFull):
                await broker.cursors.set("d", "s", 0, 1)
            assert broker.cursors.cursor_ids("s") == 1

    asyncio.run(body())
