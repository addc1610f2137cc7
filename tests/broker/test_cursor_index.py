"""Cursor fetches come from a materialised index, restored from a snapshot plus the log's tail."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.broker.cursor_index import SNAPSHOT_FILE, VALUE, CursorIndex
from tidelog.log import LogConfig, NewRecord, SegmentedLog
from tidelog.wire import CURSORS_STREAM


def cursor_dir(data: Path) -> Path:
    return data / "streams" / CURSORS_STREAM / "0"


def set_many(data: Path, values: dict[str, int]) -> None:
    async def body() -> None:
        async with running(broker_config(data)) as broker:
            if broker.find_stream("orders") is None:
                broker.create_stream("orders")  # a cursor names a partition that exists
            for cursor, value in values.items():
                await broker.cursors.set(cursor, "orders", 0, value)

    asyncio.run(body())


def fetch_all(data: Path, names: list[str]) -> dict[str, int]:
    async def body() -> dict[str, int]:
        async with running(broker_config(data)) as broker:
            return {n: await broker.cursors.fetch(n, "orders", 0) for n in names}

    return asyncio.run(body())


def test_unknown_and_known_cursors_after_a_clean_restart_come_from_the_snapshot(
    tmp_path: Path,
) -> None:
    set_many(tmp_path, {"a": 5, "b": 7})
    set_many(tmp_path, {"a": 9})
    snapshot = json.loads((cursor_dir(tmp_path) / SNAPSHOT_FILE).read_text())
    assert snapshot["covered"] == 2  # three records: a=5, b=7, a=9
    log = SegmentedLog(cursor_dir(tmp_path), LogConfig())
    try:
        restored = CursorIndex.restore(log, cursor_dir(tmp_path))
    finally:
        log.close()
    assert restored.replayed == 0  # nothing after the snapshot to read
    assert fetch_all(tmp_path, ["a", "b", "never"]) == {"a": 9, "b": 7, "never": -1}


def test_records_after_the_snapshot_are_replayed(tmp_path: Path) -> None:
    set_many(tmp_path, {"a": 1})
    # Records the snapshot does not cover (as after a crash between snapshots).
    log = SegmentedLog(cursor_dir(tmp_path), LogConfig())
    try:
        log.append(
            [NewRecord(VALUE.pack(42), key=b"a,orders,0"), NewRecord(VALUE.pack(3), key=b"z")]
        )
        restored = CursorIndex.restore(log, cursor_dir(tmp_path))
    finally:
        log.close()
    assert restored.replayed == 2
    assert restored.get(b"a,orders,0") == 42
    assert fetch_all(tmp_path, ["a"]) == {"a": 42}


def test_a_snapshot_ahead_of_the_log_is_ignored_and_the_index_rebuilt(tmp_path: Path) -> None:
    set_many(tmp_path, {"a": 1, "b": 2})
    path = cursor_dir(tmp_path) / SNAPSHOT_FILE
    snapshot = json.loads(path.read_text())
    snapshot["covered"] = 1000  # claims records the log does not have
    snapshot["entries"] = []
    path.write_text(json.dumps(snapshot))
    assert fetch_all(tmp_path, ["a", "b"]) == {"a": 1, "b": 2}


def test_an_unreadable_snapshot_is_ignored_and_the_index_rebuilt(tmp_path: Path) -> None:
    set_many(tmp_path, {"a": 1})
    (cursor_dir(tmp_path) / SNAPSHOT_FILE).write_text("{not json")
    assert fetch_all(tmp_path, ["a", "missing"]) == {"a": 1, "missing": -1}


def test_a_lost_snapshot_costs_nothing_but_a_replay(tmp_path: Path) -> None:
    set_many(tmp_path, {f"c{i}": i for i in range(50)})
    (cursor_dir(tmp_path) / SNAPSHOT_FILE).unlink()
    assert fetch_all(tmp_path, ["c0", "c49", "c50"]) == {"c0": 0, "c49": 49, "c50": -1}


def test_fetch_never_reads_the_cursor_log(tmp_path: Path) -> None:
    """With the cursor partition paused (its log closed), fetches still answer: they are lookups
    in the index, never scans of the log."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("orders")
            await broker.cursors.set("a", "orders", 0, 11)
            broker.partition(CURSORS_STREAM, 0).pause()  # as auto-pause would (clients may not)
            assert broker.partition(CURSORS_STREAM, 0).paused
            assert await broker.cursors.fetch("a", "orders", 0) == 11
            assert await broker.cursors.fetch("nobody", "orders", 0) == -1
            assert broker.partition(CURSORS_STREAM, 0).paused

    asyncio.run(body())


def test_the_index_survives_a_copy_of_the_data_directory(tmp_path: Path) -> None:
    set_many(tmp_path / "a", {"x": 3})
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert fetch_all(tmp_path / "b", ["x"]) == {"x": 3}


def test_many_cursors_across_three_cursor_partitions_survive_compaction_and_restart(
    tmp_path: Path,
) -> None:
    config = broker_config(tmp_path, cursor_partitions=3)

    async def write() -> None:
        async with running(config) as broker:
            assert len(broker.stream(CURSORS_STREAM).partitions) == 3
            broker.create_stream("orders", StreamConfig(partitions=2))
            for round_no in range(5):
                for i in range(40):
                    await broker.cursors.set(f"c{i}", "orders", i % 2, round_no * 100 + i)
            for partition in broker.stream(CURSORS_STREAM).partitions:
                partition.log.roll()
            await broker.maintain()  # compacts __cursors and snapshots the indexes

    async def read() -> dict[tuple[str, int], int]:
        async with running(config) as broker:
            return {
                (f"c{i}", i % 2): await broker.cursors.fetch(f"c{i}", "orders", i % 2)
                for i in range(40)
            }

    asyncio.run(write())
    assert asyncio.run(read()) == {(f"c{i}", i % 2): 400 + i for i in range(40)}
