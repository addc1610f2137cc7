"""The RocksDB composite-key encoding preserves (key, t1, t2) order and is prefix-free."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.store._base import TIME_MAX, TIME_MIN
from tidelog.store._composite import after_key, before_key
from tidelog.store.encoding import decode_composite, encode_composite, encode_key

keys = st.lists(st.sampled_from([b"\x00", b"\x01", b"\xfe", b"\xff"]), max_size=4).map(b"".join) | (
    st.binary(max_size=3)
)
times = st.integers(TIME_MIN, TIME_MAX) | st.sampled_from([TIME_MIN, -1, 0, 1, TIME_MAX])
composites = st.tuples(keys, times, times)


@given(composites, composites)
def test_order_preserving_and_round_trips(
    a: tuple[bytes, int, int], b: tuple[bytes, int, int]
) -> None:
    assert decode_composite(encode_composite(a)) == a
    assert (encode_composite(a) < encode_composite(b)) == (a < b)


@given(keys, keys)
def test_prefix_free(a: bytes, b: bytes) -> None:
    if a != b:
        assert not encode_key(b).startswith(encode_key(a))


@given(keys, composites)
def test_seek_targets_bracket_a_key(key: bytes, entry: tuple[bytes, int, int]) -> None:
    encoded = encode_composite(entry)
    if entry[0] == key:
        assert encode_composite(before_key(key)) < encoded < encode_composite(after_key(key))
    elif entry[0] < key:
        assert encoded < encode_composite(before_key(key))
    else:
        assert encoded > encode_composite(after_key(key))


def test_examples() -> None:
    assert encode_key(b"a") == b"a\x00\x00"
    assert encode_key(b"a\x00") == b"a\x00\xff\x00\x00"
    assert encode_composite((b"", -1, 0))[2:] == bytes.fromhex("7fffffffffffffff8000000000000000")
