"""Real Kafka clients against tidelog's Kafka listener: each produces and consumes with exact
checks (keys, values, headers, partitions, offsets), with every compression codec, idempotent
producers, offsets by timestamp, topic administration, record shapes (null keys and values,
duplicate and null headers, reserved names, CreateTime) and one pipelining connection under load.

The client functions are those of ``tests/support/kafka_clients.py``, proven on Apache Kafka by
``test_kafka_tooling.py``: a test that passes there and fails here is a finding about tidelog.
One server for the module (``tidelog serve --kafka-port``), each test on its own topics. Topics
with several partitions are created through tidelog's own API, so that these tests do not depend
on Kafka's admin apis (which ``test_admin_*`` checks by themselves).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator

import confluent_kafka
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from tests.kafka.kafka_exact import (
    Got,
    KafkaServed,
    Sent,
    confluent_read,
    confluent_send,
    kafka_python_read,
    tidelog_with_kafka,
)
from tests.kafka.test_kafka_tooling import assert_exact
from tests.support.kafka_clients import (
    Ack,
    ClientFailed,
    Outgoing,
    Record,
    aiokafka_consume,
    aiokafka_produce,
    confluent_consume,
    confluent_produce,
    java_consume,
    java_create_topic,
    java_delete_topic,
    java_produce,
    java_tool,
    kafka,
    kafka_python_consume,
    kafka_python_produce,
    kcat_consume,
    kcat_metadata,
    kcat_produce,
    numbered,
)

from tidelog.client import Client

pytestmark = pytest.mark.slow

COUNT = 100
PARTITIONS = 3
CODECS = ("gzip", "snappy", "lz4", "zstd")
_names = itertools.count()


@pytest.fixture(scope="module")
def kafka_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServed]:
    with tidelog_with_kafka(tmp_path_factory.mktemp("kafka-compat") / "data") as served:
        yield served


@pytest.fixture(scope="module")
def bootstrap(kafka_served: KafkaServed) -> str:
    return kafka_served.bootstrap


@pytest.fixture(scope="module")
def tidelog_client(kafka_served: KafkaServed) -> Iterator[Client]:
    with Client(kafka_served.process.address) as client:
        yield client


def topic(client: Client | None, prefix: str, partitions: int = 1) -> str:
    """A fresh topic name; created with ``partitions`` through tidelog's API when ``client`` is
    given (else a producer's Metadata creates it, with one partition)."""
    name = f"{prefix}-{next(_names)}"
    if client is not None:
        client.create_stream(name, partitions=partitions)
    return name


Produce = Callable[..., list[Ack]]
Consume = Callable[..., list[Record]]

PYTHON_CLIENTS: dict[str, tuple[Produce, Consume]] = {
    "confluent-kafka": (confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_produce, aiokafka_consume),
}


# -- each client, its own messages back ---------------------------------------------------------


@pytest.mark.parametrize("client", sorted(PYTHON_CLIENTS))
def test_python_client_reads_back_exactly_what_it_produced(
    bootstrap: str, tidelog_client: Client, client: str
) -> None:
    produce, consume = PYTHON_CLIENTS[client]
    name = topic(tidelog_client, client, PARTITIONS)
    sent = numbered(COUNT, headers=True)
    acks = produce(bootstrap, name, sent)
    assert len({ack.partition for ack in acks}) == PARTITIONS  # the keys spread
    assert_exact(acks, sent, consume(bootstrap, name, COUNT))


def test_a_topic_a_producer_names_is_created_with_one_partition(bootstrap: str) -> None:
    name = topic(None, "auto")
    sent = numbered(COUNT)
    acks = confluent_produce(bootstrap, name, sent)
    assert acks == [Ack(0, i) for i in range(COUNT)]
    assert_exact(acks, sent, kafka_python_consume(bootstrap, name, COUNT))


def test_java_client_reads_back_exactly_what_it_produced(
    bootstrap: str, tidelog_client: Client
) -> None:
    name = topic(tidelog_client, "java", PARTITIONS)
    acks = java_produce(bootstrap, name, COUNT, headers=True)
    sent = numbered(COUNT, headers=True)
    assert len({ack.partition for ack in acks}) == PARTITIONS
    assert_exact(acks, sent, java_consume(bootstrap, name, COUNT))
    assert_exact(acks, sent, confluent_consume(bootstrap, name, COUNT))


def test_kcat_lists_the_broker_and_a_topics_partitions(
    bootstrap: str, tidelog_client: Client
) -> None:
    name = topic(tidelog_client, "kcat-listed", PARTITIONS)
    metadata = kcat_metadata(bootstrap)
    assert [broker["name"] for broker in metadata["brokers"]] == [bootstrap]
    (listed,) = [t for t in metadata["topics"] if t["topic"] == name]
    assert sorted(p["partition"] for p in listed["partitions"]) == list(range(PARTITIONS))
    (broker,) = metadata["brokers"]
    assert {p["leader"] for p in listed["partitions"]} == {broker["id"]}


def test_kcat_reads_back_in_order_what_it_produced(bootstrap: str) -> None:
    name = topic(None, "kcat")
    sent = numbered(COUNT)
    kcat_produce(bootstrap, name, sent)
    records = kcat_consume(bootstrap, name, COUNT)
    assert [(r.partition, r.offset) for r in records] == [(0, i) for i in range(COUNT)]
    assert [r.message for r in records] == sent


def test_kcat_reads_headers_written_by_another_client(
    bootstrap: str, tidelog_client: Client
) -> None:
    name = topic(tidelog_client, "kcat-headers", PARTITIONS)
    sent = numbered(COUNT, headers=True)
    acks = confluent_produce(bootstrap, name, sent)
    assert_exact(acks, sent, kcat_consume(bootstrap, name, COUNT))


def test_consumers_start_inside_a_produced_batch(bootstrap: str) -> None:
    """One produce request stores 20 records; consumers that seek into it get exactly the
    records from their offset on (a fetch may start at any offset of a stored batch)."""
    name = topic(None, "seek")
    assert confluent_send(bootstrap, name, [Sent(b"%d" % i) for i in range(20)]) == [
        (0, i) for i in range(20)
    ]
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused-seek", "enable.auto.commit": False}
    )
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, 0, 5)])
        deadline = time.monotonic() + 15
        while len(got) < 15 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    assert got == [(i, b"%d" % i) for i in range(5, 20)]
    reader = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    read: list[tuple[int, bytes]] = []
    try:
        partition = kafka.TopicPartition(name, 0)
        reader.assign([partition])
        reader.seek(partition, 13)
        deadline = time.monotonic() + 15
        while len(read) < 7 and time.monotonic() < deadline:
            for batch in reader.poll(timeout_ms=500).values():
                read.extend((r.offset, r.value) for r in batch)
    finally:
        reader.close(autocommit=False)
    assert read == [(i, b"%d" % i) for i in range(13, 20)]


def test_a_waiting_fetch_is_answered_when_a_record_arrives(bootstrap: str) -> None:
    """A consumer at the end of a partition long-polls (fetch.wait.max.ms 10 s): a record
    produced meanwhile reaches it at once, not when the wait runs out."""
    name = topic(None, "long-poll")
    confluent_send(bootstrap, name, [Sent(b"first")])
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-long-poll",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10_000,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, 0, confluent_kafka.OFFSET_END)])
        assert consumer.poll(1.5) is None  # at the end, its fetch waiting on the server
        sent = time.monotonic()
        confluent_send(bootstrap, name, [Sent(b"second")])
        message = None
        while message is None and time.monotonic() - sent < 12:
            message = consumer.poll(0.05)
        waited = time.monotonic() - sent
    finally:
        consumer.close()
    assert message is not None and message.error() is None
    assert (message.offset(), message.value()) == (1, b"second")
    assert waited < 3.0, f"the record took {waited:.1f} s: the fetch was not woken"


# -- compression, idempotence ------------------------------------------------------------------


def _compressible(count: int) -> list[Outgoing]:
    """Messages whose batches shrink under every codec: librdkafka sends a batch uncompressed
    when compressing would not make it smaller, and these make sure it does."""
    return [
        Outgoing(b"value-%d " % i + b"tidelog " * 40, b"key-%d" % i, (("seq", b"%d" % i),))
        for i in range(count)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_compressed_batches_read_back_exactly(
    bootstrap: str, tidelog_client: Client, codec: str
) -> None:
    """librdkafka compresses only when it believes the broker can read the codec (from the
    ApiVersions answer: lz4 needs FindCoordinator v0 served, zstd Produce v7 and Fetch v10) and
    otherwise sends the batch uncompressed without a word: its debug log shows which it did."""
    name = topic(tidelog_client, f"confluent-{codec}", PARTITIONS)
    messages = _compressible(300)
    log: list[str] = []
    placed = confluent_send(
        bootstrap,
        name,
        [Sent(m.value, m.key, m.headers) for m in messages],
        timeout_s=20,
        log=log,
        compression_type=codec,
    )
    batches = [line for line in log if "Produce MessageSet" in line]
    assert batches and all(line.endswith(f", {codec})") for line in batches), [
        line for line in log if "compress" in line
    ] or batches
    acks = [Ack(*p) for p in placed]
    assert_exact(acks, messages, confluent_consume(bootstrap, name, len(messages)))


@pytest.mark.parametrize("codec", CODECS)
def test_java_compressed_batches_read_back_exactly(
    bootstrap: str, tidelog_client: Client, codec: str
) -> None:
    name = topic(tidelog_client, f"java-{codec}", PARTITIONS)
    acks = java_produce(bootstrap, name, 300, headers=True, compression=codec, timeout_s=20)
    assert_exact(acks, numbered(300, headers=True), java_consume(bootstrap, name, 300))


def test_confluent_idempotent_producer_stores_each_message_once(
    bootstrap: str, tidelog_client: Client
) -> None:
    name = topic(tidelog_client, "confluent-idempotent", PARTITIONS)
    sent = numbered(1000, headers=True)
    acks = confluent_produce(bootstrap, name, sent, idempotent=True, timeout_s=20)
    assert_exact(acks, sent, confluent_consume(bootstrap, name, len(sent)))
    for partition in range(PARTITIONS):
        offsets = [ack.offset for ack in acks if ack.partition == partition]
        assert offsets == list(range(len(offsets)))  # no gap, no duplicate


def test_java_idempotent_producer_stores_each_message_once(
    bootstrap: str, tidelog_client: Client
) -> None:
    name = topic(tidelog_client, "java-idempotent", PARTITIONS)
    acks = java_produce(bootstrap, name, 1000, idempotent=True, timeout_s=20)
    assert_exact(acks, numbered(1000), confluent_consume(bootstrap, name, 1000))


# -- offsets by timestamp ----------------------------------------------------------------------


def _two_bursts(bootstrap: str, name: str, size: int) -> int:
    """``size`` messages, a pause, ``size`` more; a time (ms) between the two bursts."""
    assert confluent_produce(bootstrap, name, numbered(size)) == [Ack(0, i) for i in range(size)]
    time.sleep(0.3)
    between = int(time.time() * 1000)
    time.sleep(0.3)
    second = confluent_produce(bootstrap, name, numbered(size, value_prefix="second-"))
    assert second == [Ack(0, size + i) for i in range(size)]
    return between


def test_confluent_offsets_for_times_finds_the_second_burst(bootstrap: str) -> None:
    name = topic(None, "times-confluent")
    between = _two_bursts(bootstrap, name, 10)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused-times"}
    )
    try:
        found = [
            consumer.offsets_for_times([confluent_kafka.TopicPartition(name, 0, stamp)], 10)[0]
            for stamp in (between, between - 60_000, between + 60_000)
        ]
    finally:
        consumer.close()
    assert [(tp.partition, tp.offset, tp.error) for tp in found] == [
        (0, 10, None),
        (0, 0, None),
        (0, confluent_kafka.OFFSET_END, None),  # none that late: the end
    ]


def test_kafka_python_offsets_for_times_finds_the_second_burst(bootstrap: str) -> None:
    name = topic(None, "times-kafka-python")
    between = _two_bursts(bootstrap, name, 10)
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partition = kafka.TopicPartition(name, 0)
        found = consumer.offsets_for_times({partition: between})[partition]
        earliest = consumer.offsets_for_times({partition: between - 60_000})[partition]
        none = consumer.offsets_for_times({partition: between + 60_000})[partition]
    finally:
        consumer.close(autocommit=False)
    assert found is not None and found.offset == 10 and found.timestamp >= between
    assert earliest is not None and earliest.offset == 0
    assert none is None


# -- topic administration (CreateTopics, DeleteTopics) -----------------------------------------


def _listed(bootstrap: str, name: str) -> list[int] | None:
    """The partitions kcat -L lists for ``name`` (None: not listed)."""
    for entry in kcat_metadata(bootstrap)["topics"]:
        if entry["topic"] == name:
            return sorted(p["partition"] for p in entry["partitions"])
    return None


def _eventually_unlisted(bootstrap: str, name: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _listed(bootstrap, name) is None:
            return True
        time.sleep(0.2)
    return False


def _confluent_admin(bootstrap: str, name: str, delete: bool) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if delete:
        futures = admin.delete_topics([name], operation_timeout=10)
    else:
        futures = admin.create_topics([NewTopic(name, 2, 1)], operation_timeout=10)
    for future in futures.values():
        future.result(timeout=15)


def _kafka_python_admin(bootstrap: str, name: str, delete: bool) -> None:
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    try:
        if delete:
            admin.delete_topics([name], timeout_ms=10_000)
        else:
            admin.create_topics(
                [kafka.admin.NewTopic(name=name, num_partitions=2, replication_factor=1)],
                timeout_ms=10_000,
            )
    finally:
        admin.close()


def _aiokafka_admin(bootstrap: str, name: str, delete: bool) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
        await admin.start()
        try:
            if delete:
                await admin.delete_topics([name], timeout_ms=10_000)
            else:
                await admin.create_topics(
                    [AioNewTopic(name=name, num_partitions=2, replication_factor=1)],
                    timeout_ms=10_000,
                )
        finally:
            await admin.close()

    asyncio.run(run())


def _java_admin(bootstrap: str, name: str, delete: bool) -> None:
    if delete:
        java_delete_topic(bootstrap, name)
    else:
        java_create_topic(bootstrap, name, 2)


ADMINS: dict[str, Callable[[str, str, bool], None]] = {
    "confluent-kafka": _confluent_admin,
    "kafka-python": _kafka_python_admin,
    "aiokafka": _aiokafka_admin,
    "java": _java_admin,
}


@pytest.mark.parametrize("client", sorted(ADMINS))
def test_admin_client_creates_and_deletes_a_topic(bootstrap: str, client: str) -> None:
    admin = ADMINS[client]
    name = topic(None, f"admin-{client}")
    admin(bootstrap, name, False)
    assert _listed(bootstrap, name) == [0, 1]
    acks = confluent_produce(bootstrap, name, numbered(10))
    assert {ack.partition for ack in acks} <= {0, 1}
    admin(bootstrap, name, True)
    assert _eventually_unlisted(bootstrap, name)


# -- record shapes and CreateTime --------------------------------------------------------------

CREATE_TIME = 1_600_000_000_000
"""An old CreateTime (2020), far from any broker time of the run."""

SHAPES: dict[str, Sent] = {
    "null-key": Sent(b"v", None),
    "empty-key-and-value": Sent(b"", b""),
    "null-value": Sent(None, b"tombstone"),
    "binary": Sent(bytes(range(256)) * 4, b"\x00\xff\x00"),
    "ordered-headers": Sent(b"v", b"k", (("z", b"1"), ("a", b"\x00\xff"), ("m", b""))),
    "duplicate-headers": Sent(b"v", b"k", (("a", b"1"), ("b", b"2"), ("a", b"3"))),
    "null-header-value": Sent(b"v", b"k", (("n", None), ("x", b"y"))),
    "reserved-header-name": Sent(b"v", b"k", (("__mine", b"1"), ("ok", b"2"))),
    "non-ascii-header-name": Sent(b"v", b"k", (("größe", b"1"),)),
}
"""Every shape a Kafka record can take that a tidelog record cannot hold as is."""

READERS: dict[str, Callable[..., list[Got]]] = {
    "confluent-kafka": confluent_read,
    "kafka-python": kafka_python_read,
}


@pytest.fixture(scope="module")
def shapes(bootstrap: str) -> dict[str, dict[str, Got | str]]:
    """Each of SHAPES produced to a topic of its own after two plain records (CreateTime
    ``CREATE_TIME + i`` for the i-th), read by each reader: by shape and reader the shape's
    record, or why it could not be produced or read (a shape that fails fails its own tests)."""
    plain = [Sent(b"before-0", b"k0"), Sent(b"before-1", None, (("h", b"1"),))]
    out: dict[str, dict[str, Got | str]] = {}
    for shape, sent in SHAPES.items():
        name = topic(None, f"shape-{shape}")
        records = [
            Sent(s.value, s.key, s.headers, CREATE_TIME + i) for i, s in enumerate([*plain, sent])
        ]
        out[shape] = {}
        try:
            placed = confluent_send(bootstrap, name, records, timeout_s=10)
        except ClientFailed as failure:
            out[shape] = dict.fromkeys(READERS, f"produce failed: {failure}")
            continue
        assert placed == [(0, i) for i in range(len(records))]
        for reader, read in READERS.items():
            try:
                got = read(bootstrap, name, len(records), timeout_s=10)
            except ClientFailed as failure:
                out[shape][reader] = f"read failed: {failure}"
            else:
                assert [g.content for g in got[:2]] == [
                    (r.key, r.value, r.headers) for r in records[:2]
                ]
                out[shape][reader] = got[2]
    return out


def _got(shapes: dict[str, dict[str, Got | str]], shape: str, reader: str) -> Got:
    got = shapes[shape][reader]
    assert isinstance(got, Got), got
    return got


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_record_shapes_read_back_exactly(
    shapes: dict[str, dict[str, Got | str]], shape: str, reader: str
) -> None:
    sent = SHAPES[shape]
    got = _got(shapes, shape, reader)
    assert got.offset == 2
    assert got.content == (sent.key, sent.value, sent.headers)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_create_time_reads_back_exactly(
    shapes: dict[str, dict[str, Got | str]], reader: str
) -> None:
    got = _got(shapes, "ordered-headers", reader)
    assert (got.timestamp_type, got.timestamp_ms) == ("create", CREATE_TIME + 2)


def test_java_reads_the_producers_create_time(bootstrap: str) -> None:
    """The Java producer stamps each record itself (its acks carry that CreateTime): the Java
    consumer reads the same stamps back, typed CreateTime."""
    name = topic(None, "java-create-time")
    produced = java_tool(
        "produce", "--bootstrap", bootstrap, "--topic", name, "--count", "20", "--print-acks"
    )
    consumed = java_tool("consume", "--bootstrap", bootstrap, "--topic", name, "--count", "20")
    stamps = {line["offset"]: line["timestamp"] for line in produced if "seq" in line}
    assert len(stamps) == 20
    assert {line["offset"]: line["timestamp"] for line in consumed} == stamps
    assert {line["timestamp_type"] for line in consumed} == {"CreateTime"}


# -- one connection, pipelined ------------------------------------------------------------------

STRESS = 50_000


def test_one_connection_pipelining_produces_keeps_every_message_once_in_order(
    bootstrap: str,
) -> None:
    """librdkafka with up to 5 produce requests in flight on its one connection and no linger:
    every message is acknowledged at the offset of its send order, and read back once, in
    order."""
    name = topic(None, "pipelined")
    records = [Sent(b"%d" % i) for i in range(STRESS)]
    log: list[str] = []
    placed = confluent_send(
        bootstrap,
        name,
        records,
        timeout_s=120,
        log=log,
        debug="protocol",
        linger_ms=0,
        max_in_flight_requests_per_connection=5,
        batch_num_messages=500,  # many small requests, so that several are in flight
    )
    assert placed == [(0, i) for i in range(STRESS)]
    assert _most_in_flight(log) > 1  # it did pipeline
    got = confluent_read(bootstrap, name, STRESS, timeout_s=120)
    assert [(g.offset, g.value) for g in got] == [(i, b"%d" % i) for i in range(STRESS)]


def _most_in_flight(log: list[str]) -> int:
    """The most produce requests librdkafka had sent and not yet seen answered, from its
    ``protocol`` debug lines (one connection: the producer's one broker)."""
    outstanding = most = 0
    for line in log:
        if "Sent ProduceRequest" in line:
            outstanding += 1
            most = max(most, outstanding)
        elif "Received ProduceResponse" in line:
            outstanding -= 1
    return most
