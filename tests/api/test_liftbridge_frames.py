"""``liftbridge_frames.framed_messages`` against ``liftbridge._messages``: for random batches the
framed bytes, split by their gRPC prefixes, parse to the same ``Message`` s, and without headers
are byte for byte their ``SerializeToString()``; both layout paths (runs and gathered) give the
same bytes; every Framed holds whole messages within its byte bound."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.api.framed import Framed
from tidelog.api.liftbridge import _messages
from tidelog.api.liftbridge_frames import (
    FEW_MESSAGES,
    PREFIX_SIZE,
    _gathered,
    _in_runs,
    _Plan,
    framed_messages,
    message_tail,
)
from tidelog.log import MessageBatch, NewRecord
from tidelog.log.record import encode_batch, gather_headers
from tidelog.wire.varints import uvarint

LIMIT = 1 << 22
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def message_batch(records: list[NewRecord], offsets: list[int], stamps: list[int]) -> MessageBatch:
    batch = encode_batch(records, np.arange(len(records), dtype=np.int64), 5, LIMIT)
    data = batch.data.tobytes()
    positions = np.cumsum(batch.sizes) - batch.sizes
    header = gather_headers(data, positions).copy()
    header["offset"] = offsets
    header["timestamp"] = stamps
    return MessageBatch(data, positions, batch.sizes, header)


def split(frames: list[Framed]) -> list[bytes]:
    """Each message's bytes, checking the prefixes and each Framed's count."""
    out: list[bytes] = []
    for frame in frames:
        data = bytes(frame.data)
        at, count = 0, 0
        while at < len(data):
            assert data[at] == 0  # not compressed
            length = int.from_bytes(data[at + 1 : at + PREFIX_SIZE], "big")
            out.append(data[at + PREFIX_SIZE : at + PREFIX_SIZE + length])
            at += PREFIX_SIZE + length
            count += 1
        assert at == len(data)
        assert count == frame.count
    return out


def offsets_of(kind: str) -> st.SearchStrategy[int]:
    return {
        "zero": st.just(0),
        "small": st.integers(0, 300),
        "huge": st.integers(1 << 40, (1 << 63) - 1),
        "any": INT64,
    }[kind]


@st.composite
def batches(draw: st.DrawFn) -> tuple[MessageBatch, str, int, str]:
    n = draw(st.integers(1, 80) | st.integers(FEW_MESSAGES - 2, FEW_MESSAGES + 2))
    uniform = draw(st.booleans())  # records of one shape: the runs path
    size = draw(st.sampled_from([0, 1, 100, 127, 128, 3000]))
    with_keys = draw(st.booleans())
    with_headers = draw(st.sampled_from(["none", "rare", "many"]))
    records = []
    for _ in range(n):
        value = (
            draw(st.binary(min_size=size, max_size=size))
            if uniform
            else draw(st.binary(max_size=300) | st.binary(min_size=size, max_size=size))
        )
        key = draw(st.none() | st.binary(max_size=140)) if with_keys else None
        headers: dict[str, bytes] = {}
        if with_headers == "many" or (with_headers == "rare" and draw(st.integers(0, 9)) == 0):
            headers = draw(
                st.dictionaries(st.text(max_size=6), st.binary(max_size=200), max_size=3)
            )
        records.append(NewRecord(value, key, headers))
    kind = draw(st.sampled_from(["zero", "small", "huge", "any"]))
    if draw(st.booleans()):  # consecutive, as a log stores them
        first = draw(offsets_of(kind).filter(lambda o: o <= (1 << 63) - 1 - n))
        offsets = list(range(first, first + n))
    else:
        offsets = [draw(offsets_of(kind)) for _ in range(n)]
    stamp_kind = draw(st.sampled_from(["zero", "small", "huge", "any"]))
    stamps = [draw(offsets_of(stamp_kind)) for _ in range(n)]
    stream = draw(st.sampled_from(["s", "", "流れ-é", "x" * 200]))
    partition = draw(st.sampled_from([0, 1, 127, 128, 2**31 - 1, -1]))
    subject = draw(st.sampled_from(["", "s", "sübject.ä", "y" * 130]))
    return message_batch(records, offsets, stamps), stream, partition, subject


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from([1, 200, 5000, 1 << 18]))
def test_frames_parse_to_the_messages_of_the_per_message_path(
    drawn: tuple[MessageBatch, str, int, str], frame_bytes: int
) -> None:
    batch, stream, partition, subject = drawn
    expected = list(_messages(batch, stream, partition, subject))
    frames = list(framed_messages(batch, stream, partition, subject, frame_bytes=frame_bytes))
    got = split(frames)
    assert len(got) == len(expected)
    for raw, message in zip(got, expected, strict=True):
        assert pb.Message.FromString(raw) == message
        if not message.headers:
            assert raw == message.SerializeToString()
    # Whole messages, at most frame_bytes each Framed unless it holds a single message.
    for frame in frames:
        assert frame.count >= 1
        assert frame.count == 1 or len(frame.data) <= frame_bytes
    # Both layout paths give the same bytes; a small batch, serialised by protobuf message by
    # message, too unless it has headers (protobuf's map order is its own: parsed equal above).
    plan = _Plan(batch, message_tail(stream, partition, subject))
    runs = _in_runs(plan, plan.run_starts())
    assert runs.tobytes() == _gathered(plan).tobytes()
    if len(batch) > FEW_MESSAGES or not batch.has_headers():
        assert runs.tobytes() == b"".join(bytes(f.data) for f in frames)


def test_a_long_uniform_batch_is_one_framed_per_bound() -> None:
    n = 2000
    batch = message_batch(
        [NewRecord(bytes([i % 251]) * 100) for i in range(n)],
        list(range(10**6, 10**6 + n)),
        [1_700_000_000_000_000_000 + i for i in range(n)],
    )
    frames = list(framed_messages(batch, "stream", 0, "stream"))
    assert sum(f.count for f in frames) == n
    assert all(len(f.data) <= 256 * 1024 for f in frames)
    expected = [m.SerializeToString() for m in _messages(batch, "stream", 0, "stream")]
    assert split(frames) == expected


def test_a_live_sized_batch_is_protobufs_own_bytes_in_one_framed() -> None:
    """Ten messages (a live publisher's request) skip the numpy plan: one Framed holding each
    message's prefix and ``SerializeToString()``, as the plan would have laid them out."""
    batch = message_batch(
        [NewRecord(bytes([i]) * 100, b"k" if i % 2 else None) for i in range(10)],
        list(range(5000, 5010)),
        [1_800_000_000_000_000_000 + i for i in range(10)],
    )
    frames = list(framed_messages(batch, "live", 3, "live.subject"))
    assert [f.count for f in frames] == [10]
    expected = [m.SerializeToString() for m in _messages(batch, "live", 3, "live.subject")]
    assert split(frames) == expected
    plan = _Plan(batch, message_tail("live", 3, "live.subject"))
    assert bytes(frames[0].data) == _in_runs(plan, plan.run_starts()).tobytes()


def test_empty_batch_gives_no_frames() -> None:
    assert list(framed_messages(MessageBatch.empty(), "s", 0, "s")) == []


def test_uvarint_matches_protobuf() -> None:
    for value in (0, 1, 127, 128, 300, 2**31 - 1, 2**63 - 1, -1, -(2**63)):
        assert b"\x08" + uvarint(value) == pb.Message(offset=value).SerializeToString() or (
            value == 0
        )


def test_gathered_layouts_of_mixed_sizes() -> None:
    """Values of many sizes take the gathered path: as a padded grid when their lengths are
    alike, one index per byte when one large value would make the grid mostly padding."""
    for sizes in (
        [50 + i % 101 for i in range(300)],
        [3000 if i == 5 else i % 7 for i in range(300)],
    ):
        records = [NewRecord(b"v" * s, b"k" * (i % 3) or None) for i, s in enumerate(sizes)]
        batch = message_batch(records, list(range(300)), [i * 7 for i in range(300)])
        plan = _Plan(batch, message_tail("s", 3, ""))
        assert len(plan.run_starts()) > 8 + 300 // 32  # lay_out gathers these
        expected = [m.SerializeToString() for m in _messages(batch, "s", 3, "")]
        assert split([Framed(_gathered(plan).tobytes(), 300)]) == expected
        assert split(list(framed_messages(batch, "s", 3, ""))) == expected
