"""``HeaderedValues``: values with one fixed-width header each, appended as columns, store the
same bytes as the ``NewRecord`` objects they stand for (``tidelog/log/record.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.producers import check_headers, with_producer_header
from tidelog.log import NewRecord
from tidelog.log.record import HeaderedValues, encode_batch

LIMIT = 1 << 20


def columns(values: list[bytes], headers: list[bytes], name: str = "__position") -> HeaderedValues:
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    width = len(headers[0]) if headers else 0
    return HeaderedValues(b"".join(values), sizes, name, b"".join(headers), width)


def encoded(messages: object, n: int, *, atomic: bool = False) -> bytes:
    offsets = np.arange(40, 40 + n, dtype=np.int64)
    return bytes(encode_batch(messages, offsets, 7_000, LIMIT, atomic=atomic).data)  # type: ignore[arg-type]


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    n = draw(st.integers(1, 60))
    width = draw(st.sampled_from([0, 1, 8]))
    same = draw(st.booleans())  # every value the same size: the encoder's grid path
    if same:
        size = draw(st.integers(0, 30))
        values = [draw(st.binary(min_size=size, max_size=size)) for _ in range(n)]
    else:
        values = [draw(st.binary(max_size=30)) for _ in range(n)]
    headers = [draw(st.binary(min_size=width, max_size=width)) for _ in range(n)]
    return values, headers


@settings(max_examples=300, deadline=None)
@given(batches(), st.booleans())
def test_columns_store_the_bytes_of_the_records_they_stand_for(
    batch: tuple[list[bytes], list[bytes]], atomic: bool
) -> None:
    values, headers = batch
    packed = columns(values, headers)
    records = [
        NewRecord(v, headers={"__position": h}) for v, h in zip(values, headers, strict=True)
    ]
    assert packed.records() == records
    assert packed[:] == records and packed[-1] == records[-1]
    assert encoded(packed, len(values), atomic=atomic) == encoded(
        records, len(values), atomic=atomic
    )


def test_sizes_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="add up"):
        HeaderedValues(b"abc", np.array([1, 1]), "h", b"xy", 1)
    with pytest.raises(ValueError, match="header values"):
        HeaderedValues(b"ab", np.array([1, 1]), "h", b"xyz", 1)


def test_the_broker_checks_and_extends_them_as_records() -> None:
    packed = columns([b"a", b"bc"], [b"\x01", b"\x02"])
    check_headers(packed)
    with_header = with_producer_header(packed, "p", 3)
    assert [m.value for m in with_header] == [b"a", b"bc"]  # type: ignore[union-attr]
    assert "__producer" in with_header[-1].headers  # type: ignore[union-attr]
