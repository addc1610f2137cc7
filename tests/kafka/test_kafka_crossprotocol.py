"""One record, every protocol: what a Kafka producer writes reads back byte for byte through
tidelog's own APIs (v1 subscriptions and batches, Browse, reverse reads, Liftbridge's
``proto.API``), and what tidelog's APIs publish reads back through Kafka consumers.

The model (``docs/kafka.md``; ``tests/kafka/kafka_exact.py`` spells its bytes): a Kafka record's
key, value and headers are the tidelog record's, in order, after one reserved first header
``__kafka`` holding the producer's CreateTime (and, when the record's headers or null value cannot
be tidelog's, those too); the tidelog record's own timestamp is the broker's append time. A record
published over tidelog's APIs reads over Kafka with the broker's time in ms and its headers
without the reserved ``__*`` ones. Offsets are the same everywhere.

The Spark side of the same round trip (tidelog's Spark source reading a Kafka-written topic) is in
``tests/spark/test_kafka_spark.py``, which needs the suite's SparkSession.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from tests.kafka.kafka_exact import (
    KAFKA_HEADER,
    NULL_VALUE,
    RAW_HEADERS,
    Got,
    KafkaServed,
    Sent,
    confluent_read,
    confluent_send,
    header_block,
    kafka_python_read,
    marker,
    tidelog_with_kafka,
)

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import AsyncClient, Client, Message, ReceivedMessage
from tidelog.wire import columns

pytestmark = pytest.mark.slow

FROM_KAFKA = "from-kafka"
PARTITIONS = 2
PER_PARTITION = 10
CREATE_TIME = 1_700_000_000_000
"""Producer timestamps (2023), far from the broker's clock during the run."""


@dataclass(frozen=True)
class Seen:
    """A record as one API shows it, keyed for comparison across APIs."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ns: int

    @property
    def user(self) -> tuple[int, int, bytes | None, bytes, tuple[tuple[str, bytes], ...]]:
        """Where it is and what it holds, without the reserved ``__*`` headers."""
        public = tuple((k, v) for k, v in self.headers if not k.startswith("__"))
        return (self.partition, self.offset, self.key, self.value, public)


@dataclass(frozen=True)
class Written:
    """The Kafka records of FROM_KAFKA, where they went and the broker's time window."""

    sent: list[Sent]
    placed: list[tuple[int, int]]
    after_ns: int
    before_ns: int

    def expected(self) -> list[tuple[int, int, bytes | None, bytes, tuple[tuple[str, bytes], ...]]]:
        out = []
        for record, (partition, offset) in zip(self.sent, self.placed, strict=True):
            headers = tuple((k, v or b"") for k, v in record.headers)
            out.append((partition, offset, record.key, record.value or b"", headers))
        return sorted(out, key=lambda e: (e[0], e[1]))

    def markers(self) -> dict[tuple[int, int], bytes]:
        return {
            place: marker(record.timestamp_ms or 0)
            for record, place in zip(self.sent, self.placed, strict=True)
        }


@pytest.fixture(scope="module")
def kafka_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServed]:
    with tidelog_with_kafka(tmp_path_factory.mktemp("kafka-cross") / "data") as served:
        yield served


@pytest.fixture(scope="module")
def client(kafka_served: KafkaServed) -> Iterator[Client]:
    with Client(kafka_served.process.address) as connection:
        yield connection


@pytest.fixture(scope="module")
def written(kafka_served: KafkaServed, client: Client) -> Written:
    """PARTITIONS x PER_PARTITION records from librdkafka: a key, a value of every byte, two
    headers with binary values, an explicit CreateTime each."""
    client.create_stream(FROM_KAFKA, partitions=PARTITIONS)
    sent = [
        Sent(
            value=bytes(range(256)) + b"#%d" % i,
            key=b"key-\x00\xff-%d" % i,
            headers=(("trace", b"\x00\x01\xfe\xff%d" % i), ("kind", b"binary")),
            timestamp_ms=CREATE_TIME + i,
            partition=i % PARTITIONS,
        )
        for i in range(PARTITIONS * PER_PARTITION)
    ]
    after = time.time_ns()
    placed = confluent_send(kafka_served.bootstrap, FROM_KAFKA, sent)
    before = time.time_ns()
    assert sorted(placed) == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
    return Written(sent, placed, after, before)


def _seen(message: ReceivedMessage) -> Seen:
    return Seen(
        message.partition,
        message.offset,
        message.key,
        message.value,
        tuple(message.headers.items()),
        message.timestamp,
    )


def _subscribed(address: str, stream: str, *, reverse: bool = False) -> list[Seen]:
    async def run() -> list[Seen]:
        async with AsyncClient(address) as aio:
            out: list[Seen] = []
            for partition in range(PARTITIONS):
                if reverse:
                    messages = aio.subscribe(stream, partition, reverse=True)
                else:
                    messages = aio.subscribe(stream, partition, start="earliest", stop="latest")
                out.extend([_seen(m) async for m in messages])
            return out

    return asyncio.run(run())


def _batches(address: str, stream: str) -> list[Seen]:
    async def run() -> list[Seen]:
        async with AsyncClient(address) as aio:
            out: list[Seen] = []
            for partition in range(PARTITIONS):
                batches = aio.subscribe_batches(stream, partition, start="earliest", stop="latest")
                async for batch in batches:
                    frame = batch.frame  # the columns as they arrived (ReceivedBatch.frame)
                    values, keys, headers = columns.unpack(frame.messages)
                    offsets = columns.int64_list(frame.offsets)
                    stamps = columns.int64_list(frame.timestamps)
                    for i, value in enumerate(values):
                        out.append(
                            Seen(
                                partition,
                                offsets[i],
                                None if keys is None else keys[i],
                                value,
                                tuple((headers[i] if headers else {}).items()),
                                stamps[i],
                            )
                        )
            return out

    return asyncio.run(run())


def _browsed(address: str, stream: str, newest_first: bool) -> list[Seen]:
    async def run() -> list[Seen]:
        async with AsyncClient(address) as aio:
            page = await aio.browse(stream, limit=1000, newest_first=newest_first)
            return [_seen(m) for m in page.messages]

    return asyncio.run(run())


def _liftbridge(address: str, stream: str, count_per_partition: int) -> list[Seen]:
    out: list[Seen] = []
    with grpc.insecure_channel(address) as channel:
        api = pb_grpc.APIStub(channel)
        for partition in range(PARTITIONS):
            call = api.Subscribe(
                pb.SubscribeRequest(stream=stream, partition=partition, startPosition=pb.EARLIEST),
                timeout=15,
            )
            assert next(call) == pb.Message()  # the subscription's opening frame
            for _ in range(count_per_partition):
                m = next(call)
                out.append(
                    Seen(
                        m.partition,
                        m.offset,
                        m.key,
                        m.value,
                        tuple(sorted(m.headers.items())),
                        m.timestamp,
                    )
                )
            call.cancel()
    return out


def _in_order(seen: list[Seen]) -> list[Seen]:
    return sorted(seen, key=lambda s: (s.partition, s.offset))


def _assert_broker_time(written: Written, seen: list[Seen]) -> None:
    """Every record's tidelog timestamp is the broker's append time, not the CreateTime."""
    for s in seen:
        assert written.after_ns <= s.timestamp_ns <= written.before_ns, s


# -- Kafka in, tidelog's APIs out ---------------------------------------------------------------


def test_v1_subscription_reads_kafka_records_byte_for_byte(
    kafka_served: KafkaServed, written: Written
) -> None:
    seen = _subscribed(kafka_served.process.address, FROM_KAFKA)
    assert [s.user for s in seen] == written.expected()
    _assert_broker_time(written, seen)


def test_v1_batches_read_kafka_records_byte_for_byte(
    kafka_served: KafkaServed, written: Written
) -> None:
    seen = _batches(kafka_served.process.address, FROM_KAFKA)
    assert [s.user for s in seen] == written.expected()
    _assert_broker_time(written, seen)


def test_reverse_subscription_reads_kafka_records_newest_first(
    kafka_served: KafkaServed, written: Written
) -> None:
    backward = _subscribed(kafka_served.process.address, FROM_KAFKA, reverse=True)
    for partition in range(PARTITIONS):
        offsets = [s.offset for s in backward if s.partition == partition]
        assert offsets == list(range(PER_PARTITION - 1, -1, -1))
    assert [s.user for s in _in_order(backward)] == written.expected()


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
def test_browse_reads_kafka_records_byte_for_byte(
    kafka_served: KafkaServed, written: Written, newest_first: bool
) -> None:
    page = _browsed(kafka_served.process.address, FROM_KAFKA, newest_first)
    order = [(s.timestamp_ns, s.partition, s.offset) for s in page]
    assert order == sorted(order, reverse=newest_first)
    assert [s.user for s in _in_order(page)] == written.expected()
    _assert_broker_time(written, page)


def test_liftbridge_subscription_reads_kafka_records_byte_for_byte(
    kafka_served: KafkaServed, written: Written
) -> None:
    seen = _liftbridge(kafka_served.process.address, FROM_KAFKA, PER_PARTITION)
    # proto.API's headers are a map: compared by name, not by order.
    expected = [(p, o, k, v, tuple(sorted(h))) for p, o, k, v, h in written.expected()]
    assert [s.user for s in _in_order(seen)] == expected
    _assert_broker_time(written, seen)


def test_every_tidelog_api_shows_the_kafka_header_first_with_the_create_time(
    kafka_served: KafkaServed, written: Written
) -> None:
    """The reserved ``__kafka`` header, exactly: version 1, no flags, the CreateTime sent."""
    address = kafka_served.process.address
    markers = written.markers()
    ordered = {
        "subscribe": _subscribed(address, FROM_KAFKA),
        "batches": _batches(address, FROM_KAFKA),
        "reverse": _subscribed(address, FROM_KAFKA, reverse=True),
        "browse": _browsed(address, FROM_KAFKA, newest_first=False),
    }
    for api, seen in ordered.items():
        firsts = {(s.partition, s.offset): s.headers[:1] for s in seen}
        assert firsts == {place: ((KAFKA_HEADER, m),) for place, m in markers.items()}, api
    liftbridge = _liftbridge(address, FROM_KAFKA, PER_PARTITION)
    got = {(s.partition, s.offset): dict(s.headers).get(KAFKA_HEADER) for s in liftbridge}
    assert got == markers


def test_a_null_kafka_value_reads_empty_over_tidelog_and_flagged(
    kafka_served: KafkaServed, client: Client
) -> None:
    client.create_stream("kafka-null-value")
    after = time.time_ns()
    placed = confluent_send(
        kafka_served.bootstrap,
        "kafka-null-value",
        [Sent(None, b"gone", timestamp_ms=CREATE_TIME), Sent(b"", b"empty", (("h", b"x"),))],
    )
    assert placed == [(0, 0), (0, 1)]
    (null, empty) = client.subscribe("kafka-null-value", start="earliest", stop="latest")
    assert (null.key, null.value, dict(null.headers)) == (
        b"gone",
        b"",
        {KAFKA_HEADER: marker(CREATE_TIME, NULL_VALUE)},
    )
    assert (empty.key, empty.value, list(empty.headers)) == (b"empty", b"", [KAFKA_HEADER, "h"])
    assert empty.headers[KAFKA_HEADER][:2] == bytes([1, 0])  # not null: no flag
    assert null.timestamp >= after


def test_kafka_headers_tidelog_cannot_hold_travel_in_the_kafka_header(
    kafka_served: KafkaServed, client: Client
) -> None:
    """Duplicate names, a null value, a reserved name: the record's tidelog headers are the
    ``__kafka`` header alone, flagged, with Kafka's own encoding of the headers after the
    CreateTime; Kafka readers get the headers back as sent."""
    headers = (("a", b"1"), ("a", b"2"), ("n", None), ("__x", b"y"))
    client.create_stream("kafka-raw-headers")
    sent = Sent(b"v", b"k", headers, CREATE_TIME)
    placed = confluent_send(kafka_served.bootstrap, "kafka-raw-headers", [sent], timeout_s=10)
    assert placed == [(0, 0)]
    (record,) = client.subscribe("kafka-raw-headers", start="earliest", stop="latest")
    assert dict(record.headers) == {
        KAFKA_HEADER: marker(CREATE_TIME, RAW_HEADERS, header_block(headers))
    }
    (got,) = confluent_read(kafka_served.bootstrap, "kafka-raw-headers", 1)
    assert got.content == (b"k", b"v", headers)


# -- tidelog's APIs in, Kafka out ---------------------------------------------------------------

FROM_V1 = "from-v1"

READERS = {"confluent-kafka": confluent_read, "kafka-python": kafka_python_read}


@pytest.fixture(scope="module")
def from_v1(client: Client) -> list[ReceivedMessage]:
    """Records published over tidelog v1 (keys or none, binary values, an empty one, headers
    or none; the last batch idempotent, so its last record carries the reserved
    ``__producer``), as v1 reads them back."""
    client.create_stream(FROM_V1)
    client.publish_batch(
        FROM_V1,
        [
            Message(bytes(range(256)), key=b"k0", headers={"z": b"\x00", "a": b"\xff"}),
            Message(b"", key=None),
            Message(b"plain"),
            Message(b"\x00" * 10, key=b"", headers={"only": b""}),
        ],
        partition=0,
    )
    client.publish_batch(
        FROM_V1,
        [Message(b"once-%d" % i, key=b"p", headers={"i": b"%d" % i}) for i in range(3)],
        partition=0,
        producer_id="cross-protocol",
        producer_sequence=0,
    )
    stored = list(client.subscribe(FROM_V1, start="earliest", stop="latest"))
    assert "__producer" in stored[-1].headers  # a reserved header Kafka readers must not see
    return stored


@pytest.mark.parametrize("reader", sorted(READERS))
def test_v1_records_read_over_kafka_with_broker_time_and_no_reserved_headers(
    kafka_served: KafkaServed, from_v1: list[ReceivedMessage], reader: str
) -> None:
    got = READERS[reader](kafka_served.bootstrap, FROM_V1, len(from_v1))
    expected = [
        (
            0,
            m.offset,
            m.key,
            m.value,
            tuple((k, v) for k, v in m.headers.items() if not k.startswith("__")),
        )
        for m in from_v1
    ]
    assert [(g.partition, g.offset, *g.content) for g in got] == expected
    assert [g.timestamp_ms for g in got] == [m.timestamp // 1_000_000 for m in from_v1]


def test_liftbridge_publish_reads_over_kafka(kafka_served: KafkaServed, client: Client) -> None:
    client.create_stream("from-liftbridge")
    with grpc.insecure_channel(kafka_served.process.address) as channel:
        api = pb_grpc.APIStub(channel)
        acks = [
            api.Publish(
                pb.PublishRequest(
                    stream="from-liftbridge",
                    key=b"lb-%d" % i,
                    value=b"\x00value-%d" % i,
                    headers={"h": b"%d" % i},
                    ackPolicy=pb.ALL,
                )
            ).ack
            for i in range(5)
        ]
    assert [a.offset for a in acks] == list(range(5))
    stamps = [m.timestamp for m in client.subscribe("from-liftbridge", start="earliest", stop=4)]
    got: list[Got] = confluent_read(kafka_served.bootstrap, "from-liftbridge", 5)
    assert [(g.offset, *g.content) for g in got] == [
        (i, b"lb-%d" % i, b"\x00value-%d" % i, (("h", b"%d" % i),)) for i in range(5)
    ]
    assert [g.timestamp_ms for g in got] == [s // 1_000_000 for s in stamps]
