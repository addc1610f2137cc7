"""The native transport's outbox: pending responses as chunks, DATA frames without copies, and
h2's flow-control state kept right for DATA the connection writes itself.

Frames are parsed back with hyperframe (as a peer would) and h2 itself plays the client, so the
bytes are checked by the library that defines them, not by this module's own reading.
"""

from __future__ import annotations

import os
import socket

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, StreamEnded
from h2.exceptions import H2Error
from hyperframe.frame import DataFrame, Frame
from hypothesis import given
from hypothesis import strategies as st

from tidelog.api.transport.outbox import ZERO_COPY_MIN, Outbox, claim_data, frames
from tidelog.api.transport.sockets import writev


def _joined(pieces: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(piece) for piece in pieces)


@given(
    st.lists(st.tuples(st.integers(0, 3 * ZERO_COPY_MIN), st.booleans()), max_size=12),
    st.lists(st.integers(1, 70_000), max_size=20),
)
def test_take_returns_what_was_added_in_order(
    adds: list[tuple[int, bool]], cuts: list[int]
) -> None:
    outbox = Outbox()
    expected = bytearray()
    for i, (size, as_view) in enumerate(adds):
        data = bytes([i % 256]) * size
        prefix = i.to_bytes(5, "big")
        outbox.add(memoryview(data) if as_view else data, prefix)
        expected += prefix + data
    assert outbox.size == len(expected)
    got = bytearray()
    for cut in cuts:
        got += _joined(outbox.take(cut))
    got += _joined(outbox.take(outbox.size))
    assert got == expected
    assert outbox.size == 0 and not outbox


def test_a_large_immutable_response_is_sent_from_its_own_object() -> None:
    outbox = Outbox()
    big = os.urandom(ZERO_COPY_MIN)
    outbox.add(big, b"\x00\x00\x00\x40\x00")
    writable = bytearray(ZERO_COPY_MIN)
    outbox.add(writable, b"\x00\x00\x00\x40\x00")  # may change later: copied
    kept = memoryview(bytearray(ZERO_COPY_MIN))
    outbox.add(kept, keeps=True)  # a Framed's data: its owner promises not to change it
    pieces = outbox.take(outbox.size)
    assert any(piece is big for piece in pieces)
    assert any(piece is kept for piece in pieces)
    assert not any(piece is writable for piece in pieces)
    writable[:] = b"\xff" * ZERO_COPY_MIN
    prefix = b"\x00\x00\x00\x40\x00"
    assert _joined(pieces) == prefix + big + prefix + bytes(2 * ZERO_COPY_MIN)


def test_a_message_in_pieces_keeps_its_large_pieces_and_copies_the_small_together() -> None:
    outbox = Outbox()
    big = os.urandom(ZERO_COPY_MIN)
    writable = bytearray(b"w" * ZERO_COPY_MIN)  # a Framed's piece: kept too (its contract)
    pieces = (b"\x00\x00\x02\x00\x10", b"head", big, b"mid", writable, b"tail")
    outbox.add(pieces, keeps=True)
    outbox.add(b"next", b"\x00\x00\x00\x00\x04")
    assert outbox.size == sum(map(len, pieces)) + 9
    taken = outbox.take(outbox.size)
    assert any(piece is big for piece in taken)
    assert any(piece is writable for piece in taken)
    assert len(taken) == 5  # prefix+head, big, mid, writable, tail+next's prefix+next
    assert _joined(taken) == b"".join(pieces) + b"\x00\x00\x00\x00\x04next"


def test_a_view_of_wider_items_is_counted_in_bytes() -> None:
    outbox = Outbox()
    words = memoryview(bytes(range(256)) * 256).cast("I")  # 16,384 items of 4 bytes
    outbox.add(words, keeps=True)
    assert outbox.size == 65_536
    assert _joined(outbox.take(outbox.size)) == bytes(range(256)) * 256


def test_frames_are_data_frames_of_at_most_the_frame_size_around_views() -> None:
    payload = os.urandom(100_000)
    pieces: list[bytes | bytearray | memoryview] = [b"\x00\x00\x01\x86\xa0", payload, b"tail"]
    out = frames(7, pieces, 16384)
    wire = _joined(out)
    parsed: list[DataFrame] = []
    at = 0
    while at < len(wire):
        frame, length = Frame.parse_frame_header(memoryview(wire[at : at + 9]))
        frame.parse_body(memoryview(wire[at + 9 : at + 9 + length]))
        assert isinstance(frame, DataFrame)
        parsed.append(frame)
        at += 9 + length
    assert [f.stream_id for f in parsed] == [7] * len(parsed)
    assert all(len(f.data) <= 16384 and not f.flags for f in parsed)
    assert all(len(f.data) == 16384 for f in parsed[:-1])
    assert b"".join(f.data for f in parsed) == _joined(pieces)
    assert sum(isinstance(p, memoryview) and p.obj is payload for p in out) >= 6


def _pair() -> tuple[H2Connection, H2Connection, int]:
    """A server and a client h2 connection, settled, with one open request stream."""
    server = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    client = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.send_headers(
        1, [(":method", "POST"), (":path", "/a"), (":scheme", "http"), (":authority", "x")]
    )
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(b":status", b"200")])
    return server, client, 1


def test_claimed_data_keeps_h2s_windows_and_the_peer_accepts_it() -> None:
    server, client, sid = _pair()
    window = server.local_flow_control_window(sid)
    payload = os.urandom(40_000)
    claim_data(server, sid, len(payload))
    assert server.local_flow_control_window(sid) == window - len(payload)
    wire = server.data_to_send() + _joined(frames(sid, [payload], server.max_outbound_frame_size))
    events = client.receive_data(wire)
    received = b"".join(e.data for e in events if isinstance(e, DataReceived))
    assert received == payload
    client.increment_flow_control_window(len(payload), sid)
    client.increment_flow_control_window(len(payload))  # the connection's window too
    server.receive_data(client.data_to_send())
    assert server.local_flow_control_window(sid) == window
    # h2's own path still works after ours, and the stream ends through it
    server.send_data(sid, b"last", end_stream=True)
    events = client.receive_data(server.data_to_send())
    assert any(isinstance(e, StreamEnded) for e in events)
    with pytest.raises(H2Error):  # its side is closed: as send_data would
        claim_data(server, sid, 1)


def test_writev_returns_what_the_socket_would_not_take() -> None:
    left, right = socket.socketpair()
    try:
        left.setblocking(False)
        big = os.urandom(8 << 20)
        rest = writev(left.fileno(), [b"head", big, b"tail"])
        assert rest, "a socket buffer smaller than 8 MiB took it all"
        sent = 4 + len(big) + 4 - sum(len(piece) for piece in rest)
        right.setblocking(False)
        got = bytearray()
        while len(got) < sent:
            got += right.recv(1 << 20)
        assert bytes(got) == (b"head" + big + b"tail")[:sent]
        assert _joined(rest) == (b"head" + big + b"tail")[sent:]
    finally:
        left.close()
        right.close()


@given(st.lists(st.integers(0, 3 * ZERO_COPY_MIN), max_size=8), st.integers(0, 4 * ZERO_COPY_MIN))
def test_taken_counts_every_byte_removed_so_the_queue_end_is_a_fixed_mark(
    sizes: list[int], take: int
) -> None:
    """``taken + size`` is where the queue ends in the stream: it moves only when bytes are
    added, so a frame queued last has left once ``taken`` reaches that mark (span_leases)."""
    box = Outbox()
    for size in sizes:
        box.add(bytes(size))
    mark = box.taken + box.size
    assert mark == sum(sizes)
    got = sum(len(piece) for piece in box.take(take))
    assert box.taken == got == min(take, mark)
    assert box.taken + box.size == mark
    box.clear()
    assert box.taken == mark and box.size == 0
