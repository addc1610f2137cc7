"""The RecordBatch v2 codec (``tidelog/kafka/records.py``): what it parses and builds, against
kafka-python's pure-Python reader and writer as an independent implementation, and every way a
batch can be refused."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam
import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tidelog.kafka.compression import XERIAL_MAGIC, Codec
from tidelog.kafka.errors import (
    CorruptBatch,
    ErrorCode,
    InvalidRecord,
    KafkaError,
    UnsupportedCompression,
    UnsupportedMessageFormat,
)
from tidelog.kafka.records import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    KafkaBatch,
    build_batch,
    parse_batches,
)

Headers = list[tuple[str | bytes, bytes | None]]


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def as_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def build(records: Sequence[Rec], **kwargs: object) -> bytes:
    """``records`` through ``build_batch``: keys in one buffer, values in another."""
    keys = b"".join(r.key or b"" for r in records)
    values = b"".join(r.value or b"" for r in records)
    key_len = np.array([-1 if r.key is None else len(r.key) for r in records], dtype=np.int64)
    value_len = np.array([-1 if r.value is None else len(r.value) for r in records], np.int64)
    key_start = np.cumsum(np.maximum(key_len, 0)) - np.maximum(key_len, 0)
    value_start = np.cumsum(np.maximum(value_len, 0)) - np.maximum(value_len, 0)
    return build_batch(
        offsets=np.array([r.offset for r in records], dtype=np.int64),
        timestamps=np.array([r.timestamp for r in records], dtype=np.int64),
        keys=(keys, key_start, key_len),
        values=(values, value_start, value_len),
        headers=[r.headers or None for r in records],
        **kwargs,  # type: ignore[arg-type]
    )


def read_back(batch: KafkaBatch) -> list[Rec]:
    offsets = (batch.base_offset + batch.offset_delta).tolist()
    return [
        Rec(o, t, k, v, [(as_bytes(hk), hv) for hk, hv in batch.raw_headers_of(i)])
        for i, (o, t, k, v) in enumerate(
            zip(offsets, batch.timestamp.tolist(), batch.keys(), batch.values(), strict=True)
        )
    ]


def raw(records: Sequence[Rec]) -> list[Rec]:
    """``records`` with header keys as bytes (how ``read_back`` gives them)."""
    return [
        Rec(r.offset, r.timestamp, r.key, r.value, [(as_bytes(k), v) for k, v in r.headers])
        for r in records
    ]


def kafka_python_build(records: Sequence[Rec], compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for r in records:
        builder.append(r.offset, r.timestamp, r.key, r.value, r.headers)
    return bytes(builder.build())


def kafka_python_read(data: bytes) -> list[Rec]:
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    return [
        Rec(r.offset, r.timestamp, r.key, r.value, [(k.encode(), v) for k, v in r.headers])
        for r in batch
    ]


header_key_text = st.text(max_size=5)
header_keys = header_key_text | st.binary(max_size=5)
timestamps = st.integers(-(2**40), 2**41)


@st.composite
def record_lists(draw: st.DrawFn, keys: st.SearchStrategy[str | bytes] = header_keys) -> list[Rec]:
    n = draw(st.integers(1, 50))
    offsets = np.cumsum([0, *draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1))])
    base = draw(st.integers(0, 2**40))
    same_ts = draw(st.booleans())
    first = draw(timestamps)
    out = []
    for i in range(n):
        out.append(
            Rec(
                int(offsets[i]) + base,
                first if same_ts else draw(timestamps),
                draw(st.none() | st.binary(max_size=12)),
                draw(st.none() | st.binary(max_size=40)),
                draw(st.lists(st.tuples(keys, st.none() | st.binary(max_size=6)), max_size=3)),
            )
        )
    return out


# -- reading and writing ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(record_lists(), st.sampled_from(list(Codec)))
def test_what_is_built_parses_back_with_every_codec(records: list[Rec], codec: Codec) -> None:
    [batch] = parse_batches(build(records, codec=codec))
    assert batch.codec is codec and batch.count == len(records)
    assert read_back(batch) == raw(records)
    assert batch.base_offset == records[0].offset
    assert batch.last_offset_delta == records[-1].offset - records[0].offset
    assert batch.base_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)


@settings(max_examples=150, deadline=None)
@given(record_lists(keys=header_key_text))
def test_kafka_python_reads_what_is_built_and_builds_the_same_bytes(records: list[Rec]) -> None:
    assert kafka_python_read(build(records)) == raw(records)
    # A producer's batch as kafka-python writes it: offsets from 0, its leader epoch 0, times
    # not below its initial max timestamp (-1). The same records must give the same bytes.
    sent = [
        Rec(r.offset - records[0].offset, abs(r.timestamp), r.key, r.value, r.headers)
        for r in records
    ]
    assert build(sent, partition_leader_epoch=0) == kafka_python_build(sent)


@settings(max_examples=150, deadline=None)
@given(record_lists(keys=header_key_text), st.sampled_from([0, 1]))
def test_what_kafka_python_builds_parses(records: list[Rec], gzip: int) -> None:
    from_zero = [
        Rec(r.offset - records[0].offset, r.timestamp, r.key, r.value, r.headers) for r in records
    ]
    [batch] = parse_batches(kafka_python_build(from_zero, compression=gzip))
    assert read_back(batch) == raw(from_zero)
    assert [batch.headers_of(i) for i in range(batch.count)] == [
        [(str(k), v) for k, v in r.headers] for r in from_zero
    ]


def test_kafka_python_reads_every_record_shape() -> None:
    records = [
        Rec(0, 1_000, b"k", b"v", []),
        Rec(1, 900, b"", None, [("h", b"1"), ("h", None), ("", b"")]),  # negative delta
        Rec(5, 2_000, None, b"", []),  # an offset gap
    ]
    data = build(records)
    assert kafka_python_read(data) == raw(records)
    [batch] = parse_batches(data)
    assert batch.keys() == [b"k", b"", None]
    assert batch.values() == [b"v", None, b""]
    assert batch.headers_of(1) == [("h", b"1"), ("h", None), ("", b"")]
    assert batch.offset_delta.tolist() == [0, 1, 5]
    assert batch.timestamp.tolist() == [1_000, 900, 2_000]


def test_batches_back_to_back_parse_in_order() -> None:
    one = build([Rec(0, 1, b"a", b"1", [])], codec=Codec.GZIP)
    two = build([Rec(7, 2, None, b"2", []), Rec(8, 3, None, b"3", [])], codec=Codec.ZSTD)
    parsed = parse_batches(memoryview(bytearray(one + two)))
    assert [b.base_offset for b in parsed] == [0, 7]
    assert [b.values() for b in parsed] == [[b"1"], [b"2", b"3"]]
    assert parse_batches(b"") == []


def test_header_flags_are_exposed() -> None:
    records = [Rec(0, 5, None, b"x", [])]
    [batch] = parse_batches(
        build(records, is_transactional=True, producer_id=9, producer_epoch=2, base_sequence=4)
    )
    assert batch.is_transactional and not batch.is_control
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 2, 4)
    [appended] = parse_batches(build(records, timestamp_type=LOG_APPEND_TIME))
    assert appended.timestamp_type == LOG_APPEND_TIME and appended.attributes & 0x08
    control = reframe(build(records), attributes=0x20)
    assert parse_batches(control)[0].is_control


def test_many_records_with_headers_are_checked_and_read_column_wise() -> None:
    records = [Rec(i, i, None, b"v", [("a", b"1")] * (i % 4)) for i in range(200)]
    [batch] = parse_batches(build(records))
    assert read_back(batch) == raw(records)


def test_records_of_differing_sizes_find_their_starts() -> None:
    sizes = [0, 1, 100, 5000, 63, 64, 8191, 8192, 20000]
    records = [Rec(i, i * 1000, None, bytes(s), []) for i, s in enumerate(sizes * 30)]
    [batch] = parse_batches(build(records))
    assert batch.value_len.tolist() == sizes * 30
    uniform = [Rec(i, 0, None, bytes(100), []) for i in range(20_000)]  # deltas widen at 64, 8192
    [batch] = parse_batches(build(uniform))
    assert batch.offset_delta.tolist() == list(range(20_000))


# -- codecs ----------------------------------------------------------------------------------


def records_part(data: bytes) -> bytes:
    return data[HEADER_SIZE:]


def test_snappy_is_written_xerial_framed_and_read_raw_too() -> None:
    records = [Rec(i, 0, None, bytes([i]) * 70_000, []) for i in range(3)]  # several blocks
    framed = build(records, codec=Codec.SNAPPY)
    assert records_part(framed).startswith(XERIAL_MAGIC)
    assert read_back(parse_batches(framed)[0]) == raw(records)
    plain = records_part(build(records))
    raw_snappy = reframe(framed, body=bytes(cramjam.snappy.compress_raw(plain)))
    assert read_back(parse_batches(raw_snappy)[0]) == raw(records)


def test_lz4_is_a_frame_of_independent_blocks() -> None:
    records = [Rec(0, 0, None, bytes(200_000), [])]
    body = records_part(build(records, codec=Codec.LZ4))
    assert body[:4] == b"\x04\x22\x4d\x18"  # the LZ4 frame magic
    assert body[4] & 0x20  # FLG: block independence (Kafka's reader refuses linked blocks)
    assert body[4] >> 6 == 1  # FLG: version 01


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_a_decompression_bomb_is_refused(codec: Codec) -> None:
    records = [Rec(0, 0, None, bytes(4_000_000), [])]
    data = build(records, codec=codec)
    assert len(data) < 300_000
    with pytest.raises(InvalidRecord, match="1000000"):
        parse_batches(data, max_bytes=1_000_000)
    assert parse_batches(data, max_bytes=5_000_000)[0].value_len.tolist() == [4_000_000]


def test_uncompressed_records_over_the_bound_are_refused() -> None:
    data = build([Rec(0, 0, None, bytes(2000), [])])
    with pytest.raises(InvalidRecord, match="over the limit"):
        parse_batches(data, max_bytes=1000)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_compressed_garbage_is_an_invalid_record(codec: Codec) -> None:
    data = reframe(build([Rec(0, 0, None, b"x", [])], codec=codec), body=b"\x82SNAPPY\x00garbage!!")
    with pytest.raises(InvalidRecord):
        parse_batches(data)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codecs_are_refused(codec: int) -> None:
    with pytest.raises(UnsupportedCompression, match=str(codec)) as refused:
        parse_batches(reframe(build([Rec(0, 0, None, b"x", [])]), attributes=codec))
    assert refused.value.code == ErrorCode.unsupported_compression_type == 76


# -- refusals ----------------------------------------------------------------------------------

_LENGTH = struct.Struct(">i")


def reframe(
    data: bytes,
    *,
    attributes: int | None = None,
    body: bytes | None = None,
    count: int | None = None,
) -> bytes:
    """``data`` (one batch) with fields replaced and its length and CRC made right again."""
    head = bytearray(data[:HEADER_SIZE])
    if attributes is not None:
        struct.pack_into(
            ">h", head, 21, attributes | (struct.unpack_from(">h", head, 21)[0] & ~0x07)
        )
    if count is not None:
        struct.pack_into(">i", head, 57, count)
    rest = data[HEADER_SIZE:] if body is None else body
    _LENGTH.pack_into(head, 8, HEADER_SIZE - 12 + len(rest))
    crc = crc32c(bytes(head[21:]) + rest)
    struct.pack_into(">I", head, 17, crc)
    return bytes(head) + rest


def with_records(records_bytes: bytes, count: int) -> bytes:
    return reframe(build([Rec(0, 0, None, b"x", [])]), body=records_bytes, count=count)


@pytest.mark.parametrize("magic", [0, 1])
def test_old_message_formats_are_refused(magic: int) -> None:
    data = bytearray(build([Rec(0, 0, None, b"x", [])]))
    data[16] = magic
    with pytest.raises(UnsupportedMessageFormat, match=f"format {magic}") as refused:
        parse_batches(bytes(data))
    assert refused.value.code == 43


def test_a_crc_mismatch_is_a_corrupt_batch() -> None:
    data = bytearray(build([Rec(0, 0, b"k", b"value", [])]))
    data[-1] ^= 0x01
    with pytest.raises(CorruptBatch, match="CRC-32C") as refused:
        parse_batches(bytes(data))
    assert refused.value.code == ErrorCode.corrupt_message == 2


@pytest.mark.parametrize("cut", [1, 10, HEADER_SIZE - 5])
def test_a_truncated_batch_is_a_corrupt_batch(cut: int) -> None:
    data = build([Rec(0, 0, b"k", b"value", [])])
    with pytest.raises(CorruptBatch, match="truncated"):
        parse_batches(data[:-cut] if cut < len(data) - 17 else data[:cut])
    with pytest.raises(CorruptBatch):
        parse_batches(data + data[:cut])  # a second batch cut short


def test_a_length_below_the_header_is_a_corrupt_batch() -> None:
    data = bytearray(build([Rec(0, 0, None, b"x", [])]))
    _LENGTH.pack_into(data, 8, 10)
    with pytest.raises(CorruptBatch):
        parse_batches(bytes(data))


def record_bytes(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return zz(len(body)) + body


def zz(value: int) -> bytes:
    raw_value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw_value >= 0x80:
        out.append((raw_value & 0x7F) | 0x80)
        raw_value >>= 7
    out.append(raw_value)
    return bytes(out)


GOOD = record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(0))


@pytest.mark.parametrize(
    ("records_bytes", "count", "why"),
    [
        (GOOD, 2, "cannot fit|hold 1"),  # the count says more records
        (GOOD * 3, 2, "take"),  # ... or fewer
        (GOOD + b"\x00", 1, "take"),  # bytes after the last record
        (
            record_bytes(b"\x00", zz(0), zz(0), b"\xff" * 6 + b"\x01", zz(1), b"v", zz(0)),
            1,
            "varint",
        ),
        (
            record_bytes(b"\x00", b"\xff" * 10 + b"\x01", zz(0), zz(-1), zz(1), b"v", zz(0)),
            1,
            "varint",
        ),
        (b"\xff" * 6 + GOOD, 1, "varint|length"),  # the record length itself
        (record_bytes(b"\x00", zz(0), zz(0), zz(-2), zz(1), b"v", zz(0)), 1, "key length"),
        (
            record_bytes(b"\x00", zz(0), zz(0), zz(5), b"k", zz(1), b"v", zz(0)),
            1,
            "key length|past",
        ),
        (record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(9), b"v", zz(0)), 1, "value length|past"),
        (record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(0), b"xx"), 1, "after"),
        (record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(-1)), 1, "headers"),
        (
            record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(1), zz(-1), zz(0)),
            1,
            "header",
        ),
        (
            record_bytes(
                b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(1), zz(1), b"h", zz(4), b"v"
            ),
            1,
            "header",
        ),
        (
            record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(2), zz(1), b"h", zz(0)),
            1,
            "header|fit|varint",
        ),
        (zz(-3) + b"\x00" * 20, 1, "length of -3"),
    ],
)
def test_records_that_disagree_with_their_bytes_are_invalid(
    records_bytes: bytes, count: int, why: str
) -> None:
    with pytest.raises(InvalidRecord, match=why) as refused:
        parse_batches(with_records(records_bytes, count))
    assert refused.value.code == ErrorCode.invalid_record == 87


def test_a_bad_header_among_many_is_found_column_wise() -> None:
    good = record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(1), zz(1), b"h", zz(1), b"1")
    bad = record_bytes(b"\x00", zz(0), zz(0), zz(-1), zz(1), b"v", zz(1), zz(-1), zz(1), b"1")
    with pytest.raises(InvalidRecord, match="record 40"):
        parse_batches(with_records(good * 40 + bad + good * 10, 51))
    assert parse_batches(with_records(good * 51, 51))[0].headers_of(50) == [("h", b"1")]


# -- error codes -------------------------------------------------------------------------------


def test_error_codes_are_kios_one_table() -> None:
    from kio.schema.errors import ErrorCode as KioErrorCode

    assert ErrorCode is KioErrorCode


def test_every_refusal_carries_its_code_and_a_message() -> None:
    expected = {
        CorruptBatch: 2,
        InvalidRecord: 87,
        UnsupportedCompression: 76,
        UnsupportedMessageFormat: 43,
    }
    for kind, code in expected.items():
        error = kind("what went wrong")
        assert (
            isinstance(error, KafkaError) and error.code == code and str(error) == "what went wrong"
        )
