"""Exact Kafka records for the compatibility tests: a tidelog server with its Kafka listener,
producing records of every shape (null keys and values, duplicate and null headers, explicit
CreateTime), reading them back with nothing normalised, and the model's ``__kafka`` header.

The client functions of ``tests/support/kafka_clients.py`` read a null value as ``b""`` and a
null header value as ``b""`` (what most tests want); the functions here keep ``None`` apart from
empty, and report each record's timestamp and its type, which the model's checks need.

The model (``docs/kafka.md``): a Kafka record is stored as a tidelog record whose first header is
``__kafka``, 10 bytes little-endian ``u8 version=1 | u8 flags | i64 CreateTime ms``; flags bit 0:
the Kafka value was null (tidelog stores it empty); bit 1: the Kafka headers could not be tidelog
headers (duplicate names, a null value, a name starting ``__``) and follow the 10 bytes raw, in
Kafka's header encoding, with no other tidelog header on the record.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import struct
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from tests.support.kafka_clients import ClientFailed
from tests.support.server import ServerProcess, served

from tidelog.process import free_port

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's import (kafka_clients)
    import kafka

KAFKA_HEADER = "__kafka"
MARKER_VERSION = 1
NULL_VALUE = 1
RAW_HEADERS = 2
POLL_S = 0.5

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class KafkaServed:
    """A ``tidelog serve`` with its Kafka listener: the process (gRPC at ``process.address``)
    and the Kafka bootstrap address."""

    process: ServerProcess
    bootstrap: str

    def log_lines(self, text: str) -> list[str]:
        """The server's log lines containing ``text`` (e.g. ``"not served"``)."""
        return [line.rstrip() for line in self.process.stderr_lines if text in line]


@contextlib.contextmanager
def tidelog_with_kafka(data_dir: Path, *extra: str) -> Iterator[KafkaServed]:
    """``tidelog serve --kafka-port <free port>`` on loopback, killed by PID at the end."""
    port = free_port()
    with served(data_dir, "--kafka-port", str(port), *extra) as process:
        yield KafkaServed(process, f"127.0.0.1:{port}")


@dataclass(frozen=True)
class Sent:
    """A record to produce exactly as given (``None`` key or value: null)."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int | None = None
    """The CreateTime to send; None: the producer's clock."""
    partition: int | None = None


@dataclass(frozen=True)
class Got:
    """A consumed record, nothing normalised."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_type: str
    """``"create"``, ``"append"`` or ``"none"``."""
    timestamp_ms: int

    @property
    def content(self) -> tuple[bytes | None, bytes | None, tuple[Header, ...]]:
        return (self.key, self.value, self.headers)


def marker(create_time_ms: int, flags: int = 0, raw: bytes = b"") -> bytes:
    """The ``__kafka`` header's value the model stores for a record."""
    return struct.pack("<BBq", MARKER_VERSION, flags, create_time_ms) + raw


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def header_block(headers: Sequence[Header]) -> bytes:
    """Kafka's encoding of a record's headers (zigzag varints; a null value's length is -1)."""
    out = bytearray(_varint(len(headers)))
    for name, value in headers:
        encoded = name.encode()
        out += _varint(len(encoded)) + encoded
        out += _varint(-1) if value is None else _varint(len(value)) + value
    return bytes(out)


def confluent_send(
    bootstrap: str,
    topic: str,
    records: Sequence[Sent],
    *,
    timeout_s: float = 30.0,
    log: list[str] | None = None,
    debug: str = "msg",
    **config: Any,
) -> list[tuple[int, int]]:
    """Produce ``records`` in order through librdkafka (``config``: more settings, dots as
    underscores); each one's (partition, offset), or ClientFailed. ``log``: librdkafka's
    ``debug`` lines are appended to it (``msg``: the batches it builds; ``protocol``: each
    request sent and response received)."""
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": False,
        "message.timeout.ms": int(timeout_s * 1000),
    }
    settings.update({name.replace("_", "."): value for name, value in config.items()})
    if log is not None:
        settings["debug"] = debug
        settings["logger"] = _collecting_logger(log)
    producer = confluent_kafka.Producer(settings)
    placed: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[str] = []

    def report(index: int) -> Any:
        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                placed[index] = (message.partition(), message.offset())

        return delivered

    for index, record in enumerate(records):
        options: dict[str, Any] = {}
        if record.timestamp_ms is not None:
            options["timestamp"] = record.timestamp_ms
        if record.partition is not None:
            options["partition"] = record.partition
        while True:
            try:
                producer.produce(
                    topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers) or None,
                    on_delivery=report(index),
                    **options,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(timeout_s)
    missing = sum(1 for p in placed if p is None)
    if errors or missing or left:
        raise ClientFailed(
            f"confluent-kafka: {missing} of {len(records)} not acknowledged; first error: "
            f"{errors[0] if errors else 'none'}"
        )
    return [p for p in placed if p is not None]


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_loggers = itertools.count()


def _collecting_logger(lines: list[str]) -> logging.Logger:
    """A logger of its own (librdkafka calls it from ``poll``/``flush``) that keeps each line."""
    logger = logging.getLogger(f"tests.kafka.librdkafka.{next(_loggers)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(_Collect(lines))
    return logger


_CONFLUENT_TYPES = {
    confluent_kafka.TIMESTAMP_CREATE_TIME: "create",
    confluent_kafka.TIMESTAMP_LOG_APPEND_TIME: "append",
    confluent_kafka.TIMESTAMP_NOT_AVAILABLE: "none",
}


def confluent_read(bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0) -> list[Got]:
    """Exactly ``count`` records of every partition from the beginning (no group), in
    (partition, offset) order, or ClientFailed."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-assign-only",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "check.crcs": True,  # every fetched batch's CRC-32C is checked
        }
    )
    got: list[Got] = []
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in sorted(partitions)
            ]
        )
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(count - len(got), timeout=POLL_S):
                if message.error() is not None:
                    raise ClientFailed(f"confluent-kafka: {message.error()}")
                kind, stamp = message.timestamp()
                got.append(
                    Got(
                        int(message.partition() or 0),
                        int(message.offset() or 0),
                        message.key(),
                        message.value(),
                        tuple(message.headers() or ()),
                        _CONFLUENT_TYPES[kind],
                        stamp,
                    )
                )
    finally:
        consumer.close()
    if len(got) < count:
        raise ClientFailed(f"confluent-kafka: {len(got)} of {count} records arrived in time")
    return sorted(got, key=lambda g: (g.partition, g.offset))


def kafka_python_read(
    bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0
) -> list[Got]:
    """As :func:`confluent_read`, through kafka-python."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        check_crcs=True,
    )
    got: list[Got] = []
    try:
        partitions = [
            kafka.TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=int(POLL_S * 1000)).values():
                got.extend(
                    Got(
                        r.partition,
                        r.offset,
                        r.key,
                        r.value,
                        tuple(r.headers or ()),
                        "append" if r.timestamp_type == 1 else "create",
                        r.timestamp,
                    )
                    for r in batch
                )
    finally:
        consumer.close(autocommit=False)
    if len(got) < count:
        raise ClientFailed(f"kafka-python: {len(got)} of {count} records arrived in time")
    return sorted(got, key=lambda g: (g.partition, g.offset))
