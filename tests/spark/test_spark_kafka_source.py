"""Spark's own Kafka source (``spark-sql-kafka-0-10``, fetched by ``make spark-kafka``) reads
a topic of Apache Kafka under the project's PySpark: the reader that will later point at
tidelog's Kafka listener, proven on the real broker first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.apache_kafka import apache_kafka
from tests.support.kafka_clients import confluent_produce, create_topic, numbered
from tests.support.kafka_dist import spark_kafka_jars

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COUNT = 300


def test_spark_kafka_source_reads_every_message_of_a_topic(spark: Any, tmp_path: Path) -> None:
    assert spark_kafka_jars(), "make spark-kafka"  # BundleMissing names the target if absent
    messages = numbered(COUNT)
    with apache_kafka(tmp_path) as bootstrap:
        create_topic(bootstrap, "spark-source", partitions=3)
        acks = confluent_produce(bootstrap, "spark-source", messages)
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "spark-source")
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        assert frame.count() == COUNT
        rows = frame.select("partition", "offset", "key", "value", "topic").collect()
    assert {row["topic"] for row in rows} == {"spark-source"}
    read = {
        (row["partition"], row["offset"]): (bytes(row["key"]), bytes(row["value"])) for row in rows
    }
    sent = {
        (ack.partition, ack.offset): (m.key, m.value) for ack, m in zip(acks, messages, strict=True)
    }
    assert read == sent
