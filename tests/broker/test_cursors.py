"""Cursors: set/fetch, -1 when never set, independent keys, last write wins, and all of it the
same after a restart (when the answer comes from the ``__cursors`` log instead of the cache)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.errors import InvalidArgument
from tidelog.wire import CURSORS_STREAM

KEYS = [("c1", "s", 0), ("c1", "s", 1), ("c2", "s", 0), ("c1", "t", 0), ("c1,s", "0", 0)]


@pytest.mark.parametrize("cursor_partitions", [1, 3])
def test_set_fetch_and_restart(tmp_path: Path, cursor_partitions: int) -> None:
    config = broker_config(tmp_path, cursor_partitions=cursor_partitions)
    # Each key gets its own history; the last value written is the answer.
    history = {key: [i * 10, i * 10 + 5, i] for i, key in enumerate(KEYS)}

    async def write() -> None:
        async with running(config) as broker:
            assert len(broker.stream(CURSORS_STREAM).partitions) == cursor_partitions
            broker.create_stream("s", StreamConfig(partitions=2))  # a cursor names a partition
            broker.create_stream("t")
            broker.create_stream("0")
            assert await broker.cursors.fetch("never", "s", 0) == -1
            for round_ in range(3):
                for key, values in history.items():
                    await broker.cursors.set(*key, values[round_])
            for key, values in history.items():
                assert await broker.cursors.fetch(*key) == values[-1]

    async def read_back() -> None:
        async with running(config) as broker:
            for key, values in history.items():
                assert await broker.cursors.fetch(*key) == values[-1], key
            assert await broker.cursors.fetch("never", "s", 0) == -1
            # Writing after the restart wins over what the log held.
            await broker.cursors.set("c1", "s", 0, 999)
            assert await broker.cursors.fetch("c1", "s", 0) == 999

    async def read_again() -> None:
        async with running(config) as broker:
            assert await broker.cursors.fetch("c1", "s", 0) == 999
            assert await broker.cursors.fetch("c2", "s", 0) == history[KEYS[2]][-1]

    asyncio.run(write())
    asyncio.run(read_back())
    asyncio.run(read_again())


def test_a_negative_fetch_is_not_stuck(tmp_path: Path) -> None:
    """Fetching an unknown cursor caches -1; a later set must still be seen."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            assert await broker.cursors.fetch("c", "s", 0) == -1
            await broker.cursors.set("c", "s", 0, 7)
            assert await broker.cursors.fetch("c", "s", 0) == 7

    asyncio.run(body())


def test_empty_ids_are_refused(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            with pytest.raises(InvalidArgument):
                await broker.cursors.set("", "s", 0, 1)
            with pytest.raises(InvalidArgument):
                await broker.cursors.fetch("c", "", 0)

    asyncio.run(body())


def test_concurrent_sets_last_write_wins_before_and_after_restart(tmp_path: Path) -> None:
    """Concurrent sets of one cursor: the write appended last is the cursor's value. The broker's
    answer must not depend on which durable sync happened to finish first, and must be the same
    before and after a restart (when it is read back from the log)."""
    config = broker_config(tmp_path)
    rounds = 20

    async def write() -> list[int]:
        answers = []
        async with running(config) as broker:
            broker.create_stream("s", StreamConfig(partitions=rounds))
            for r in range(rounds):
                await asyncio.gather(*(broker.cursors.set("c", "s", r, v) for v in range(8)))
                answers.append(await broker.cursors.fetch("c", "s", r))
        return answers

    async def read_back() -> list[int]:
        async with running(config) as broker:
            return [await broker.cursors.fetch("c", "s", r) for r in range(rounds)]

    before = asyncio.run(write())
    after = asyncio.run(read_back())
    # Sets are appended in the order gather starts them, so 7 is the last write in the log.
    assert after == [7] * rounds
    assert before == after
