"""The columnar batch codec (``tidelog.wire.columns``): what is packed unpacks the same, in both
its forms (values copied, values pointed at), the columns are the little-endian arrays the
protocol names, and columns that do not fit together are refused with what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.wire import columns

VALUES = st.lists(st.binary(max_size=40), max_size=30)


@st.composite
def batches(
    draw: st.DrawFn,
) -> tuple[list[bytes], list[bytes | None] | None, list[dict[str, bytes]] | None]:
    values = draw(VALUES)
    n = len(values)
    keys = draw(st.none() | st.lists(st.none() | st.binary(max_size=10), min_size=n, max_size=n))
    headers = draw(
        st.none()
        | st.lists(
            st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=3),
            min_size=n,
            max_size=n,
        )
    )
    return values, keys, headers


@given(batches())
def test_unpack_gives_back_what_pack_packed(
    batch: tuple[list[bytes], list[bytes | None] | None, list[dict[str, bytes]] | None],
) -> None:
    values, keys, headers = batch
    got_values, got_keys, got_headers = columns.unpack(columns.pack(values, keys, headers))
    assert got_values == values
    # "no keys" and "no headers" travel as empty columns
    assert got_keys == (keys if keys and any(k is not None for k in keys) else None)
    assert got_headers == (headers if headers and any(headers) else None)


@given(st.lists(st.tuples(st.integers(0, 8), st.binary(max_size=20)), max_size=20))
def test_values_pointed_at_unpack_as_values(pieces: list[tuple[int, bytes]]) -> None:
    """``pack_at``: each value stays in the buffer after a gap (the record around it)."""
    data, starts, sizes = b"", [], []
    for gap, value in pieces:
        data += b"\xee" * gap
        starts.append(len(data))
        sizes.append(len(value))
        data += value
    packed = columns.pack_at(data, np.array(starts, np.int64), np.array(sizes, np.int64))
    assert columns.unpack(packed)[0] == [value for _, value in pieces]
    if pieces:  # pointed-at values take the general path
        assert columns.plain_values(packed) is None


@given(VALUES)
def test_the_columns_are_little_endian_arrays(values: list[bytes]) -> None:
    packed = columns.pack(values)
    assert packed.value_sizes == np.array([len(v) for v in values], "<u4").tobytes()
    plain = columns.plain_values(packed)
    assert plain is not None
    assert plain[0] == b"".join(values) and plain[1].tolist() == [len(v) for v in values]
    keys = [b"k" if i % 2 else None for i in range(len(values))]
    if any(keys):
        sizes = [-1 if k is None else len(k) for k in keys]
        assert columns.pack(values, keys).key_sizes == np.array(sizes, "<i4").tobytes()


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20))
def test_int64_columns_round_trip_in_both_forms(numbers: list[int]) -> None:
    blob = columns.pack_int64(np.array(numbers, dtype=np.int64))
    assert blob == np.array(numbers, "<i8").tobytes()
    assert columns.int64_list(blob) == numbers
    assert columns.unpack_int64(blob).tolist() == numbers


def test_int32_and_u32_columns() -> None:
    assert columns.int32_list(np.array([0, -1, 7], "<i4").tobytes()) == [0, -1, 7]
    assert columns.pack_u32(iter([1, 2**32 - 1])) == np.array([1, 2**32 - 1], "<u4").tobytes()


def _u32(*numbers: int) -> bytes:
    return np.array(numbers, "<u4").tobytes()


def _i32(*numbers: int) -> bytes:
    return np.array(numbers, "<i4").tobytes()


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (v1.Messages(values=b"ab", value_sizes=b"\x01\x00\x00"), "whole number of u32"),
        (v1.Messages(values=b"ab", value_sizes=_u32(1)), "add up to 1 bytes but 2"),
        (v1.Messages(values=b"ab", value_sizes=_u32(1, 1), value_positions=_u32(0)), "2 u32"),
        (
            v1.Messages(values=b"ab", value_sizes=_u32(1, 1), value_positions=_u32(0, 2)),
            "points past",
        ),
        (v1.Messages(values=b"ab", value_sizes=_u32(1, 1), keys=b"k"), "without key_sizes"),
        (v1.Messages(values=b"ab", value_sizes=_u32(1, 1), key_sizes=_i32(1)), "2 i32"),
        (
            v1.Messages(values=b"ab", value_sizes=_u32(1, 1), keys=b"k", key_sizes=_i32(1, -2)),
            "below -1",
        ),
        (
            v1.Messages(values=b"ab", value_sizes=_u32(1, 1), keys=b"k", key_sizes=_i32(1, 1)),
            "do not add up",
        ),
        (
            v1.Messages(values=b"ab", value_sizes=_u32(1, 1), headers=[v1.HeaderList()]),
            "1 header lists for 2 values",
        ),
    ],
)
def test_columns_that_do_not_fit_are_refused(messages: v1.Messages, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        columns.unpack(messages)


def test_a_torn_int64_column_is_refused_in_both_forms() -> None:
    for decode in (columns.int64_list, columns.unpack_int64):
        with pytest.raises(ValueError, match="whole number"):
            decode(b"\0" * 12)
