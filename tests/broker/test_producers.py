"""Idempotent publishing through the broker: the producer table, its persistence, its guard.

Every check reads the partition's log back rather than trusting what publish answered.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker, StreamConfig
from tidelog.broker.producers import (
    PRODUCER_HEADER,
    SNAPSHOT_FILE,
    ProducerTable,
    decode_producer,
    encode_producer,
)
from tidelog.errors import IncorrectOffset, InvalidArgument
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.record import PackedValues


def partition_dir(data: Path, stream: str = "s") -> Path:
    return data / "streams" / stream / "0"


def stored_values(broker: Broker, stream: str = "s") -> list[bytes]:
    log = broker.partition(stream, 0).log
    return [v for batch in log.forward_reader(0) for v in batch.values()]


def test_the_producer_header_round_trips() -> None:
    value = encode_producer("spark-task-7 é", 2**40, 3)
    assert value[:12] == struct.pack("<qI", 2**40, 3)
    assert decode_producer(value) == ("spark-task-7 é", 2**40, 3)
    for bad in (b"", value[:12], struct.pack("<qI", -1, 3) + b"p", struct.pack("<qI", 1, 0) + b"p"):
        assert decode_producer(bad) is None


def test_same_sequence_is_a_duplicate_with_the_stored_offsets(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            await broker.publish("s", 0, [b"other"])
            first = await broker.publish_idempotent("s", 0, [b"a", b"b", b"c"], "p", 5)
            assert (first.offsets, first.duplicate) == (range(1, 4), False)
            await broker.publish("s", 0, [b"between"])
            again = await broker.publish_idempotent("s", 0, [b"a", b"b", b"c"], "p", 5)
            assert (again.offsets, again.duplicate) == (range(1, 4), True)
            lower = await broker.publish_idempotent("s", 0, [b"old"], "p", 4)
            assert (lower.offsets, lower.duplicate) == (range(0), True)
            gap = await broker.publish_idempotent("s", 0, [b"d"], "p", 9)
            assert (gap.offsets, gap.duplicate) == (range(5, 6), False)
            assert (await broker.publish_idempotent("s", 0, [b"e"], "p", 5)).duplicate
            # Another producer has a table entry of its own.
            assert not (await broker.publish_idempotent("s", 0, [b"q"], "q", 5)).duplicate
            assert stored_values(broker) == [b"other", b"a", b"b", b"c", b"between", b"d", b"q"]

    asyncio.run(body())


def test_the_last_record_carries_the_header_and_the_batch_is_atomic(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            blob = b"onetwothree"
            packed = PackedValues(blob, np.array([3, 3, 5], dtype=np.int64))
            await broker.publish_idempotent("s", 0, packed, "p", 0)
            log = broker.partition("s", 0).log
            (batch,) = list(log.forward_reader(0))
            assert batch.values() == [b"one", b"two", b"three"]
            headers = batch.headers()
            assert [PRODUCER_HEADER in h for h in headers] == [False, False, True]
            assert decode_producer(headers[-1][PRODUCER_HEADER]) == ("p", 0, 3)
            raw = (partition_dir(tmp_path) / "00000000000000000000.log").read_bytes()
            attrs, at = [], 0
            while at < len(raw):
                attrs.append(raw[at + 25])
                at += struct.unpack_from("<I", raw, at + 4)[0]
            assert attrs == [1, 1, 0]

    asyncio.run(body())


@pytest.mark.parametrize("policy", [FlushPolicy.ALWAYS, FlushPolicy.NEVER])
def test_concurrent_publishes_of_one_batch_append_it_once(tmp_path: Path, policy) -> None:
    """Under ``always`` every append runs in a thread of its own: the check has to be under the
    log's lock for exactly one of them to get through."""

    async def body() -> None:
        log = LogConfig(flush_policy=policy, retention_age_s=None)
        async with running(broker_config(tmp_path, log=log)) as broker:
            broker.create_stream("s")
            for sequence in range(5):
                results = await asyncio.gather(
                    *(
                        broker.publish_idempotent("s", 0, [b"x%d" % sequence] * 3, "p", sequence)
                        for _ in range(16)
                    )
                )
                fresh = [r for r in results if not r.duplicate]
                assert len(fresh) == 1
                assert {r.offsets for r in results} == {fresh[0].offsets}
            assert stored_values(broker) == [b"x%d" % s for s in range(5) for _ in range(3)]

    asyncio.run(body())


def test_a_retry_with_the_expected_offset_is_a_duplicate_not_an_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(optimistic_concurrency=True))
            ok = await broker.publish_idempotent("s", 0, [b"a"], "p", 1, expected_offset=0)
            retry = await broker.publish_idempotent("s", 0, [b"a"], "p", 1, expected_offset=0)
            assert (ok.offsets, retry.offsets, retry.duplicate) == (range(1), range(1), True)
            with pytest.raises(IncorrectOffset):
                await broker.publish_idempotent("s", 0, [b"b"], "p", 2, expected_offset=0)
            assert not (await broker.publish_idempotent("s", 0, [b"b"], "p", 2)).duplicate

    asyncio.run(body())


@pytest.mark.parametrize(
    ("producer_id", "sequence", "match"),
    [
        ("", 1, "must not be empty"),
        ("p", -1, "must be >= 0"),
        ("x" * 256, 0, "256 bytes"),
        ("é" * 128, 0, "256 bytes"),
    ],
)
def test_invalid_producers_are_refused(tmp_path: Path, producer_id, sequence, match) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            with pytest.raises(InvalidArgument, match=match):
                await broker.publish_idempotent("s", 0, [b"a"], producer_id, sequence)
            assert (await broker.publish_idempotent("s", 0, [b"a"], "x" * 255, 0)).offsets
            assert stored_values(broker) == [b"a"]

    asyncio.run(body())


def test_the_reserved_header_is_refused_everywhere(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            forged = [b"a", NewRecord(b"b", headers={"h": b"", PRODUCER_HEADER: b"forged"})]
            with pytest.raises(InvalidArgument, match=r"message 1 .* reserved"):
                await broker.publish("s", 0, forged)
            with pytest.raises(InvalidArgument, match="reserved"):
                await broker.publish_idempotent("s", 0, forged, "p", 0)
            assert stored_values(broker) == []
            await broker.publish("s", 0, [NewRecord(b"c", headers={"_producer": b"fine"})])
            assert stored_values(broker) == [b"c"]

    asyncio.run(body())


# -- persistence -----------------------------------------------------------------------------------


def publish_some(data: Path) -> None:
    async def body() -> None:
        async with running(broker_config(data)) as broker:
            broker.create_stream("s")
            await broker.publish_idempotent("s", 0, [b"a", b"b"], "p", 1)
            await broker.publish("s", 0, [b"plain"])
            await broker.publish_idempotent("s", 0, [b"c"], "q", 7)
            await broker.publish_idempotent("s", 0, [b"d", b"e", b"f"], "p", 2)

    asyncio.run(body())


def retry_all(data: Path) -> tuple[list[tuple[range, bool]], list[bytes]]:
    """Publish the same batches again after a restart; what each answered, and the log."""

    async def body() -> tuple[list[tuple[range, bool]], list[bytes]]:
        async with running(broker_config(data)) as broker:
            answers = [
                await broker.publish_idempotent("s", 0, [b"d", b"e", b"f"], "p", 2),
                await broker.publish_idempotent("s", 0, [b"c"], "q", 7),
                await broker.publish_idempotent("s", 0, [b"a", b"b"], "p", 1),
                await broker.publish_idempotent("s", 0, [b"g"], "q", 8),
            ]
            return [(a.offsets, a.duplicate) for a in answers], stored_values(broker)

    return asyncio.run(body())


EXPECTED_AFTER_RETRY = (
    [(range(4, 7), True), (range(3, 4), True), (range(0), True), (range(7, 8), False)],
    [b"a", b"b", b"plain", b"c", b"d", b"e", b"f", b"g"],
)


def test_a_clean_restart_restores_the_table_from_its_snapshot(tmp_path: Path) -> None:
    publish_some(tmp_path)
    snapshot = json.loads((partition_dir(tmp_path) / SNAPSHOT_FILE).read_text())
    assert snapshot["covered"] == 6
    assert sorted(snapshot["producers"]) == [["p", 2, 4, 3], ["q", 7, 3, 1]]
    with SegmentedLog(partition_dir(tmp_path), LogConfig()) as log:
        restored = ProducerTable.restore(log, partition_dir(tmp_path))
    assert restored.replayed == 0  # nothing after the snapshot to read
    assert retry_all(tmp_path) == EXPECTED_AFTER_RETRY


def test_without_its_snapshot_the_table_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    publish_some(tmp_path)
    (partition_dir(tmp_path) / SNAPSHOT_FILE).unlink()
    with SegmentedLog(partition_dir(tmp_path), LogConfig()) as log:
        restored = ProducerTable.restore(log, partition_dir(tmp_path))
    assert restored.replayed == 7
    assert retry_all(tmp_path) == EXPECTED_AFTER_RETRY


@pytest.mark.parametrize(
    "snapshot",
    [
        {"format": 1, "covered": 50, "producers": []},
        {"format": 1, "covered": 6, "producers": [["p", 2, 4, 3], ["q", 7, 3, 1], ["z", 1, 9, 1]]},
        "{not json",
        {"format": 1, "covered": 6},
    ],
    ids=["covers past the log", "names a batch past the log", "unreadable", "incomplete"],
)
def test_a_snapshot_ahead_of_the_log_or_unreadable_means_a_rebuild(
    tmp_path: Path, snapshot
) -> None:
    publish_some(tmp_path)
    text = snapshot if isinstance(snapshot, str) else json.dumps(snapshot)
    (partition_dir(tmp_path) / SNAPSHOT_FILE).write_text(text)
    with SegmentedLog(partition_dir(tmp_path), LogConfig()) as log:
        restored = ProducerTable.restore(log, partition_dir(tmp_path))
        assert restored.replayed == 7
        assert restored.get("z") is None
    assert retry_all(tmp_path) == EXPECTED_AFTER_RETRY


def test_records_after_the_snapshot_are_replayed(tmp_path: Path) -> None:
    """As after a crash between snapshots: the tail's ``__producer`` headers are read."""
    publish_some(tmp_path)
    with SegmentedLog(partition_dir(tmp_path), LogConfig()) as log:
        log.append(
            [b"h", NewRecord(b"i", headers={PRODUCER_HEADER: encode_producer("q", 8, 2)})],
            atomic=True,
        )
        log.append([NewRecord(b"j", headers={"other": b""})])
        restored = ProducerTable.restore(log, partition_dir(tmp_path))
    assert restored.replayed == 3
    stored = restored.get("q")
    assert stored is not None and (stored.sequence, stored.offsets) == (8, range(7, 9))
    p = restored.get("p")
    assert p is not None and (p.sequence, p.offsets) == (2, range(4, 7))


def test_maintenance_writes_the_snapshot_only_when_something_changed(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            path = partition_dir(tmp_path) / SNAPSHOT_FILE
            await broker.maintain()
            assert not path.exists()  # an empty log, an empty table: nothing to say
            await broker.publish_idempotent("s", 0, [b"a"], "p", 3)
            await broker.maintain()
            assert json.loads(path.read_text())["producers"] == [["p", 3, 0, 1]]
            stamp = path.stat().st_mtime_ns
            await broker.maintain()
            assert path.stat().st_mtime_ns == stamp
            await broker.publish("s", 0, [b"plain"])
            await broker.maintain()
            assert json.loads(path.read_text())["covered"] == 1

    asyncio.run(body())


def test_pause_and_resume_keep_the_table(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            await broker.publish_idempotent("s", 0, [b"a"], "p", 3)
            broker.pause("s", None, False)
            assert (partition_dir(tmp_path) / SNAPSHOT_FILE).exists()
            again = await broker.publish_idempotent("s", 0, [b"a"], "p", 3)  # resumes
            assert (again.offsets, again.duplicate) == (range(1), True)

    asyncio.run(body())


def test_maintenance_forgets_producers_whose_batches_retention_removed(tmp_path: Path) -> None:
    """The table holds what a rebuild from the log would: a producer whose last batch retention
    removed is forgotten (its dedup window is over), one still in the log is kept."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(segment_max_bytes=4096, retention_messages=50))
            await broker.publish_idempotent("s", 0, [b"x" * 100] * 5, "gone", 1)
            for _ in range(20):
                await broker.publish("s", 0, [b"y" * 100] * 10)
            await broker.publish_idempotent("s", 0, [b"z"], "kept", 7)
            await broker.maintain()
            partition = broker.partition("s", 0)
            assert partition.log.oldest_offset > 5  # retention removed the first batch
            snapshot = json.loads((partition_dir(tmp_path) / SNAPSHOT_FILE).read_text())
            assert [p[0] for p in snapshot["producers"]] == ["kept"]
            again = await broker.publish_idempotent("s", 0, [b"x"], "gone", 1)
            assert not again.duplicate  # forgotten, as a rebuild from the log would
            kept = await broker.publish_idempotent("s", 0, [b"z"], "kept", 7)
            assert kept.duplicate

    asyncio.run(body())
