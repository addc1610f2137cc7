"""``ReceivedFrame`` (``tidelog.wire.received``): a serialised ``RecordBatch`` read in place.

Every column must be what protobuf's parse of the same bytes gives (for any frame, with unknown
fields anywhere); a client batch over it must agree with one over the parsed message, column for
column and message for message, with its values viewed in the bytes received (no copy); and bytes
that are not a message must be refused when the frame is made, exactly where protobuf refuses
them.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client import ReceivedBatch
from tidelog.wire import columns
from tidelog.wire.arrow import MalformedBatch
from tidelog.wire.columns import FrameBytes
from tidelog.wire.received import ReceivedFrame
from tidelog.wire.varints import uvarint

FIELDS = ("offsets", "timestamps", "values", "value_sizes", "value_positions", "keys", "key_sizes")


def same_columns(got: FrameBytes, want: FrameBytes) -> None:
    for name in FIELDS:
        assert getattr(got, name) == getattr(want, name), name
    assert got.values_omitted == want.values_omitted
    assert list(got.headers) == list(want.headers)
    buffer, at, length = got.values_span()
    assert buffer[at : at + length] == want.values


@st.composite
def any_frames(draw: st.DrawFn) -> v1.RecordBatch:
    """Frames with any bytes in any field (not necessarily consistent columns)."""
    blob = st.binary(max_size=40)
    headers = st.lists(
        st.dictionaries(st.text(max_size=3), st.binary(max_size=3), max_size=2), max_size=3
    )
    return v1.RecordBatch(
        offsets=draw(blob),
        timestamps=draw(blob),
        end=draw(st.sampled_from([0, 1, 2, 3])),
        messages=v1.Messages(
            values=draw(blob),
            value_sizes=draw(blob),
            keys=draw(blob),
            key_sizes=draw(blob),
            value_positions=draw(blob),
            values_omitted=draw(st.booleans()),
            headers=[
                v1.HeaderList(headers=[v1.Header(name=k, value=v) for k, v in h.items()])
                for h in draw(headers)
            ],
        ),
    )


UNKNOWN = (
    b"\x78\x96\x01"  # field 15, varint 150
    + b"\x81\x01"
    + bytes(8)  # field 16, fixed64
    + b"\x8d\x01"
    + bytes(4)  # field 17, fixed32
    + b"\x92\x01\x03abc"  # field 18, 3 bytes
)


@settings(deadline=None)
@given(any_frames(), st.booleans())
def test_columns_are_those_protobuf_parses(frame: v1.RecordBatch, unknown: bool) -> None:
    data = frame.SerializeToString()
    if unknown:  # unknown fields before the known ones, and inside Messages
        inner = frame.messages.SerializeToString() + UNKNOWN
        rest = v1.RecordBatch(offsets=frame.offsets, timestamps=frame.timestamps, end=frame.end)
        data = UNKNOWN + rest.SerializeToString() + b"\x1a" + uvarint(len(inner)) + inner
    parsed = v1.RecordBatch.FromString(data)
    got = ReceivedFrame(data)
    same_columns(got, FrameBytes(parsed))
    assert got.end == parsed.end
    assert got.frame == parsed


def server_frame(values: list[bytes], keys: list[bytes | None] | None) -> v1.RecordBatch:
    """Values pointed at inside filler, as the server sends stored records, optional keys."""
    blob, starts = b"", []
    for value in values:
        blob += b"#" * 3
        starts.append(len(blob))
        blob += value
    n = len(values)
    messages = columns.pack_at(
        blob, np.array(starts, dtype=np.int64), np.array([len(v) for v in values], np.int64)
    )
    if keys is not None:
        extra = columns.pack(values, keys)
        messages.keys, messages.key_sizes = extra.keys, extra.key_sizes
    return v1.RecordBatch(
        offsets=columns.pack_int64(np.arange(5, 5 + n, dtype=np.int64)),
        timestamps=columns.pack_int64(np.arange(n, dtype=np.int64) * 1000),
        messages=messages,
    )


@settings(deadline=None)  # the first example loads pyarrow
@given(
    st.lists(st.binary(max_size=30), min_size=1, max_size=20),
    st.booleans(),
    st.booleans(),
)
def test_a_batch_over_it_is_the_batch_over_the_parsed_frame(
    values: list[bytes], keyed: bool, pointed: bool
) -> None:
    keys = [v[:2] or None for v in values] if keyed else None
    frame = (
        server_frame(values, keys)
        if pointed
        else v1.RecordBatch(
            offsets=columns.pack_int64(np.arange(len(values), dtype=np.int64)),
            timestamps=columns.pack_int64(np.zeros(len(values), dtype=np.int64)),
            messages=columns.pack(values, keys),
        )
    )
    data = frame.SerializeToString()
    got = ReceivedBatch(ReceivedFrame(data), "s", 2)
    want = ReceivedBatch(frame, "s", 2)
    assert got.values.to_list() == want.values.to_list() == values
    assert [got.values[i] for i in range(len(values))] == values
    assert all(type(v) is bytes for v in got.values)
    assert got.values.sizes.tolist() == want.values.sizes.tolist()
    assert got.offsets.tolist() == want.offsets.tolist()
    assert got.timestamps.tolist() == want.timestamps.tolist()
    assert (got.keys is None) == (want.keys is None)
    if got.keys is not None and want.keys is not None:
        assert got.keys.to_list() == want.keys.to_list()
    assert got.messages() == want.messages()
    assert got.to_arrow().equals(want.to_arrow())
    assert got.frame == frame


def test_the_values_are_viewed_in_the_bytes_received() -> None:
    data = server_frame([b"ab", b"cd"], None).SerializeToString()
    batch = ReceivedBatch(ReceivedFrame(data), "s", 0)
    buffer = batch.values.buffer
    assert buffer.base is data  # the received bytes themselves, not a copy
    starts, sizes = batch.values.starts.tolist(), batch.values.sizes.tolist()
    assert [data[a : a + n] for a, n in zip(starts, sizes, strict=True)] == [b"ab", b"cd"]


def test_a_frame_without_headers_parses_nothing() -> None:
    frame = ReceivedFrame(server_frame([b"x"], None).SerializeToString())
    assert list(frame.headers) == []
    assert frame._message is None  # no protobuf parse for a frame without header lists


def test_bytes_protobuf_refuses_are_refused_at_once() -> None:
    data = server_frame([b"value", b"other"], [b"k", None]).SerializeToString()
    refused = 0
    for cut in range(len(data)):
        damaged = data[:cut]
        try:
            parsed = v1.RecordBatch.FromString(damaged)
        except DecodeError:
            with pytest.raises(MalformedBatch):
                ReceivedFrame(damaged)
            refused += 1
        else:
            same_columns(ReceivedFrame(damaged), FrameBytes(parsed))
    assert refused > len(data) // 2
    for bad in (b"\x0b", b"\x0f\x00", b"\x02\x00", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"):
        with pytest.raises(MalformedBatch):
            ReceivedFrame(bad)


@settings(deadline=None)
@given(
    st.lists(any_frames(), min_size=1, max_size=3),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
def test_concatenated_frames_merge_as_protobuf_merges(
    frames: list[v1.RecordBatch], end: int
) -> None:
    """Protobuf parses concatenated messages as one, merging ``messages`` (bytes fields: the last
    wins; headers: appended); an enum may be negative or unknown. The columns must match."""
    data = b"".join(frame.SerializeToString() for frame in frames)
    data += b"\x20" + uvarint(end & 0xFFFFFFFFFFFFFFFF)  # end, as protobuf writes an int32
    parsed = v1.RecordBatch.FromString(data)
    got = ReceivedFrame(data)
    same_columns(got, FrameBytes(parsed))
    assert got.end == parsed.end == end
    assert got.frame == parsed


def test_a_repeated_messages_field_is_merged() -> None:
    data = (
        v1.RecordBatch(messages=v1.Messages(values=b"a")).SerializeToString()
        + v1.RecordBatch(messages=v1.Messages(keys=b"k")).SerializeToString()
    )
    got = ReceivedFrame(data)
    assert (got.values, got.keys) == (b"a", b"k")
    assert ReceivedFrame(b"\x20" + uvarint(2**64 - 1)).end == -1
