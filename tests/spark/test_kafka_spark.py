"""Spark on both sides of tidelog's Kafka listener: Spark's own Kafka source (the 4.2.0 connector
``make spark-kafka`` fetched, whose jars the suite's SparkSession loads) reads a tidelog topic
through the listener, in batch and in Structured Streaming, and tidelog's Spark source reads the
same topic, written by a Kafka producer, through tidelog's API. Both must see the same records.

The topic is written once by librdkafka with keys, headers and explicit CreateTimes. What the two
sources must agree on follows the model (``tests/kafka/test_kafka_crossprotocol.py``): Spark's
Kafka source sees the Kafka record (its CreateTime as ``timestamp``, its headers), tidelog's
source the tidelog record (the broker's time, the ``__kafka`` header first).

When Spark's Kafka source fails, the assertion names the apis the listener logged as ``not
served`` (the first thing to look at: an api the connector needs that the listener lacks).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.kafka.kafka_exact import (
    KAFKA_HEADER,
    KafkaServed,
    Sent,
    confluent_send,
    marker,
    tidelog_with_kafka,
)
from tests.support.kafka_dist import spark_kafka_jars

from tidelog.client import Client

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "spark-kafka"
PARTITIONS = 3
COUNT = 300
CREATE_TIME = 1_650_000_000_000


@dataclass(frozen=True)
class Topic:
    served: KafkaServed
    sent: dict[tuple[int, int], Sent]
    """Each record by where it was stored (partition, offset)."""
    after_ns: int
    before_ns: int

    def not_served(self) -> list[str]:
        return self.served.log_lines("not served")


@pytest.fixture(scope="module")
def topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topic]:
    """A tidelog server with its Kafka listener, and TOPIC (PARTITIONS partitions) holding COUNT
    records written by librdkafka."""
    with tidelog_with_kafka(tmp_path_factory.mktemp("spark-kafka") / "data") as served:
        with Client(served.process.address) as client:
            client.create_stream(TOPIC, partitions=PARTITIONS)
        records = [
            Sent(
                b"value-%d" % i,
                b"key-%d" % i,
                (("n", b"%d" % i), ("kind", b"\x00\xff")),
                CREATE_TIME + i,
                i % PARTITIONS,
            )
            for i in range(COUNT)
        ]
        after = time.time_ns()
        placed = confluent_send(served.bootstrap, TOPIC, records)
        before = time.time_ns()
        yield Topic(served, dict(zip(placed, records, strict=True)), after, before)


def _kafka_reader(reader: Any, topic: Topic) -> Any:
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", topic.served.bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
    )


def _tidelog_reader(reader: Any, topic: Topic) -> Any:
    return (
        reader.format("tidelog")
        .option("servers", topic.served.process.address)
        .option("stream", TOPIC)
        .option("startingOffsets", "earliest")
    )


def _headers(row: Any) -> tuple[tuple[str, bytes], ...]:
    return tuple((h.key, bytes(h.value)) for h in row.headers or ())


# -- tidelog's source: the Kafka-written records over tidelog's API -----------------------------


def test_tidelog_source_reads_kafka_written_records(spark: Any, topic: Topic) -> None:
    rows = _tidelog_reader(spark.read, topic).load().collect()
    got = {
        (r.partition, r.offset): (
            bytes(r.key),
            bytes(r.value),
            tuple((k, v) for k, v in _headers(r) if not k.startswith("__")),
        )
        for r in rows
    }
    assert got == {place: (s.key, s.value, s.headers) for place, s in topic.sent.items()}
    for r in rows:  # the broker's time (µs in Spark), not the CreateTime
        micros = int(r.timestamp.timestamp() * 1_000_000)
        assert topic.after_ns // 1000 - 1 <= micros <= topic.before_ns // 1000 + 1


def test_tidelog_source_shows_the_kafka_header_first(spark: Any, topic: Topic) -> None:
    rows = _tidelog_reader(spark.read, topic).load().collect()
    assert {(r.partition, r.offset): _headers(r)[:1] for r in rows} == {
        place: ((KAFKA_HEADER, marker(s.timestamp_ms or 0)),) for place, s in topic.sent.items()
    }


# -- Spark's Kafka source: tidelog through the Kafka listener -----------------------------------


def _collect_or_report(frame: Any, topic: Topic) -> list[Any]:
    try:
        rows: list[Any] = frame.collect()
    except Exception as error:
        raise AssertionError(
            f"Spark's Kafka source failed: {str(error)[:2000]}\n"
            f"the listener logged: {topic.not_served()}"
        ) from error
    return rows


def test_spark_kafka_source_batch_reads_every_record(spark: Any, topic: Topic) -> None:
    assert spark_kafka_jars(), "make spark-kafka"
    frame = _kafka_reader(spark.read, topic).option("endingOffsets", "latest").load()
    rows = _collect_or_report(
        frame.select("topic", "partition", "offset", "key", "value", "headers"), topic
    )
    assert len(rows) == COUNT
    assert {r.topic for r in rows} == {TOPIC}
    got = {(r.partition, r.offset): (bytes(r.key), bytes(r.value), _headers(r)) for r in rows}
    assert got == {place: (s.key, s.value, s.headers) for place, s in topic.sent.items()}
    tidelog_count = _tidelog_reader(spark.read, topic).load().count()
    assert tidelog_count == len(rows)


def test_spark_kafka_source_timestamps_are_the_create_times(spark: Any, topic: Topic) -> None:
    frame = _kafka_reader(spark.read, topic).option("endingOffsets", "latest").load()
    rows = _collect_or_report(
        frame.select("partition", "offset", "timestamp", "timestampType"), topic
    )
    assert {r.timestampType for r in rows} == {0}  # CreateTime
    got = {(r.partition, r.offset): round(r.timestamp.timestamp() * 1000) for r in rows}
    assert got == {place: s.timestamp_ms for place, s in topic.sent.items()}


class Collected:
    """A foreachBatch sink keeping each micro-batch's (partition, offset) pairs."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.batches.append([(r.partition, r.offset) for r in frame.collect()])

    @property
    def rows(self) -> list[tuple[int, int]]:
        return sorted(row for batch in self.batches for row in batch)


def _stream(reader: Any, checkpoint: Path) -> Collected:
    sink = Collected()
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    finished = query.awaitTermination(120)
    error = query.exception()
    if not finished:
        query.stop()
    if error is not None:
        raise RuntimeError(str(error)[:2000])
    assert finished, "the availableNow query did not end in 120 s"
    return sink


def test_spark_kafka_source_streams_what_the_tidelog_source_streams(
    spark: Any, topic: Topic, tmp_path: Path
) -> None:
    try:
        kafka = _stream(_kafka_reader(spark.readStream, topic), tmp_path / "kafka")
    except RuntimeError as error:
        raise AssertionError(f"{error}\nthe listener logged: {topic.not_served()}") from error
    tidelog = _stream(_tidelog_reader(spark.readStream, topic), tmp_path / "tidelog")
    assert len(kafka.rows) == len(tidelog.rows) == COUNT
    assert kafka.rows == tidelog.rows == sorted(topic.sent)


def test_spark_kafka_source_streams_into_a_memory_sink(
    spark: Any, topic: Topic, tmp_path: Path
) -> None:
    query = (
        _kafka_reader(spark.readStream, topic)
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName("tidelog_kafka_memory")
        .option("checkpointLocation", str(tmp_path / "memory"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(120)
        if query.exception() is not None:
            raise AssertionError(
                f"{str(query.exception())[:2000]}\nthe listener logged: {topic.not_served()}"
            )
        assert finished
        rows = spark.sql("SELECT partition, offset, value FROM tidelog_kafka_memory").collect()
    finally:
        query.stop()
    assert {(r.partition, r.offset): r.value.encode() for r in rows} == {
        place: s.value for place, s in topic.sent.items()
    }
