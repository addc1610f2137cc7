"""The Kafka <-> tidelog record mapping (``tidelog/kafka/convert.py``), checked through a real
log: Kafka batch -> parse -> to_tidelog -> append -> read -> to_kafka -> parse gives back the
producer's keys, values, headers and timestamps exactly."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker import MessageBatch, NewRecord, RecordBodies
from tidelog.broker.producers import with_producer_header
from tidelog.kafka.compression import Codec
from tidelog.kafka.convert import (
    KAFKA_HEADER,
    NULL_VALUE,
    RAW_HEADERS,
    to_kafka,
    to_tidelog,
)
from tidelog.kafka.records import LOG_APPEND_TIME, KafkaBatch, build_batch, parse_batches
from tidelog.log import SegmentedLog

Header = tuple[str | bytes, bytes | None]
Record = tuple[int, bytes | None, bytes | None, list[Header]]
"""(timestamp ms, key, value, headers)"""
NS = 1_000_000
BROKER_NS = 1_700_000_000_000 * NS


def kafka_batch(records: Sequence[Record], **kwargs: object) -> KafkaBatch:
    n = len(records)
    keys = [r[1] for r in records]
    values = [r[2] for r in records]
    key_len = np.array([-1 if k is None else len(k) for k in keys], dtype=np.int64)
    value_len = np.array([-1 if v is None else len(v) for v in values], dtype=np.int64)
    data = build_batch(
        offsets=np.arange(n, dtype=np.int64),
        timestamps=np.array([r[0] for r in records], dtype=np.int64),
        keys=(
            b"".join(k or b"" for k in keys),
            np.cumsum(np.maximum(key_len, 0)) - np.maximum(key_len, 0),
            key_len,
        ),
        values=(
            b"".join(v or b"" for v in values),
            np.cumsum(np.maximum(value_len, 0)) - np.maximum(value_len, 0),
            value_len,
        ),
        headers=[r[3] or None for r in records],
        **kwargs,  # type: ignore[arg-type]
    )
    [batch] = parse_batches(data)
    return batch


def stored(
    log: SegmentedLog, messages: Sequence[bytes | NewRecord], when: int = BROKER_NS
) -> MessageBatch:
    offsets = log.append(messages, timestamp=when)
    batch, _, _ = log.read_forward(offsets[0], offsets[-1], len(offsets), 1 << 30)
    assert len(batch) == len(offsets)
    return batch


def fetched(batch: MessageBatch, *, log_append_time: bool = False) -> list[KafkaBatch]:
    return parse_batches(to_kafka(batch, log_append_time=log_append_time))


def seen(
    batches: list[KafkaBatch],
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]]:
    return [
        (
            b.base_offset + int(b.offset_delta[i]),
            int(b.timestamp[i]),
            b.keys()[i],
            b.values()[i],
            b.raw_headers_of(i),
        )
        for b in batches
        for i in range(b.count)
    ]


def as_raw(headers: list[Header]) -> list[tuple[bytes, bytes | None]]:
    return [(k.encode() if isinstance(k, str) else k, v) for k, v in headers]


header_keys = st.sampled_from(["a", "b", "__x", "é"]) | st.text(max_size=4) | st.binary(max_size=4)
records = st.lists(
    st.tuples(
        st.integers(-(2**40), 2**41).filter(lambda t: t != -1),
        st.none() | st.binary(max_size=10),
        st.none() | st.binary(max_size=30),
        st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=5)), max_size=3)
        | st.just([]),
    ),
    min_size=1,
    max_size=40,
)


@pytest.fixture
def log(make_log: Callable[[str], SegmentedLog]) -> SegmentedLog:
    return make_log("kafka")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=records, idempotent=st.booleans(), codec=st.sampled_from(list(Codec)))
def test_a_produced_batch_is_fetched_back_exactly(
    log: SegmentedLog, batch: list[Record], idempotent: bool, codec: Codec
) -> None:
    bodies: Sequence[bytes | NewRecord] = to_tidelog(kafka_batch(batch, codec=codec))
    if idempotent:  # the broker adds __producer and __owner to the last record
        bodies = with_producer_header(bodies, "p", 1, "alice")
    read = stored(log, bodies)
    back = seen(fetched(read))
    assert [b[0] for b in back] == read.offsets.tolist()
    assert [b[1:] for b in back] == [(t, k, v, as_raw(h)) for t, k, v, h in batch]


def test_the_common_record_stores_one_ten_byte_header_first() -> None:
    batch = kafka_batch([(1_234, b"k", b"v", []), (-5, None, None, []), (7, b"", b"", [])])
    bodies = to_tidelog(batch)
    assert isinstance(bodies, RecordBodies)
    got = bodies.records()
    assert [(r.key, r.value) for r in got] == [(b"k", b"v"), (None, b""), (b"", b"")]
    metas = [r.headers[KAFKA_HEADER] for r in got]
    assert [list(r.headers) for r in got] == [[KAFKA_HEADER]] * 3
    assert [struct.unpack("<BBq", m) for m in metas] == [
        (1, 0, 1_234),
        (1, NULL_VALUE, -5),
        (1, 0, 7),
    ]


def test_storable_headers_follow_the_kafka_header_as_tidelog_headers() -> None:
    bodies = to_tidelog(kafka_batch([(1, None, b"v", [("b", b"2"), ("a", b""), ("é", b"3")])]))
    [record] = bodies.records()
    assert list(record.headers.items())[1:] == [("b", b"2"), ("a", b""), ("é", b"3")]
    assert record.headers[KAFKA_HEADER][1] == 0


@pytest.mark.parametrize(
    "headers",
    [
        [("a", b"1"), ("a", b"2")],  # a name repeated
        [("a", None)],  # a null value
        [("__producer", b"x")],  # a reserved name
        [(b"\xff\xfe", b"x")],  # not UTF-8
        [("k" * 70_000, b"x")],  # a name longer than a record's u16 length
    ],
)
def test_headers_a_tidelog_record_cannot_hold_are_kept_raw(headers: list[Header]) -> None:
    batch = kafka_batch([(1, None, None, headers)])
    [record] = to_tidelog(batch).records()
    assert list(record.headers) == [KAFKA_HEADER]
    meta = record.headers[KAFKA_HEADER]
    assert meta[:2] == bytes([1, NULL_VALUE | RAW_HEADERS])
    assert meta[10:] == batch.records[int(batch.headers_start[0]) : int(batch.headers_end[0])]


def test_a_log_append_time_batch_stores_no_producer_time(log: SegmentedLog) -> None:
    batch = kafka_batch([(55, None, b"v", [])], timestamp_type=LOG_APPEND_TIME)
    [record] = to_tidelog(batch).records()
    assert struct.unpack("<BBq", record.headers[KAFKA_HEADER])[2] == -1
    [(_, ts, _, value, _)] = seen(fetched(stored(log, [record], when=BROKER_NS + 42 * NS)))
    assert (ts, value) == (BROKER_NS // NS + 42, b"v")


def test_records_published_over_grpc_get_the_broker_time_and_no_reserved_headers(
    log: SegmentedLog,
) -> None:
    messages: list[bytes | NewRecord] = [
        b"plain",
        NewRecord(b"v", key=b"k", headers={"h": b"1", "__owner": b"x", "g": b""}),
        NewRecord(b"", headers={KAFKA_HEADER: b"\x02" + bytes(9)}),  # another version: ignored
        NewRecord(b"w", headers={"z": b"1", KAFKA_HEADER: bytes([1, 0]) + bytes(8)}),  # not first
        NewRecord(b"x", headers={KAFKA_HEADER: bytes([1, RAW_HEADERS]) + bytes(8) + b"\x09"}),
    ]
    back = seen(fetched(stored(log, messages, when=BROKER_NS + 7 * NS + 5)))
    ms = BROKER_NS // NS + 7
    assert back == [
        (0, ms, None, b"plain", []),
        (1, ms, b"k", b"v", [(b"h", b"1"), (b"g", b"")]),
        (2, ms, None, b"", []),
        (3, ms, None, b"w", [(b"z", b"1")]),
        (4, ms, None, b"x", []),  # raw headers that do not parse: dropped
    ]


def test_log_append_time_gives_every_record_the_broker_time_one_batch_per_ms(
    log: SegmentedLog,
) -> None:
    produced = to_tidelog(kafka_batch([(5, None, b"a", []), (6, None, b"b", [("h", b"1")])]))
    stored(log, produced, when=BROKER_NS)
    stored(log, [b"c"], when=BROKER_NS + 300_000)  # the same millisecond
    stored(log, produced, when=BROKER_NS + 2 * NS)
    read, _, _ = log.read_forward(0, 10, 100, 1 << 20)
    batches = fetched(read, log_append_time=True)
    assert [b.count for b in batches] == [3, 2]
    assert all(b.timestamp_type == LOG_APPEND_TIME for b in batches)
    assert [b.max_timestamp for b in batches] == [BROKER_NS // NS, BROKER_NS // NS + 2]
    back = seen(batches)
    assert [b[0] for b in back] == [0, 1, 2, 3, 4]
    assert [b[3] for b in back] == [b"a", b"b", b"c", b"a", b"b"]
    assert back[4][4] == [(b"h", b"1")]


def test_offset_gaps_survive_the_fetch(log: SegmentedLog) -> None:
    read = stored(log, to_tidelog(kafka_batch([(i, None, bytes([i]), []) for i in range(6)])))
    kept = read.take(np.array([0, 2, 3, 5]))
    [batch] = fetched(kept)
    assert (batch.base_offset + batch.offset_delta).tolist() == [0, 2, 3, 5]
    assert batch.last_offset_delta == 5
    assert batch.values() == [b"\x00", b"\x02", b"\x03", b"\x05"]
    assert to_kafka(MessageBatch.empty(), log_append_time=False) == b""


def test_a_fetched_batch_carries_the_leader_epoch(log: SegmentedLog) -> None:
    read = stored(log, [b"x"])
    [batch] = parse_batches(to_kafka(read, log_append_time=False, partition_leader_epoch=4))
    assert batch.partition_leader_epoch == 4
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
