"""The record format: encoding, verification, decoding, scanning and the size limit."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from crc32c import crc32c
from logtools import Expected, as_expected, record_size

from tidelog.errors import CorruptRecord, MessageTooLarge
from tidelog.log import FlushPolicy, LogConfig, NewRecord
from tidelog.log.batch import MessageBatch
from tidelog.log.record import (
    HEADER_SIZE,
    MAGIC,
    decode_headers,
    encode_batch,
    gather_headers,
    scan_records,
    verify_records,
)
from tidelog.log.record_layout import HEADER_STRUCT

LIMIT = 1 << 20


def encode(messages, first_offset=0, timestamp=1_000, limit=LIMIT, offsets=None):
    if offsets is None:
        offsets = np.arange(first_offset, first_offset + len(messages), dtype=np.int64)
    return encode_batch(messages, np.asarray(offsets, dtype=np.int64), timestamp, limit)


def raw(batch):
    """The encoded bytes of a batch, whatever buffer type the encoder hands out."""
    return bytes(batch.data)


def decode(batch, segment="seg.log", data=None):
    """Verify and decode an encoded batch the way a reader does (optionally over other bytes)."""
    data = raw(batch) if data is None else data
    sizes = batch.sizes.astype(np.int64)
    positions = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    timestamps = np.full(len(sizes), batch.timestamp, dtype=np.int64)
    header = verify_records(data, positions, sizes, batch.offsets, timestamps, segment, 0)
    return MessageBatch(data, positions, sizes, header)


ROUND_TRIP_CASES = {
    "plain bytes": [b"a", b"bb", b"ccc"],
    "empty values": [b"", b"", b"x", b""],
    "key none vs empty vs set": [
        NewRecord(b"v1"),
        NewRecord(b"v2", key=b""),
        NewRecord(b"v3", key=b"k3"),
        NewRecord(b"", key=b""),
    ],
    "ordered headers": [
        NewRecord(b"v", headers={"z": b"1", "a": b"2", "m": b""}),
        NewRecord(b"w", key=b"k", headers={"a": b"", "z": b"zz"}),
    ],
    "unicode header names and binary values": [
        NewRecord(
            b"\x00\xff" * 10, key=b"\x00", headers={"ünïcødé": b"\x00\x01", "": b"empty name"}
        ),
    ],
    "mixed bytes and messages": [
        b"plain",
        NewRecord(b"msg", key=b"k"),
        b"",
        NewRecord(b"h", headers={"x": b"y"}),
    ],
}


@pytest.mark.parametrize("messages", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_encode_decode_round_trip(messages):
    batch = encode(messages, first_offset=40, timestamp=123_456)
    decoded = decode(batch)

    expected = []
    for i, m in enumerate(messages):
        m = m if isinstance(m, NewRecord) else NewRecord(m)
        expected.append(Expected(40 + i, 123_456, m.value, m.key, tuple(m.headers.items())))
    assert as_expected(decoded.records()) == expected
    assert decoded.values() == [e.value for e in expected]
    assert decoded.keys() == [e.key for e in expected]
    assert [list(h.items()) for h in decoded.headers()] == [list(e.headers) for e in expected]


@pytest.mark.parametrize("messages", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_sizes_follow_the_documented_layout(messages):
    batch = encode(messages)
    msgs = [m if isinstance(m, NewRecord) else NewRecord(m) for m in messages]
    assert batch.sizes.tolist() == [record_size(m.value, m.key, m.headers) for m in msgs]
    assert len(raw(batch)) == sum(batch.sizes.tolist())


def test_key_none_and_empty_key_stay_distinct():
    decoded = decode(encode([NewRecord(b"v"), NewRecord(b"v", key=b"")]))
    assert decoded.keys() == [None, b""]


def test_header_order_is_stored_order_not_sorted_order():
    names = ["zeta", "alpha", "mid", "beta"]
    decoded = decode(encode([NewRecord(b"v", headers={n: n.encode() for n in names})]))
    assert list(decoded.headers()[0]) == names


def test_message_without_key_or_headers_encodes_like_plain_bytes():
    assert raw(encode([NewRecord(b"value")])) == raw(encode([b"value"]))


def test_header_fields_are_little_endian_as_documented():
    batch = encode(
        [NewRecord(b"val", key=b"ke", headers={"h": b"1"})], first_offset=7, timestamp=99
    )
    crc, size, offset, timestamp, magic, attrs, hcount, keylen, vallen = struct.unpack_from(
        "<IIqqBBHii", raw(batch)
    )
    assert (size, offset, timestamp, magic, attrs, hcount, keylen, vallen) == (
        len(raw(batch)),
        7,
        99,
        MAGIC,
        0,
        1,
        2,
        3,
    )
    assert crc == crc32c(raw(batch)[4:])
    assert (
        raw(batch)[HEADER_SIZE:]
        == b"ke" + b"val" + struct.pack("<H", 1) + b"h" + struct.pack("<I", 1) + b"1"
    )


def test_decode_headers_reads_name_value_pairs_in_order():
    blob = b"".join(
        struct.pack("<H", len(n)) + n + struct.pack("<I", len(v)) + v
        for n, v in [(b"b", b"2"), (b"a", b""), ("é".encode(), b"xyz")]
    )
    assert list(decode_headers(blob, 3).items()) == [("b", b"2"), ("a", b""), ("é", b"xyz")]


def test_gather_headers_reads_every_record_header():
    batch = encode([b"a", b"bbbb", b""], first_offset=5, timestamp=7)
    positions = np.array([0, 37, 37 + 40], dtype=np.int64)
    header = gather_headers(raw(batch), positions)
    assert header["offset"].tolist() == [5, 6, 7]
    assert header["size"].tolist() == [37, 40, 36]
    assert header["timestamp"].tolist() == [7, 7, 7]


# -- the size limit ----------------------------------------------------------------------------


def test_message_exactly_at_the_limit_is_accepted():
    value = b"x" * 100
    batch = encode(
        [NewRecord(value, key=b"k" * 10, headers={"h": b"v"})], limit=100 + 10 + 2 + 1 + 4 + 1
    )
    assert len(batch.sizes) == 1


def test_message_too_large_names_both_sizes_and_the_message():
    messages = [b"ok", NewRecord(b"v" * 50, key=b"k" * 10, headers={"hh": b"123"}), b"x" * 500]
    with pytest.raises(MessageTooLarge) as raised:
        encode(messages, limit=60)
    error = raised.value
    body = 10 + 50 + (2 + 2 + 4 + 3)
    assert (error.size, error.limit, error.index) == (body, 60, 1)
    assert str(body) in str(error) and "60" in str(error)
    assert "message 1" in str(error)


def test_headers_count_toward_the_limit():
    with pytest.raises(MessageTooLarge) as raised:
        encode([NewRecord(b"", headers={"name": b"v" * 10})], limit=19)
    assert raised.value.size == 2 + 4 + 4 + 10


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_message_too_large_writes_nothing_to_the_log(make_log, policy):
    log = make_log(config=LogConfig(max_message_bytes=100, flush_policy=policy))
    log.append([b"before"])
    sizes_before = {p.name: p.stat().st_size for p in log.directory.glob("*.log")}

    with pytest.raises(MessageTooLarge) as raised:
        log.append([b"fine", b"y" * 101, b"also fine"])
    assert (raised.value.size, raised.value.limit, raised.value.index) == (101, 100, 1)
    with pytest.raises(MessageTooLarge):
        log.append_at([NewRecord(b"z" * 90, key=b"k" * 11)], [5])

    assert {p.name: p.stat().st_size for p in log.directory.glob("*.log")} == sizes_before
    assert (log.next_offset, log.high_watermark, log.message_count) == (1, 0, 1)
    assert [r.value for b in log.forward_reader(0) for r in b] == [b"before"]
    assert log.append([b"after"]) == range(1, 2)


# -- verification ------------------------------------------------------------------------------


def test_verify_rejects_every_single_bit_flip_in_a_record():
    batch = encode([NewRecord(b"val", key=b"k", headers={"h": b"v"}), b"second"], first_offset=3)
    first_size = int(batch.sizes[0])
    for position in range(len(raw(batch))):
        for bit in (0, 3, 7):
            damaged = bytearray(raw(batch))
            damaged[position] ^= 1 << bit
            with pytest.raises(CorruptRecord) as raised:
                decode(batch, "s.log", bytes(damaged))
            record_start = 0 if position < first_size else first_size
            assert (raised.value.segment, raised.value.position) == ("s.log", record_start)


def test_crc_covers_the_offset_so_a_record_in_the_wrong_place_fails():
    batch = encode([b"v"], first_offset=10)
    with pytest.raises(CorruptRecord, match="disagrees with the index"):
        verify_records(
            raw(batch),
            np.array([0], dtype=np.int64),
            batch.sizes,
            np.array([11], dtype=np.int64),
            np.array([batch.timestamp], dtype=np.int64),
            "s.log",
            0,
        )
    rewritten = bytearray(raw(batch))
    struct.pack_into("<q", rewritten, 8, 11)
    with pytest.raises(CorruptRecord, match="CRC-32C"):
        verify_records(
            bytes(rewritten),
            np.array([0], dtype=np.int64),
            batch.sizes,
            np.array([11], dtype=np.int64),
            np.array([batch.timestamp], dtype=np.int64),
            "s.log",
            0,
        )


def test_verify_reports_position_relative_to_the_segment():
    batch = encode([b"a", b"b"])
    damaged = bytearray(raw(batch))
    damaged[-1] ^= 1
    positions = np.array([0, int(batch.sizes[0])], dtype=np.int64)
    with pytest.raises(CorruptRecord) as raised:
        verify_records(
            bytes(damaged),
            positions,
            batch.sizes,
            batch.offsets,
            np.full(2, batch.timestamp, dtype=np.int64),
            "00000000000000000000.log",
            5000,
        )
    assert raised.value.position == 5000 + int(batch.sizes[0])
    assert "00000000000000000000.log" in str(raised.value) and "5037" in str(raised.value)


def test_verify_reports_a_short_read_as_corruption():
    batch = encode([b"a", b"b"])
    positions = np.array([0, int(batch.sizes[0])], dtype=np.int64)
    with pytest.raises(CorruptRecord, match="short read"):
        verify_records(
            raw(batch)[:-1],
            positions,
            batch.sizes,
            batch.offsets,
            np.full(2, batch.timestamp, dtype=np.int64),
            "s.log",
            0,
        )


def test_verify_reports_index_entries_outside_the_chunk_as_corruption_not_index_error():
    """A damaged index entry in the middle of a batch (not only the last one) may point past the
    bytes read; that is corruption to report, not a crash of the reader."""
    batch = encode([b"a", b"b", b"c"])
    sizes = batch.sizes.astype(np.int64)
    positions = np.array([0, 1 << 16, int(sizes[0] + sizes[1])], dtype=np.int64)
    with pytest.raises(CorruptRecord):
        verify_records(
            raw(batch),
            positions,
            sizes,
            batch.offsets,
            np.full(3, batch.timestamp, dtype=np.int64),
            "s.log",
            0,
        )


# -- scanning (recovery's view) ----------------------------------------------------------------


def scan(data, previous_offset=-1, previous_timestamp=0):
    found, end = scan_records(data, 0, previous_offset, previous_timestamp)
    return [(r.offset, r.timestamp, r.position, r.size) for r in found], end


def test_scan_finds_every_record_of_intact_data():
    a = encode(
        [b"one", NewRecord(b"two", key=b"k", headers={"h": b"v"})], first_offset=0, timestamp=5
    )
    b = encode([b"three"], offsets=[9], timestamp=6)
    data = raw(a) + raw(b)
    s0, s1 = a.sizes.tolist()
    assert scan(data) == (
        [(0, 5, 0, s0), (1, 5, s0, s1), (9, 6, s0 + s1, int(b.sizes[0]))],
        len(data),
    )


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 2])
def test_scan_stops_before_a_torn_record(cut):
    a = encode([b"one", b"two-two"])
    first = int(a.sizes[0])
    data = raw(a)[: first + cut]
    assert scan(data) == ([(0, 1000, 0, first)], first)


def test_scan_stops_at_a_damaged_record():
    a = encode([b"one", b"two", b"three"])
    damaged = bytearray(raw(a))
    second = int(a.sizes[0])
    damaged[second + HEADER_SIZE] ^= 0x40
    found, end = scan(bytes(damaged))
    assert [f[0] for f in found] == [0] and end == second


def test_scan_stops_where_offsets_do_not_increase_or_timestamps_decrease():
    a = encode([b"a"], offsets=[5], timestamp=100)
    same_offset = encode([b"b"], offsets=[5], timestamp=100)
    older = encode([b"c"], offsets=[6], timestamp=99)
    assert scan(raw(a) + raw(same_offset))[1] == len(raw(a))
    assert scan(raw(a) + raw(older))[1] == len(raw(a))
    assert scan(raw(a), previous_offset=5)[1] == 0
    assert scan(raw(a), previous_timestamp=101)[1] == 0


def test_scan_rejects_a_bad_magic_byte_even_with_a_matching_crc():
    a = encode([b"value"])
    damaged = bytearray(raw(a))
    damaged[24] = MAGIC + 1
    struct.pack_into("<I", damaged, 0, crc32c(bytes(damaged[4:])))
    assert scan(bytes(damaged)) == ([], 0)


def test_gather_headers_at_any_positions_matches_each_header_unpacked():
    # Records of many sizes, then gathered in an order and with repeats no forward read makes:
    # every row is the 36 bytes at its position, exactly as struct unpacks them.
    messages = [NewRecord(b"v" * (i % 7), key=b"k" * (i % 3) or None) for i in range(50)]
    batch = encode(messages, first_offset=100, timestamp=9)
    data = raw(batch)
    starts = (np.cumsum(batch.sizes) - batch.sizes).astype(np.int64)
    for positions in (starts, starts[::-1].copy(), starts[[3, 3, 0, 49, 17]], starts[:1]):
        header = gather_headers(data, positions)
        assert [tuple(row) for row in header.tolist()] == [
            HEADER_STRUCT.unpack_from(data, int(p)) for p in positions
        ]
    assert len(gather_headers(data, starts[:0])) == 0
    with pytest.raises(IndexError):
        gather_headers(data, np.array([len(data) - 10], dtype=np.int64))
