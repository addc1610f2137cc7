"""Batch reads through the JVM connector (``tidelog.spark.jvm.read``, format ``tidelog-jvm``)
against a real server: the same rows as the Python source, column for column, for every column
set Spark prunes to; offsets, timestamps, reverse, many tasks, data loss both ways; and the errors
a user sees. The first tests need no JVM (the plan's encoding is pure)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_spark_batch_read import trimmed_stream
from tests.support.server import ServerProcess

from tidelog.client import Client, Message, ReceivedMessage
from tidelog.errors import InvalidOption
from tidelog.spark import jvm
from tidelog.spark.options import parse
from tidelog.spark.planning import OffsetRange
from tidelog.wire.arrow import COLUMNS

STREAM = "jvm"
PARTITIONS = 3
ROUNDS = 3
PER_ROUND = 30


def test_tasks_are_encoded_in_reading_order_without_empty_ranges() -> None:
    tasks = [
        (OffsetRange(0, 0, 10), OffsetRange(2, 5, 5), OffsetRange(1, 3, 4)),
        (OffsetRange(2, 7, 7),),
        (OffsetRange(2, 0, 500_000),),
    ]
    assert jvm.encode_tasks(tasks) == "0:0:10,1:3:4;2:0:500000"
    assert jvm.encode_tasks([]) == jvm.encode_tasks([(OffsetRange(0, 1, 1),)]) == ";"


def test_the_connector_gets_the_plan_and_the_connection_options() -> None:
    given = {"stream": "s", "servers": "a:1,b:2", "TLSCA": "/ca.pem", "token": "t", "reverse": "1"}
    parsed = parse({**given, "reverse": "true"})
    out = jvm.connector_options(
        given, parsed, [OffsetRange(0, 0, 3), OffsetRange(1, 0, 0)], {0: "b:2", 1: "a:1", 5: "c:3"}
    )
    assert out == {
        "stream": "s",
        "servers": "a:1,b:2",
        "leaders": "0=b:2,1=a:1",
        "tasks": "0:0:3",
        "reverse": "true",
        "failOnDataLoss": "true",
        "tlsCa": "/ca.pem",
        "token": "t",
    }


@pytest.fixture(scope="module")
def events(client: Client) -> dict[int, list[ReceivedMessage]]:
    """Values, null and empty keys, records with and without headers, several timestamps."""
    client.create_stream(STREAM, partitions=PARTITIONS)
    for round_ in range(ROUNDS):
        for partition in range(PARTITIONS):
            client.publish_batch(
                STREAM,
                [
                    Message(
                        b"v%d.%d.%d" % (partition, round_, i) * (i % 4),
                        key=None if i % 3 == 0 else (b"" if i % 3 == 1 else b"k%d" % i),
                        headers={"n": b"%d" % i, "r": b""} if i % 2 else {},
                    )
                    for i in range(PER_ROUND)
                ],
                partition=partition,
            )
        time.sleep(0.005)
    return {
        p: list(client.subscribe(STREAM, p, start="earliest", stop="latest"))
        for p in range(PARTITIONS)
    }


def both(spark: Any, server: ServerProcess, **options: str) -> tuple[Any, Any]:
    """The same read through the connector and through the Python source."""
    given = {"servers": server.address, "stream": STREAM, **options}
    return jvm.read(spark, given), spark.read.format("tidelog").options(**given).load()


pytestmark = pytest.mark.spark


def test_every_column_as_the_python_source_reads_it(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    on_jvm, in_python = both(spark, server)
    rows = on_jvm.collect()
    assert rows == in_python.collect()
    assert len(rows) == PARTITIONS * ROUNDS * PER_ROUND
    sent = {(m.partition, m.offset): m for ms in events.values() for m in ms}
    for row in rows:
        m = sent[(row.partition, row.offset)]
        assert (row.key, row.value, row.stream) == (m.key, m.value, STREAM)
        assert [(h.key, h.value) for h in row.headers or []] == list(m.headers.items())
        assert (row.headers is None) == (not m.headers)


@pytest.mark.parametrize(
    "columns",
    [
        ["partition"],
        ["offset", "timestamp"],
        ["value"],
        ["key", "headers"],
        ["stream", "value"],
        ["headers.value"],
        ["headers.key", "offset"],
    ],
)
def test_a_query_reads_only_its_columns_with_the_same_rows(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]], columns: list[str]
) -> None:
    on_jvm, in_python = both(spark, server)
    assert on_jvm.select(*columns).collect() == in_python.select(*columns).collect()
    scan = on_jvm.select(*columns)._jdf.queryExecution().executedPlan().toString()
    # Spark prunes to whole columns in the source's order (a nested field: its whole column).
    read = [c for c in COLUMNS if c in {name.split(".")[0] for name in columns}]
    assert f"tidelog {STREAM} [{', '.join(read)}]" in scan


def test_aggregates_without_columns(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    on_jvm, _ = both(spark, server)
    assert on_jvm.count() == PARTITIONS * ROUNDS * PER_ROUND
    counts = {r.partition: r["count"] for r in on_jvm.groupBy("partition").count().collect()}
    assert counts == {p: ROUNDS * PER_ROUND for p in range(PARTITIONS)}


def test_a_narrowing_schema(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    df = jvm.read(spark, {"servers": server.address, "stream": STREAM}, schema="offset BIGINT")
    assert df.columns == ["offset"]
    assert sorted(r.offset for r in df.collect()) == sorted(
        m.offset for ms in events.values() for m in ms
    )
    narrowed = jvm.read(spark, servers=server.address, stream=STREAM, columns="value,partition")
    assert narrowed.columns == ["value", "partition"]


def test_offsets_reverse_and_many_tasks(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    options = {
        "startingOffsets": '{"0": 10, "2": 85}',
        "endingOffsets": '{"0": 70}',
        "maxOffsetsPerPartition": "7",
        "minPartitions": "12",
    }
    for reverse in ("false", "true"):
        on_jvm, in_python = both(spark, server, reverse=reverse, **options)
        assert on_jvm.rdd.getNumPartitions() == in_python.rdd.getNumPartitions() >= 12
        rows = [(r.partition, r.offset, r.value) for r in on_jvm.collect()]
        assert rows == [(r.partition, r.offset, r.value) for r in in_python.collect()]
    total = ROUNDS * PER_ROUND
    forward = [(r.partition, r.offset) for r in both(spark, server, **options)[0].collect()]
    assert forward == (
        [(0, o) for o in range(10, 70)]
        + [(1, o) for o in range(total)]
        + [(2, o) for o in range(85, total)]
    )


def test_timestamps_as_the_python_source(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    second = events[1][PER_ROUND].timestamp
    start_ms = -(-second // 1_000_000)
    on_jvm, in_python = both(spark, server, partitions="1", startingTimestamp=str(start_ms))
    rows = on_jvm.select("offset", "timestamp").collect()
    assert rows == in_python.select("offset", "timestamp").collect()
    assert [r.offset for r in rows] == [
        m.offset for m in events[1] if m.timestamp >= start_ms * 1_000_000
    ]


def test_nothing_to_read(
    spark: Any, server: ServerProcess, events: dict[int, list[ReceivedMessage]]
) -> None:
    df = jvm.read(spark, servers=server.address, stream=STREAM, startingOffsets="latest")
    assert df.count() == 0 and df.collect() == []


def test_fail_on_data_loss_both_ways(spark: Any, server: ServerProcess, client: Client) -> None:
    oldest = trimmed_stream(client, "jvm-trimmed")
    options = {"servers": server.address, "stream": "jvm-trimmed", "startingOffsets": '{"0": 0}'}
    with pytest.raises(Exception, match=r"removed by retention.*failOnDataLoss=false"):
        jvm.read(spark, options).collect()
    rows = jvm.read(spark, options, failOnDataLoss="false").collect()
    assert [r.offset for r in rows] == list(range(oldest, 20))


def test_a_session_without_the_connector_is_told_what_to_set(
    spark: Any,
    server: ServerProcess,
    events: dict[int, list[ReceivedMessage]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jvm, "FORMAT", "tidelog-jvm-absent")  # as if the jar were not given
    with pytest.raises(jvm.MissingJar, match=r"spark\.jars.*make spark-jvm"):
        jvm.read(spark, servers=server.address, stream=STREAM)


def test_errors_a_user_sees(spark: Any, server: ServerProcess) -> None:
    with pytest.raises(InvalidOption, match="maxOffsetsPerTrigger"):
        jvm.read(spark, servers=server.address, stream=STREAM, maxOffsetsPerTrigger="5")
    with pytest.raises(Exception, match="no stream 'absent'"):
        jvm.read(spark, servers=server.address, stream="absent")
    with pytest.raises(Exception, match=r"option 'tasks' is required.*tidelog\.spark\.jvm\.read"):
        spark.read.format(jvm.FORMAT).option("stream", STREAM).load()
    with pytest.raises(Exception, match="option 'token' needs TLS"):
        spark.read.format(jvm.FORMAT).options(stream=STREAM, tasks=";", token="x").load()
    with pytest.raises(Exception, match="column 'offset' is BIGINT, not INT"):
        spark.read.format(jvm.FORMAT).options(stream=STREAM, tasks=";").schema("offset INT").load()
