"""The Kafka test harness proven on Apache Kafka itself: every client function of
tests/support/kafka_clients.py (confluent-kafka, kafka-python, aiokafka, kcat, the Java
program on kafka-clients) produces and consumes exact messages through one Apache Kafka node
started by tests/support/apache_kafka.py, which itself is checked to clean up by PID.

When these pass and a tidelog compatibility test with the same functions fails, the finding is
tidelog's. Missing tools (``make kcat``, ``make kafka-java``, ``make kafka-dist``) fail the tests
with the target to run: they are part of ``make test``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.support.apache_kafka import ApacheKafka
from tests.support.kafka_clients import (
    Ack,
    Outgoing,
    Record,
    aiokafka_consume,
    aiokafka_produce,
    confluent_consume,
    confluent_produce,
    create_topic,
    java_consume,
    java_create_topic,
    java_delete_topic,
    java_list_topics,
    java_produce,
    kafka_python_consume,
    kafka_python_produce,
    kcat_consume,
    kcat_metadata,
    kcat_produce,
    numbered,
)

pytestmark = pytest.mark.slow

COUNT = 100
PARTITIONS = 3


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Apache Kafka node for the module (~3 s to start), stopped by PID at the end."""
    node = ApacheKafka(tmp_path_factory.mktemp("apache-kafka") / "node").start()
    try:
        yield node.bootstrap
    finally:
        node.stop()


def assert_exact(acks: Sequence[Ack], sent: Sequence[Outgoing], records: Sequence[Record]) -> None:
    """Every message was read back once, at the partition and offset that acknowledged it, with
    its key, value and headers, and in offset order within each partition."""
    assert len(records) == len(sent)
    placed = {(ack.partition, ack.offset): message for ack, message in zip(acks, sent, strict=True)}
    read = {(record.partition, record.offset): record.message for record in records}
    assert read == placed
    for partition in {record.partition for record in records}:
        offsets = [record.offset for record in records if record.partition == partition]
        assert offsets == sorted(offsets)


Produce = Callable[..., list[Ack]]
Consume = Callable[..., list[Record]]

PYTHON_CLIENTS: dict[str, tuple[Produce, Consume]] = {
    "confluent-kafka": (confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_produce, aiokafka_consume),
}


@pytest.mark.parametrize("group", [None, "readers"], ids=["assigned", "group"])
@pytest.mark.parametrize("client", sorted(PYTHON_CLIENTS))
def test_python_client_reads_back_exactly_what_it_produced(
    bootstrap: str, client: str, group: str | None
) -> None:
    produce, consume = PYTHON_CLIENTS[client]
    topic = f"{client}-{group or 'assigned'}"
    create_topic(bootstrap, topic, PARTITIONS)
    sent = numbered(COUNT, headers=True)
    acks = produce(bootstrap, topic, sent)
    records = consume(bootstrap, topic, COUNT, group=None if group is None else f"{topic}-g")
    assert len({ack.partition for ack in acks}) == PARTITIONS  # the keys spread
    assert_exact(acks, sent, records)


def test_kcat_lists_the_broker_and_a_topics_partitions(bootstrap: str) -> None:
    create_topic(bootstrap, "kcat-listed", PARTITIONS)
    metadata = kcat_metadata(bootstrap)
    assert [broker["name"] for broker in metadata["brokers"]] == [bootstrap]
    (topic,) = [t for t in metadata["topics"] if t["topic"] == "kcat-listed"]
    assert sorted(p["partition"] for p in topic["partitions"]) == list(range(PARTITIONS))


def test_kcat_reads_back_in_order_what_it_produced(bootstrap: str) -> None:
    create_topic(bootstrap, "kcat-roundtrip", 1)
    sent = numbered(COUNT)
    kcat_produce(bootstrap, "kcat-roundtrip", sent)
    records = kcat_consume(bootstrap, "kcat-roundtrip", COUNT)
    assert [(r.partition, r.offset) for r in records] == [(0, i) for i in range(COUNT)]
    assert [r.message for r in records] == sent


def test_kcat_reads_headers_written_by_another_client(bootstrap: str) -> None:
    create_topic(bootstrap, "kcat-headers", 1)
    sent = numbered(COUNT, headers=True)
    acks = confluent_produce(bootstrap, "kcat-headers", sent)
    assert_exact(acks, sent, kcat_consume(bootstrap, "kcat-headers", COUNT))


@pytest.mark.parametrize("group", [None, "readers"], ids=["assigned", "group"])
def test_java_client_reads_back_exactly_what_it_produced(bootstrap: str, group: str | None) -> None:
    topic = f"java-{group or 'assigned'}"
    java_create_topic(bootstrap, topic, PARTITIONS)
    acks = java_produce(bootstrap, topic, COUNT, headers=True)
    records = java_consume(bootstrap, topic, COUNT, group=group)
    assert_exact(acks, numbered(COUNT, headers=True), records)


def test_java_idempotent_zstd_producer_is_read_by_librdkafka(bootstrap: str) -> None:
    create_topic(bootstrap, "java-zstd", PARTITIONS)
    acks = java_produce(
        bootstrap, "java-zstd", COUNT, key_prefix=None, compression="zstd", idempotent=True
    )
    records = confluent_consume(bootstrap, "java-zstd", COUNT)
    assert_exact(acks, numbered(COUNT, key_prefix=None), records)


def test_java_admin_creates_lists_and_deletes_a_topic(bootstrap: str) -> None:
    java_create_topic(bootstrap, "java-admin", 2)
    assert "java-admin" in java_list_topics(bootstrap)
    java_delete_topic(bootstrap, "java-admin")
    assert "java-admin" not in java_list_topics(bootstrap)


def test_apache_kafka_stops_by_pid_and_removes_its_directory(tmp_path: Path) -> None:
    node = ApacheKafka(tmp_path / "node").start()
    pid = node.pid
    assert (tmp_path / "node" / "server.properties").is_file()
    records: list[Any] = []
    try:
        create_topic(node.bootstrap, "one", 1)
        acks = confluent_produce(node.bootstrap, "one", numbered(1))
        records = confluent_consume(node.bootstrap, "one", 1)
    finally:
        node.stop()
    assert acks == [Ack(0, 0)] and len(records) == 1
    assert not (tmp_path / "node").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
