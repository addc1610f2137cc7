"""MessageBatch: verified records in delivery order, fields cut on demand."""

from __future__ import annotations

import numpy as np
from logtools import Expected, as_expected

from tidelog.log import MessageBatch, NewRecord
from tidelog.log.record import encode_batch, verify_records

MESSAGES = [
    b"first",
    NewRecord(b"second", key=b"k2"),
    NewRecord(b"", key=b"", headers={"b": b"1", "a": b""}),
    NewRecord(b"fourth" * 10, headers={"only": b"h"}),
]


def make_batch(messages=MESSAGES, first_offset=10, timestamp=77) -> MessageBatch:
    offsets = np.arange(first_offset, first_offset + len(messages), dtype=np.int64)
    encoded = encode_batch(messages, offsets, timestamp, 1 << 20)
    data = bytes(encoded.data)
    sizes = encoded.sizes.astype(np.int64)
    positions = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    stamps = np.full(len(sizes), timestamp, dtype=np.int64)
    header = verify_records(data, positions, sizes, offsets, stamps, "s.log", 0)
    return MessageBatch(data, positions, sizes, header)


EXPECTED = [
    Expected(10, 77, b"first"),
    Expected(11, 77, b"second", b"k2"),
    Expected(12, 77, b"", b"", (("b", b"1"), ("a", b""))),
    Expected(13, 77, b"fourth" * 10, None, (("only", b"h"),)),
]


def test_empty_batch():
    batch = MessageBatch.empty()
    assert not batch and len(batch) == 0
    assert batch.values() == batch.keys() == batch.headers() == batch.records() == []
    assert list(batch) == []
    assert batch.reversed() is batch and batch.head(3) is batch
    assert "empty" in repr(batch)


def test_fields_and_records_in_delivery_order():
    batch = make_batch()
    assert len(batch) == 4 and batch
    assert as_expected(batch.records()) == EXPECTED
    assert as_expected(batch) == EXPECTED
    assert batch.offsets.tolist() == [10, 11, 12, 13]
    assert batch.timestamps.tolist() == [77] * 4
    assert (batch.first_offset, batch.last_offset) == (10, 13)
    assert batch.byte_size == sum(e.size for e in EXPECTED)
    assert "10..13" in repr(batch)


def test_batch_without_any_headers_gives_empty_mappings():
    batch = make_batch([b"a", NewRecord(b"b", key=b"k")])
    assert [dict(h) for h in batch.headers()] == [{}, {}]


def test_headers_of_some_records_are_theirs_in_either_direction():
    for batch in (make_batch(), make_batch().reversed()):
        every = [dict(h) for h in batch.headers()]
        picked = np.flatnonzero(batch.header_counts())
        assert [dict(h) for h in batch.headers_of(picked)] == [every[i] for i in picked]
        assert [dict(h) for h in batch.headers_of(np.arange(len(batch)))] == every
        assert batch.headers_of(np.array([], dtype=np.int64)) == []


def test_reversed_is_the_same_records_descending():
    batch = make_batch().reversed()
    assert as_expected(batch.records()) == EXPECTED[::-1]
    assert (batch.first_offset, batch.last_offset) == (13, 10)
    assert batch.byte_size == sum(e.size for e in EXPECTED)
    assert as_expected(batch.reversed().records()) == EXPECTED


def test_head_keeps_the_first_records_in_delivery_order():
    assert as_expected(make_batch().head(2).records()) == EXPECTED[:2]
    assert as_expected(make_batch().reversed().head(3).records()) == EXPECTED[::-1][:3]
    assert as_expected(make_batch().head(10).records()) == EXPECTED
