"""Real Kafka clients, each driven through one produce and one consume function given only a
bootstrap address: confluent-kafka (librdkafka), kafka-python, aiokafka, Debian's ``kcat`` and
Apache Kafka's own Java client (``tests/kafka/java``, built by ``make kafka-java``).

The same functions run against Apache Kafka (tests/kafka/test_kafka_tooling.py proves the
harness there) and against tidelog's Kafka listener, so a difference between the two is a finding
about tidelog, not about the harness.

Conventions, the same for every client:

- A produce takes :class:`Outgoing` messages (or, for the Java program, the numbered scheme of
  :func:`numbered`, which it builds itself) and returns one :class:`Ack` per message, in the
  order sent; any message not acknowledged within ``timeout_s`` raises :class:`ClientFailed`.
- A consume returns exactly ``count`` :class:`Record` objects in the order received, or raises
  :class:`ClientFailed` with how many arrived before ``timeout_s``. With ``group=None`` the
  client assigns itself every partition of the topic from the beginning (no group coordinator);
  with a group it subscribes from the earliest offset and commits what it read.
- Keys and values are bytes (``None`` for no key); headers are ``(name, bytes)`` pairs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import confluent_kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from tests.support.kafka_dist import CACHE

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas through importlib.resources' deprecated
    # read_text/open_text: ~200 DeprecationWarnings at import, none about our code.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka

JAVA_TOOL = CACHE / "java" / "kafka-tool-jar-with-dependencies.jar"
"""The Java program's runnable jar (``make kafka-java``)."""

POLL_S = 0.5


class ClientFailed(RuntimeError):
    """A client did not finish: an error, a non-zero exit, or too few records or acks in time."""


class ToolMissing(RuntimeError):
    """``kcat`` or the Java program is not installed (the message names the ``make`` target)."""


class Ack(NamedTuple):
    partition: int
    offset: int


@dataclass(frozen=True)
class Outgoing:
    """A message to produce."""

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Record:
    """A consumed message and where it was."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def message(self) -> Outgoing:
        return Outgoing(self.value, self.key, self.headers)


def numbered(
    count: int,
    *,
    key_prefix: str | None = "key-",
    value_prefix: str = "value-",
    headers: bool = False,
) -> list[Outgoing]:
    """Message i (from 0): value ``<value_prefix>i``, key ``<key_prefix>i`` (no key when the
    prefix is ``None``), with ``headers`` one header ``seq=i``: the scheme of the Java program's
    produce, so every client's output can be checked against one list."""
    return [
        Outgoing(
            value=f"{value_prefix}{i}".encode(),
            key=None if key_prefix is None else f"{key_prefix}{i}".encode(),
            headers=((("seq", str(i).encode()),) if headers else ()),
        )
        for i in range(count)
    ]


def _require(acks: Sequence[Ack | None], errors: Sequence[str], client: str) -> list[Ack]:
    missing = sum(1 for ack in acks if ack is None)
    if errors or missing:
        first = errors[0] if errors else "not acknowledged in time"
        raise ClientFailed(f"{client}: {missing} of {len(acks)} messages failed; first: {first}")
    return [ack for ack in acks if ack is not None]


def _enough(records: list[Record], count: int, client: str) -> list[Record]:
    if len(records) < count:
        raise ClientFailed(f"{client}: {len(records)} of {count} records arrived in time")
    return records


# --- confluent-kafka (librdkafka) -----------------------------------------------------------


def _bytes_or_none(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _confluent_headers(
    headers: dict[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None,
) -> tuple[tuple[str, bytes], ...]:
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    return tuple((name, _bytes_or_none(value) or b"") for name, value in pairs)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_s: float = 30.0) -> None:
    """CreateTopics through confluent-kafka's admin client (replication factor 1), waited for."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout_s)
    for future in futures.values():
        future.result(timeout=timeout_s)


def confluent_produce(
    bootstrap: str,
    topic: str,
    messages: Sequence[Outgoing],
    *,
    acks: str = "all",
    compression: str = "none",
    idempotent: bool = False,
    timeout_s: float = 30.0,
) -> list[Ack]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "compression.type": compression,
            "enable.idempotence": idempotent,
            "message.timeout.ms": int(timeout_s * 1000),
        }
    )
    result: list[Ack | None] = [None] * len(messages)
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                result[index] = Ack(message.partition(), message.offset())

        return report

    for index, message in enumerate(messages):
        producer.produce(
            topic,
            value=message.value,
            key=message.key,
            headers=list(message.headers) or None,
            on_delivery=delivered(index),
        )
        producer.poll(0)
    producer.flush(timeout_s)
    return _require(result, errors, "confluent-kafka")


def confluent_consume(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, timeout_s: float = 30.0
) -> list[Record]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "group.id": group or "unused-assign-only",
    }
    consumer = confluent_kafka.Consumer(config)
    records: list[Record] = []
    try:
        if group is None:
            metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
            consumer.assign(
                [
                    confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                    for p in sorted(metadata.partitions)
                ]
            )
        else:
            consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for message in consumer.consume(count - len(records), timeout=POLL_S):
                if message.error() is not None:
                    raise ClientFailed(f"confluent-kafka: {message.error()}")
                records.append(
                    Record(
                        int(message.partition() or 0),
                        int(message.offset() or 0),
                        _bytes_or_none(message.key()),
                        _bytes_or_none(message.value()) or b"",
                        _confluent_headers(message.headers()),
                    )
                )
        if group is not None and records:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return _enough(records, count, "confluent-kafka")


# --- kafka-python ---------------------------------------------------------------------------


def kafka_python_produce(
    bootstrap: str,
    topic: str,
    messages: Sequence[Outgoing],
    *,
    acks: str = "all",
    compression: str | None = None,
    timeout_s: float = 30.0,
) -> list[Ack]:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=acks if acks == "all" else int(acks),
        compression_type=compression,
        request_timeout_ms=int(timeout_s * 1000),
    )
    try:
        futures = [
            producer.send(topic, value=m.value, key=m.key, headers=list(m.headers) or None)
            for m in messages
        ]
        producer.flush(timeout=timeout_s)
        result: list[Ack | None] = []
        errors: list[str] = []
        for future in futures:
            try:
                metadata = future.get(timeout=0)
            except Exception as error:
                errors.append(repr(error))
                result.append(None)
            else:
                result.append(Ack(metadata.partition, metadata.offset))
    finally:
        producer.close(timeout=5)
    return _require(result, errors, "kafka-python")


def kafka_python_consume(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, timeout_s: float = 30.0
) -> list[Record]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    records: list[Record] = []
    try:
        if group is None:
            partitions = [
                kafka.TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
            ]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
        else:
            consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            batches = consumer.poll(timeout_ms=int(POLL_S * 1000))
            for batch in batches.values():
                records.extend(
                    Record(r.partition, r.offset, r.key, r.value, tuple(r.headers or ()))
                    for r in batch
                )
        if group is not None and records:
            consumer.commit()
    finally:
        consumer.close(autocommit=False)
    return _enough(records, count, "kafka-python")


# --- aiokafka -------------------------------------------------------------------------------


async def aiokafka_produce_async(
    bootstrap: str,
    topic: str,
    messages: Sequence[Outgoing],
    *,
    acks: str = "all",
    compression: str | None = None,
    timeout_s: float = 30.0,
) -> list[Ack]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=acks if acks == "all" else int(acks),
        compression_type=compression,
        request_timeout_ms=int(timeout_s * 1000),
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value=m.value, key=m.key, headers=list(m.headers) or None)
            for m in messages
        ]
        done = await asyncio.wait_for(
            asyncio.gather(*futures, return_exceptions=True), timeout=timeout_s
        )
    finally:
        await producer.stop()
    errors = [repr(item) for item in done if isinstance(item, BaseException)]
    result = [None if isinstance(m, BaseException) else Ack(m.partition, m.offset) for m in done]
    return _require(result, errors, "aiokafka")


async def aiokafka_consume_async(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, timeout_s: float = 30.0
) -> list[Record]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[Record] = []
    try:
        if group is None:
            # The consumer knows the partitions only of topics it subscribed to: ask an admin.
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                (described,) = await admin.describe_topics([topic])
            finally:
                await admin.close()
            partitions = [
                AioTopicPartition(topic, p["partition"])
                for p in sorted(described["partitions"], key=lambda p: int(p["partition"]))
            ]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
        else:
            consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000))
            for batch in batches.values():
                records.extend(
                    Record(r.partition, r.offset, r.key, r.value or b"", tuple(r.headers))
                    for r in batch
                )
        if group is not None and records:
            await consumer.commit()
    finally:
        await consumer.stop()
    return _enough(records, count, "aiokafka")


def aiokafka_produce(
    bootstrap: str, topic: str, messages: Sequence[Outgoing], **options: Any
) -> list[Ack]:
    """:func:`aiokafka_produce_async` on a fresh event loop."""
    return asyncio.run(aiokafka_produce_async(bootstrap, topic, messages, **options))


def aiokafka_consume(bootstrap: str, topic: str, count: int, **options: Any) -> list[Record]:
    """:func:`aiokafka_consume_async` on a fresh event loop."""
    return asyncio.run(aiokafka_consume_async(bootstrap, topic, count, **options))


# --- kcat -----------------------------------------------------------------------------------


def _kcat() -> str:
    found = shutil.which("kcat")
    if found is None:
        raise ToolMissing("no `kcat` on PATH: `make kcat` installs Debian's package")
    return found


def _run(command: list[str], client: str, timeout_s: float, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise ClientFailed(f"{client}: no exit within {timeout_s} s: {command}") from error
    if done.returncode != 0:
        raise ClientFailed(
            f"{client} exited with {done.returncode}: {command}\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def kcat_metadata(bootstrap: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """``kcat -L -J``: brokers and topics (with their partitions) as kcat reports them."""
    output = _run([_kcat(), "-b", bootstrap, "-L", "-J"], "kcat -L", timeout_s)
    parsed: dict[str, Any] = json.loads(output)
    return parsed


def kcat_produce(
    bootstrap: str,
    topic: str,
    messages: Sequence[Outgoing],
    *,
    partition: int | None = None,
    timeout_s: float = 30.0,
) -> None:
    """``kcat -P -K<TAB>``: one line per message, key and value apart by a tab. kcat reports no
    offsets; it exits non-zero when a message is not delivered. Keys and values must be text
    without tabs or newlines, and headers are not sent (kcat's ``-H`` is one set per run)."""
    lines = []
    for message in messages:
        key = (message.key or b"").decode()
        value = message.value.decode()
        if any(c in key + value for c in "\t\n") or message.headers:
            raise ValueError("kcat_produce sends text keys and values without tabs or newlines")
        lines.append(f"{key}\t{value}\n")
    command = [_kcat(), "-b", bootstrap, "-t", topic, "-P", "-K", "\t", "-X", "acks=all"]
    if partition is not None:
        command += ["-p", str(partition)]
    _run(command, "kcat -P", timeout_s, stdin="".join(lines))


def kcat_consume(
    bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0
) -> list[Record]:
    """``kcat -C -J -o beginning -c COUNT -e``: every partition from the beginning, no group.
    kcat's JSON carries keys, values and headers as text, so they must be UTF-8."""
    command = [_kcat(), "-b", bootstrap, "-t", topic, "-C", "-J", "-q", "-o", "beginning"]
    command += ["-c", str(count), "-e"]
    records = []
    for line in _run(command, "kcat -C", timeout_s).splitlines():
        item = json.loads(line)
        flat = item.get("headers") or []
        headers = tuple(
            (str(flat[i]), str(flat[i + 1]).encode()) for i in range(0, len(flat) - 1, 2)
        )
        key = item.get("key")
        records.append(
            Record(
                item["partition"],
                item["offset"],
                None if key is None else str(key).encode(),
                str(item.get("payload") or "").encode(),
                headers,
            )
        )
    return _enough(records, count, "kcat")


# --- Apache Kafka's Java client (tests/kafka/java) ------------------------------------------


def java_tool(*args: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Run the Java program with ``args``; its JSON lines, parsed. ``ClientFailed`` on a
    non-zero exit (including a consume that got too few records: exit code 3)."""
    java = shutil.which("java")
    if java is None or not Path(JAVA_TOOL).is_file():
        raise ToolMissing(f"{JAVA_TOOL} or java is missing: `make kafka-java` builds it")
    output = _run([java, "-jar", str(JAVA_TOOL), *args], f"kafka-tool {args[0]}", timeout_s)
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def java_produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    key_prefix: str | None = "key-",
    value_prefix: str = "value-",
    headers: bool = False,
    acks: str = "all",
    compression: str = "none",
    idempotent: bool = False,
    timeout_s: float = 30.0,
) -> list[Ack]:
    """The Java producer sends ``numbered(count, ...)`` (the same scheme, built in Java)."""
    args = ["produce", "--bootstrap", bootstrap, "--topic", topic, "--count", str(count)]
    args += ["--acks", acks, "--compression", compression, "--value-prefix", value_prefix]
    args += ["--print-acks", "--timeout-ms", str(int(timeout_s * 1000))]
    if key_prefix is not None:
        args += ["--key-prefix", key_prefix]
    if headers:
        args.append("--headers")
    if idempotent:
        args.append("--idempotent")
    lines = java_tool(*args, timeout_s=timeout_s + 30)
    return [Ack(line["partition"], line["offset"]) for line in lines if "seq" in line]


def java_consume(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, timeout_s: float = 30.0
) -> list[Record]:
    args = ["consume", "--bootstrap", bootstrap, "--topic", topic, "--count", str(count)]
    args += ["--timeout-ms", str(int(timeout_s * 1000))]
    if group is not None:
        args += ["--group", group]
    lines = java_tool(*args, timeout_s=timeout_s + 30)

    def decoded(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    return [
        Record(
            line["partition"],
            line["offset"],
            decoded(line["key"]),
            decoded(line["value"]) or b"",
            tuple((name, base64.b64decode(value)) for name, value in line["headers"]),
        )
        for line in lines
    ]


def java_create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    java_tool(
        "admin-create", "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions)
    )


def java_delete_topic(bootstrap: str, topic: str) -> None:
    java_tool("admin-delete", "--bootstrap", bootstrap, "--topic", topic)


def java_list_topics(bootstrap: str) -> list[str]:
    (line,) = java_tool("admin-list", "--bootstrap", bootstrap)
    return list(line["topics"])
