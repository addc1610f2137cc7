"""Batch reads through Spark against a real server: every option, reverse, splits, pushdown,
data loss and the errors a user sees."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.server import ServerProcess

from tidelog.client import Client, Message, ReceivedMessage

pytestmark = pytest.mark.spark

STREAM = "events"
PARTITIONS = 3
ROUNDS = 4
"""Each partition gets ROUNDS batches of PER_ROUND messages, one timestamp per batch."""
PER_ROUND = 25


@pytest.fixture(scope="module")
def events(client: Client) -> dict[int, list[ReceivedMessage]]:
    """The stream's content per partition, as the client reads it back."""
    client.create_stream(STREAM, partitions=PARTITIONS)
    for round_ in range(ROUNDS):
        for partition in range(PARTITIONS):
            client.publish_batch(
                STREAM,
                [
                    Message(
                        b"v%d.%d.%d" % (partition, round_, i),
                        key=None if i % 3 == 0 else b"k%d" % i,
                        headers={"n": b"%d" % i, "r": b"x"} if i % 2 else {},
                    )
                    for i in range(PER_ROUND)
                ],
                partition=partition,
            )
        time.sleep(0.005)  # distinct timestamps per round
    return {
        p: list(client.subscribe(STREAM, p, start="earliest", stop="latest"))
        for p in range(PARTITIONS)
    }


def read(spark: Any, server: ServerProcess, **options: str) -> Any:
    return (
        spark.read.format("tidelog")
        .option("servers", server.address)
        .option("stream", STREAM)
        .options(**options)
        .load()
    )


def keys(rows: Iterator[Any]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in rows]


def expected(
    events: dict[int, list[ReceivedMessage]], partitions: range | list[int] = range(PARTITIONS)
) -> list[tuple[int, int]]:
    return [(p, m.offset) for p in partitions for m in events[p]]


def test_reads_every_record_with_every_column(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    rows = read(spark, server).collect()
    assert keys(rows) == expected(events)
    sent = {(m.partition, m.offset): m for ms in events.values() for m in ms}
    for row in rows:
        m = sent[(row.partition, row.offset)]
        assert (row.key, row.value, row.stream) == (m.key, m.value, STREAM)
        assert [(h.key, h.value) for h in row.headers or []] == list(m.headers.items())
        assert (row.headers is None) == (not m.headers)
        micros = row.timestamp.timestamp() * 1_000_000
        assert abs(micros - m.timestamp // 1000) < 2  # µs; the float above rounds


def test_offset_options(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    total = ROUNDS * PER_ROUND
    both = read(spark, server, startingOffsets='{"0": 10, "2": 95}', endingOffsets='{"0": 20}')
    assert keys(both.collect()) == (
        [(0, o) for o in range(10, 20)]
        + [(1, o) for o in range(total)]
        + [(2, o) for o in range(95, total)]
    )
    assert read(spark, server, startingOffsets="latest").count() == 0
    assert read(spark, server, startingOffsets="earliest", endingOffsets="latest").count() == (
        PARTITIONS * total
    )
    sentinels = read(spark, server, startingOffsets='{"1": -1}', endingOffsets='{"0": -1}')
    assert sentinels.count() == 2 * total


def test_timestamp_options(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    # Round 1 of partition 1 starts at offset 25; its timestamp, rounded up to the ms.
    second = events[1][PER_ROUND].timestamp
    third = events[1][2 * PER_ROUND].timestamp
    start_ms, end_ms = -(-second // 1_000_000), -(-third // 1_000_000)
    df = read(spark, server, partitions="1", startingTimestamp=str(start_ms))
    wanted = [m.offset for m in events[1] if m.timestamp >= start_ms * 1_000_000]
    assert [r.offset for r in df.collect()] == wanted
    df = read(spark, server, partitions="1", startingTimestamp="0", endingTimestamp=str(end_ms))
    wanted = [m.offset for m in events[1] if m.timestamp < end_ms * 1_000_000]
    assert [r.offset for r in df.collect()] == wanted and 0 < len(wanted) < len(events[1])


def test_reverse_reads_newest_first_across_splits(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    df = read(
        spark,
        server,
        reverse="true",
        partitions="0,2",
        startingOffsets='{"0": 5}',
        endingOffsets='{"0": 60}',
        maxOffsetsPerPartition="20",
    )
    rows = keys(df.collect())
    assert rows == [(0, o) for o in reversed(range(5, 60))] + [
        (2, m.offset) for m in reversed(events[2])
    ]


def test_large_partitions_are_split(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    df = read(spark, server, maxOffsetsPerPartition="30")
    assert df.rdd.getNumPartitions() == PARTITIONS * 4  # 100 offsets each: 4 pieces of 25
    assert sorted(keys(df.collect())) == expected(events)
    df = read(spark, server, partitions="1", minPartitions="5")
    assert df.rdd.getNumPartitions() == 5
    assert keys(df.collect()) == expected(events, [1])


def test_small_partitions_are_packed_into_few_tasks(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    """Ranges below maxOffsetsPerPartition share tasks, read one after another in plan order;
    minPartitions turns packing off."""
    everything = [(p, m.offset) for p in range(PARTITIONS) for m in events[p]]
    df = read(spark, server)  # 3 x 100 offsets, far below the default 500,000
    assert df.rdd.getNumPartitions() == 1
    assert keys(df.collect()) == everything
    df = read(spark, server, maxOffsetsPerPartition="200")
    assert df.rdd.getNumPartitions() == 2  # 100 + 100, then 100
    assert keys(df.collect()) == everything
    df = read(spark, server, reverse="true", maxOffsetsPerPartition="200")
    assert df.rdd.getNumPartitions() == 2
    assert keys(df.collect()) == [
        (p, m.offset) for p in range(PARTITIONS) for m in reversed(events[p])
    ]
    assert read(spark, server, minPartitions="3").rdd.getNumPartitions() == 3


def test_pushdown_narrows_what_is_read(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    third = events[0][2 * PER_ROUND].timestamp  # the first of round 2 (partition 0 goes first)
    moment = f"timestamp_micros({third // 1000})"
    df = read(spark, server, maxOffsetsPerPartition="10").where(
        f"partition IN (0, 2) AND offset < 90 AND timestamp >= {moment}"
    )
    # Only rounds 2 (all) and 3 (below 90) of two partitions: 4 pieces of 10 offsets each,
    # instead of 10 per partition.
    assert df.rdd.getNumPartitions() == 8
    assert keys(df.collect()) == [(p, o) for p in (0, 2) for o in range(50, 90)]
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "Filter " not in plan, plan  # every filter was handled by the source (no Filter node)
    assert read(spark, server).where(f"stream = '{STREAM}x'").rdd.getNumPartitions() == 1


def test_without_pushdown_the_options_still_work(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = read(spark, server, partitions="2", startingOffsets='{"2": 90}').where("offset < 95")
        assert keys(df.collect()) == [(2, o) for o in range(90, 95)]
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "nowhere"}, "no stream 'nowhere'"),
        ({"startingOffsets": '{"0": '}, "startingOffsets: expected"),
        ({"startingOffsets": '{"0": 9}', "endingOffsets": '{"0": 3}'}, "is before startingOffsets"),
        ({"reverse": "maybe"}, "reverse: expected 'true' or 'false'"),
    ],
)
def test_bad_options_fail_at_load(
    spark: Any, server: ServerProcess, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, server, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": '{"1": 500}'}, r"endingOffsets \(latest: 100\) is before"),
        ({"partitions": "0,7"}, r"names partition\(s\) \[7\]"),
    ],
)
def test_bad_options_fail_at_planning(
    spark: Any,
    server: ServerProcess,
    events: dict[int, list[ReceivedMessage]],
    options: dict[str, str],
    message: str,
) -> None:
    df = read(spark, server, **options)
    with pytest.raises(Exception, match=message):
        df.collect()


def test_fail_on_data_loss_both_ways(spark: Any, server: ServerProcess, client: Client) -> None:
    oldest = trimmed_stream(client, "trimmed")
    lossy = (
        spark.read.format("tidelog")
        .option("servers", server.address)
        .option("stream", "trimmed")
        .option("startingOffsets", '{"0": 0}')
    )
    with pytest.raises(Exception, match=r"removed by retention.*failOnDataLoss=false"):
        lossy.load().collect()
    rows = lossy.option("failOnDataLoss", "false").load().collect()
    assert [r.offset for r in rows] == list(range(oldest, 20))


def trimmed_stream(client: Client, name: str, count: int = 20) -> int:
    """``count`` messages of ~1 KB in 4 KiB segments keeping at least 6; waits until retention
    removed the head and returns the oldest retained offset."""
    client.create_stream(name, segment_max_bytes=4096, retention_messages=6)
    for i in range(count):
        client.publish_batch(name, [b"%d" % i + b"." * 1000], partition=0)
    return wait_for_retention(client, name, above=0)


def wait_for_retention(client: Client, name: str, above: int) -> int:
    """The oldest offset once it is above ``above`` and stable over a few maintenance passes."""
    history: list[int] = []
    for _ in range(200):
        messages = client.subscribe(name, start="earliest", stop="latest")
        history.append(next(messages).offset)
        messages.close()  # type: ignore[attr-defined]
        if len(history) >= 4 and history[-1] > above and len(set(history[-4:])) == 1:
            return history[-1]
        time.sleep(0.05)
    raise AssertionError(f"retention never removed the head: {history[-10:]}")
