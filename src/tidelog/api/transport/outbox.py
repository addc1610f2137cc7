"""A call's response bytes on their way out, and the DATA frames cut from them without copies.

Why: a 256 KiB response copied into the call's buffer, again by h2's ``send_data`` (a
``memoryview`` becomes bytes, the frame is joined with its header, appended to h2's output,
copied out of it) and again by the socket transport cost more server CPU than grpcio's server
spends on it. Here a large response is kept as the object the handler gave (``bytes``, or a
:class:`~tidelog.api.framed.Framed` 's data), DATA frames are 9-byte headers written beside
``memoryview`` slices of it, and the connection hands the pieces to the socket in one
``writev`` (``connection.py``).

:class:`Outbox` holds a call's pending bytes as a queue of chunks: small responses (and every
message's 5-byte prefix) are appended to one growing ``bytearray`` (so many small messages still
leave as few large frames); a response of at least :data:`ZERO_COPY_MIN` bytes that will not
change (``bytes``, a read-only view, or a Framed's data, which by its contract is not written
after it is yielded) becomes a chunk of its own, as it is. A Framed's data in pieces (a tuple)
is added piece by piece under the same rule: its small pieces copied together, its large ones
kept, so a message laid out in pieces is never joined. :meth:`Outbox.take` removes the first
``n`` bytes as a list of pieces.

Invariants: ``size`` is the number of bytes queued, in the order they were added; a chunk handed
out by :meth:`take` is never written again by the outbox (a growing ``bytearray`` is sealed, a
new one started, before any view of it leaves), so the socket may send from it later.

:func:`claim_data` keeps h2's state machine right for DATA the connection writes itself: it
checks that the stream may send DATA (h2 raises as ``send_data`` would) and takes ``size``
from the stream's and the connection's outbound windows, exactly what ``send_data`` does but
the frame building. END_STREAM is never sent this way (trailers end a gRPC stream, through h2).
"""

from __future__ import annotations

import collections
import struct
from typing import Final

from h2.connection import ConnectionInputs, H2Connection
from h2.exceptions import StreamClosedError
from h2.stream import StreamInputs

from tidelog.api.framed import Piece

ZERO_COPY_MIN: Final = 16 << 10
"""Responses at least this long are sent from the handler's object (smaller ones are copied
together: a frame header and an iovec per small message would cost more than the copy)."""

DATA_HEADER: Final = struct.Struct(">BHBBL")
"""An HTTP/2 frame header for DATA: 24-bit length (high byte, low 16 bits), type 0, flags 0,
stream id."""


def data_header(stream_id: int, length: int) -> bytes:
    """The 9 bytes before ``length`` bytes of DATA on ``stream_id`` (no flags, no padding)."""
    return DATA_HEADER.pack(length >> 16, length & 0xFFFF, 0, 0, stream_id)


def claim_data(h2: H2Connection, stream_id: int, size: int) -> None:
    """Account ``size`` bytes of DATA the caller writes on ``stream_id`` (module docstring).

    ``size`` must fit :meth:`H2Connection.local_flow_control_window`; raises h2's errors
    (``StreamClosedError``, ``ProtocolError``) when the stream cannot send DATA."""
    stream = h2.streams.get(stream_id)
    if stream is None:
        raise StreamClosedError(stream_id)
    h2.state_machine.process_input(ConnectionInputs.SEND_DATA)
    stream.state_machine.process_input(StreamInputs.SEND_DATA)
    stream.outbound_flow_control_window -= size
    h2.outbound_flow_control_window -= size


class Outbox:
    """One call's pending response bytes as chunks (module docstring)."""

    __slots__ = ("_chunks", "_tail", "size", "taken")

    def __init__(self) -> None:
        self._chunks: collections.deque[Piece] = collections.deque()
        self._tail = bytearray()
        self.size = 0
        self.taken = 0
        """Bytes removed so far (taken or cleared), a running count: with ``size``, where the
        bytes queued now end in the call's stream (``taken + size``)."""

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def add(
        self, data: Piece | tuple[Piece, ...], prefix: bytes = b"", *, keeps: bool = False
    ) -> None:
        """Queue ``prefix`` then ``data`` (a tuple: its pieces in order, each added as one);
        ``keeps``: the caller will not change ``data`` (a Framed's contract), so a long one may
        be sent from it as it is."""
        if isinstance(data, tuple):
            if prefix:
                self.add(prefix)
            for piece in data:
                self.add(piece, keeps=keeps)
            return
        if isinstance(data, memoryview) and (data.itemsize != 1 or data.ndim != 1):
            data = data.cast("B")  # lengths below are in bytes
        length = len(data)
        tail = self._tail
        if prefix:
            tail += prefix
        if length >= ZERO_COPY_MIN and (
            keeps or isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly)
        ):
            if tail:
                self._chunks.append(tail)
                self._tail = bytearray()
            self._chunks.append(data)
        else:
            tail += data
        self.size += len(prefix) + length

    def take(self, n: int) -> list[Piece]:
        """The first ``n`` bytes queued (at most ``size``), removed, as pieces in order."""
        n = min(n, self.size)
        if n <= 0:
            return []
        chunks = self._chunks
        if self._tail:
            chunks.append(self._tail)
            self._tail = bytearray()
        pieces: list[Piece] = []
        left = n
        while left:
            chunk = chunks[0]
            length = len(chunk)
            if length <= left:
                chunks.popleft()
                pieces.append(chunk)
                left -= length
            else:
                view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
                pieces.append(view[:left])
                chunks[0] = view[left:]
                left = 0
        self.size -= n
        self.taken += n
        return pieces

    def clear(self) -> None:
        self._chunks.clear()
        self._tail = bytearray()
        self.taken += self.size
        self.size = 0


def frames(stream_id: int, pieces: list[Piece], frame_size: int) -> list[Piece]:
    """``pieces`` (of one stream, in order) as DATA frames of at most ``frame_size`` bytes:
    headers beside views of the pieces, nothing copied."""
    out: list[Piece] = []
    left = sum(len(piece) for piece in pieces)
    room = 0
    for piece in pieces:
        length = len(piece)
        view: memoryview | None = None
        start = 0
        while start < length:
            if room == 0:
                room = min(frame_size, left)
                out.append(data_header(stream_id, room))
            step = min(room, length - start)
            if step == length:
                out.append(piece)
            else:
                if view is None:
                    view = piece if isinstance(piece, memoryview) else memoryview(piece)
                out.append(view[start : start + step])
            start += step
            room -= step
            left -= step
    return out
