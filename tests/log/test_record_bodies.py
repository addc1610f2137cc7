"""``RecordBodies`` (records laid out as columns, ``tidelog/log/bodies.py``) store the bytes of
the ``NewRecord`` objects they stand for; ``MessageBatch.first_header`` reads a fixed-width first
header of every record at once."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.producers import check_headers, with_producer_header
from tidelog.errors import InvalidArgument
from tidelog.log import MessageBatch, NewRecord
from tidelog.log.bodies import RecordBodies
from tidelog.log.record import encode_batch, gather_headers

LIMIT = 1 << 20
NAME = "__first"

header_maps = st.dictionaries(st.text(max_size=6), st.binary(max_size=12), max_size=3).map(
    lambda d: dict(d)
)


@st.composite
def column_batches(
    draw: st.DrawFn,
) -> tuple[list[bytes | None], list[bytes], int | None, dict[int, Mapping[str, bytes]]]:
    n = draw(st.integers(1, 40))
    same = draw(st.booleans())  # equal sizes: the gather's grid without a mask
    if same:
        size = draw(st.integers(0, 20))
        values = [draw(st.binary(min_size=size, max_size=size)) for _ in range(n)]
        keys: list[bytes | None] = [None] * n
    else:
        values = [draw(st.binary(max_size=30)) for _ in range(n)]
        keys = [draw(st.none() | st.binary(max_size=8)) for _ in range(n)]
    width = draw(st.none() | st.sampled_from([0, 1, 10]))
    places = draw(st.sets(st.integers(0, n - 1), max_size=n))
    whole = {i: draw(header_maps) for i in sorted(places)}
    return keys, values, width, whole


def columns_of(
    keys: list[bytes | None], values: list[bytes]
) -> tuple[bytes, tuple[np.ndarray, np.ndarray] | None, tuple[np.ndarray, np.ndarray]]:
    """Keys and values interleaved in one buffer, with a gap byte between spans."""
    parts: list[bytes] = []
    at = 0
    key_spans: list[tuple[int, int]] = []
    value_spans: list[tuple[int, int]] = []
    for k, v in zip(keys, values, strict=True):
        key_spans.append((at, -1 if k is None else len(k)))
        parts.append((k or b"") + b"|")
        at += len(k or b"") + 1
        value_spans.append((at, len(v)))
        parts.append(v + b"|")
        at += len(v) + 1
    ks = np.array(key_spans, dtype=np.int64).reshape(-1, 2)
    vs = np.array(value_spans, dtype=np.int64).reshape(-1, 2)
    return b"".join(parts), (ks[:, 0], ks[:, 1]), (vs[:, 0], vs[:, 1])


def encoded(messages: object, n: int, *, atomic: bool = False) -> bytes:
    offsets = np.arange(10, 10 + n, dtype=np.int64)
    return bytes(encode_batch(messages, offsets, 7_000, LIMIT, atomic=atomic).data)  # type: ignore[arg-type]


def as_message_batch(messages: object, n: int) -> MessageBatch:
    batch = encode_batch(messages, np.arange(n, dtype=np.int64), 5, LIMIT)  # type: ignore[arg-type]
    data = batch.data.tobytes()
    positions = np.cumsum(batch.sizes) - batch.sizes
    return MessageBatch(data, positions, batch.sizes, gather_headers(data, positions))


@settings(max_examples=300, deadline=None)
@given(column_batches(), st.booleans())
def test_columns_store_the_bytes_of_the_records_they_stand_for(
    batch: tuple[list[bytes | None], list[bytes], int | None, dict[int, Mapping[str, bytes]]],
    atomic: bool,
) -> None:
    keys, values, width, whole = batch
    n = len(values)
    data, key_cols, value_cols = columns_of(keys, values)
    rows = np.arange(n * (width or 0), dtype=np.int64).astype(np.uint8).reshape(n, width or 0)
    bodies = RecordBodies.from_columns(
        data,
        key_cols,
        value_cols,
        first_header=None if width is None else (NAME, rows),
        headers=whole,
    )
    records = [
        NewRecord(
            v,
            key=k,
            headers=whole[i] if i in whole else {} if width is None else {NAME: rows[i].tobytes()},
        )
        for i, (k, v) in enumerate(zip(keys, values, strict=True))
    ]
    assert bodies.records() == records
    assert bodies[:] == records and bodies[-1] == records[-1] and len(bodies) == n
    assert bodies.payload_bytes() == sum(map(len, values))
    assert encoded(bodies, n, atomic=atomic) == encoded(records, n, atomic=atomic)
    names = {name for r in records for name in r.headers}
    assert bodies.header_names == names


def test_a_batch_without_keys_or_headers_is_its_values() -> None:
    data = b"aaa" + b"bb" + b"c"
    bodies = RecordBodies.from_columns(data, None, (np.array([0, 3, 5]), np.array([3, 2, 1])))
    assert bodies.records() == [NewRecord(b"aaa"), NewRecord(b"bb"), NewRecord(b"c")]
    assert bodies.blob == data


def test_spans_and_sizes_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="outside the buffer"):
        RecordBodies.from_columns(b"abc", None, (np.array([2]), np.array([2])))
    with pytest.raises(ValueError, match="outside the buffer"):
        RecordBodies.from_columns(
            b"abc", (np.array([0]), np.array([-2])), (np.array([0]), np.array([1]))
        )
    with pytest.raises(IndexError):
        RecordBodies.from_columns(b"abc", None, (np.array([0]), np.array([1])), headers={3: {}})
    one = np.array([1])
    with pytest.raises(ValueError, match="add up"):
        RecordBodies(b"ab", one - 2, one, one * 0, one, frozenset())
    with pytest.raises(ValueError, match="disagree"):
        RecordBodies(b"ab", one - 2, one, one * 0, one + 1, frozenset())


def test_the_broker_checks_them_by_their_header_names() -> None:
    data = b"v"
    spans = (np.array([0]), np.array([1]))
    check_headers(RecordBodies.from_columns(data, None, spans, headers={0: {"__kafka": b"x"}}))
    for reserved in ("__producer", "__owner"):
        bodies = RecordBodies.from_columns(data, None, spans, headers={0: {reserved: b"x"}})
        with pytest.raises(InvalidArgument, match=reserved):
            check_headers(bodies)


@pytest.mark.parametrize("owner", ["", "alice"])
def test_an_idempotent_batch_grows_only_its_last_body(owner: str) -> None:
    data = b"k1v1v2"
    rows = np.array([[1, 2], [3, 4]], dtype=np.uint8)
    bodies = RecordBodies.from_columns(
        data,
        (np.array([0, 0]), np.array([2, -1])),
        (np.array([2, 4]), np.array([2, 2])),
        first_header=(NAME, rows),
        headers={1: {NAME: b"\x03\x04", "h": b"v"}},
    )
    grown = with_producer_header(bodies, "p", 7, owner)
    as_records = with_producer_header(bodies.records(), "p", 7, owner)
    assert isinstance(grown, RecordBodies)
    assert list(grown) == list(as_records)
    assert encoded(grown, 2, atomic=True) == encoded(as_records, 2, atomic=True)
    assert bodies.records()[-1].headers == {NAME: b"\x03\x04", "h": b"v"}  # unchanged
    with pytest.raises(ValueError, match="already has"):
        grown.with_headers_on_last({"h": b"again"})  # type: ignore[union-attr]


def test_first_header_reads_a_fixed_width_first_header_of_every_record() -> None:
    records = [
        NewRecord(b"a", headers={NAME: b"12"}),  # found
        NewRecord(b"b", key=b"k", headers={NAME: b"34", "other": b"x"}),  # found: first header
        NewRecord(b"c", headers={"other": b"x", NAME: b"56"}),  # not first
        NewRecord(b"d", headers={NAME: b"789"}),  # other width
        NewRecord(b"e"),  # no headers
        NewRecord(b"", headers={"__firsu": b"00"}),  # same length, other name
        NewRecord(b"f", key=b"", headers={NAME: b""}),  # too short for the width
    ]
    batch = as_message_batch(records, len(records))
    mask, values = batch.first_header(NAME, 2)
    assert mask.tolist() == [True, True, False, False, False, False, False]
    assert [bytes(row) for row in values[:2]] == [b"12", b"34"]
    assert not values[2:].any()
    assert batch.reversed().first_header(NAME, 2)[0].tolist() == mask[::-1].tolist()
    empty_mask, empty_values = MessageBatch.empty().first_header(NAME, 2)
    assert empty_mask.shape == (0,) and empty_values.shape == (0, 2)
