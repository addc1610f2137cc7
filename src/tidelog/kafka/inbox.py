"""A Kafka connection's incoming bytes, read ahead while a request waits, so that a client that
closes its connection is noticed at once rather than when its answer is written.

The listener answers a connection's requests one at a time (``serving.py``). Some requests wait
on others (a JoinGroup for the rebalance, a SyncGroup for the leader's assignment, a Fetch for
data): meanwhile the client may close the connection, or, as clients do, send its next requests
without waiting for the answer (pipelining). :class:`Inbox` owns the connection's reader: the
listener takes each frame's bytes from it (:meth:`Inbox.readexactly`), and
:meth:`Inbox.unless_closed` runs a request's handler while reading ahead into the inbox's buffer
until the peer's end of stream; if the end comes first, the handler is cancelled and
:class:`PeerClosed` raised.

Invariants:

- no byte is lost, repeated or reordered: bytes read ahead are kept, in order, and
  :meth:`Inbox.readexactly` takes from them before the reader; a read cancelled while it waits
  takes nothing (``StreamReader.read`` returns bytes or raises having consumed none);
- only the end of the stream (or a reset) counts as closed: pipelined requests are bytes like
  any other, answered in their turn once the handler is done;
- memory is bounded: reading ahead stops once :data:`READ_AHEAD_BYTES` wait in the buffer; the
  end of a connection behind that many unanswered bytes is noticed when the listener next reads
  (the client's own requests are then its back-pressure, as a socket's receive buffer is);
- with nothing read ahead, a frame is read straight from the reader, as without an inbox.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable
from typing import Final, TypeVar

T = TypeVar("T")

READ_AHEAD_BYTES: Final = 1 << 20
"""The most bytes read ahead of the request being answered (pipelined requests)."""


class PeerClosed(ConnectionError):
    """The client closed the connection while a request of it waited (the request was
    cancelled: nobody would read its answer)."""


class Inbox:
    """One connection's reader with a read-ahead buffer (module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, read_ahead: int = READ_AHEAD_BYTES) -> None:
        self._reader = reader
        self._read_ahead = read_ahead
        self._buffer = bytearray()
        self._ended = False
        """The reader reached the end of the stream while reading ahead."""

    @property
    def buffered(self) -> int:
        """Bytes read ahead and not taken yet."""
        return len(self._buffer)

    async def readexactly(self, count: int) -> bytes:
        """The next ``count`` bytes; ``asyncio.IncompleteReadError`` when the stream ends
        first (as ``StreamReader.readexactly``)."""
        if not self._buffer:
            if self._ended:
                raise asyncio.IncompleteReadError(b"", count)
            return await self._reader.readexactly(count)
        if len(self._buffer) >= count:
            taken = bytes(self._buffer[:count])
            del self._buffer[:count]
            return taken
        if self._ended:
            partial = bytes(self._buffer)
            self._buffer.clear()
            raise asyncio.IncompleteReadError(partial, count)
        try:
            rest = await self._reader.readexactly(count - len(self._buffer))
        except asyncio.IncompleteReadError as short:
            partial = bytes(self._buffer) + short.partial
            self._buffer.clear()
            raise asyncio.IncompleteReadError(partial, count) from None
        taken = bytes(self._buffer) + rest
        self._buffer.clear()
        return taken

    async def unless_closed(self, call: Awaitable[T]) -> T:
        """``call``'s result, unless the peer closes the connection first: then ``call`` is
        cancelled (and awaited) and :class:`PeerClosed` raised. Bytes the peer sends meanwhile
        are kept for :meth:`readexactly`. A cancellation of the caller cancels ``call``."""
        work = asyncio.ensure_future(call)
        watch = asyncio.ensure_future(self._until_end())
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
            closed = watch.done() and watch.result()
            if closed:
                work.cancel()
            watch.cancel()  # (done already unless the work finished first)
            await asyncio.wait((watch,))  # off the reader before anyone reads it again
            await asyncio.wait((work,))  # a full buffer: the end is seen at a later read
        except asyncio.CancelledError:
            work.cancel()
            watch.cancel()
            raise
        if closed and work.cancelled():
            raise PeerClosed("the client closed the connection while its request waited")
        return work.result()  # it finished as the connection closed: its answer, if it can

    async def _until_end(self) -> bool:
        """Read ahead into the buffer until the stream ends or is reset (True), or the buffer
        holds ``read_ahead`` bytes (False)."""
        while len(self._buffer) < self._read_ahead:
            try:
                data = await self._reader.read(self._read_ahead - len(self._buffer))
            except (ConnectionError, ssl.SSLError):
                data = b""
            if not data:
                self._ended = True
                return True
            self._buffer += data
        return False
