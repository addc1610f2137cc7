"""One gRPC call on one HTTP/2 stream: its requests in, its handler's task, its responses out.

Theory of operation. The connection (``connection.py``) hands a call the DATA of its stream
(:meth:`Call.on_data`), its end (:meth:`Call.on_end`) and a reset (:meth:`Call.on_reset`). The
call cuts the DATA into messages and queues them for the handler; the handler's task (started
at the headers for a client stream, at the end of the one request otherwise) runs the
method's behaviour with a :class:`~tidelog.api.transport.context.ServicerContext`.

Responses are queued, framed, in the call's ``pending`` :class:`~.outbox.Outbox` (a large one
as the handler's object, not copied); the call asks its connection for one flush on the next
turn of the loop, which sends as much of every call's pending bytes as the flow-control windows
allow, as DATA frames in one socket write. So every response a handler yields while the loop
has not turned goes out together.

Bounds: ``pending`` stops growing at :data:`HIGH_WATER` (``write`` then waits until a flush
takes it under), whatever the peer reads, and no write starts while the connection's calls
together hold :data:`~.limits.CONNECTION_PENDING` bytes (so a client that opens many streams
and never reads pins that much, plus at most one message per stream, not ``HIGH_WATER``
each); requests decoded but not taken by the handler hold back the stream's WINDOW_UPDATE
beyond :data:`RECEIVE_BUFFER` (the peer then stops sending); request bytes received and not
taken (decoded requests and the part of a message still arriving) count against the
connection's :data:`~.limits.RECEIVE_BUDGET`, past which a stream's window is reopened only for
the one call the connection lets finish a message beyond it (``limits.ReceiveBudget``), so a single
request up to the server's limit still arrives while many streams cannot each grow a
partial message to that limit;
the stream's window is reopened in steps of :data:`WINDOW_STEP` (a quarter of the window the
server announces), not after every DATA frame: a client streaming small requests (a paced
publisher: one a millisecond) got a WINDOW_UPDATE, one more socket write here and one more
wake-up there, for each of them. Credit under a step held back leaves the peer at least
three quarters of its window, so it never waits for it;
a message longer than the server's limit ends the call with RESOURCE_EXHAUSTED, like grpcio.

Endings: the handler returns (its context's code, OK by default), aborts (the aborted status),
raises (UNKNOWN, ``Unexpected <class>: text``, as grpc.aio), the deadline passes (the task is
cancelled; DEADLINE_EXCEEDED), the peer resets the stream or the connection goes (the task is
cancelled; nothing is sent). The trailers go out after the last pending byte.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, Protocol

import grpc
from h2.connection import H2Connection

from tidelog.api.framed import PREFIX, Piece
from tidelog.api.transport.context import ServicerContext, SyncContext
from tidelog.api.transport.limits import ReceiveBudget
from tidelog.api.transport.messages import (
    FramingError,
    MessageReader,
    MessageTooLarge,
    Metadata,
    encode_message,
    header_value,
)
from tidelog.api.transport.outbox import Outbox, claim_data, frames

LOG = logging.getLogger("tidelog.api.transport")

HIGH_WATER: Final = 1 << 20
"""Pending response bytes of one call beyond which ``write`` waits for the peer."""
RECEIVE_BUFFER: Final = 1 << 20
"""Decoded request bytes of one call not yet taken by its handler beyond which the stream's
window is not reopened."""
WINDOW_STEP: Final = 1 << 18
"""Bytes a stream's window is reopened by at a time (no more than a quarter of
``h2setup.STREAM_WINDOW``)."""

Handler = Any
"""A ``grpc.RpcMethodHandler``."""

_DONE: Final = object()


class Link(Protocol):
    """What a call needs of its connection."""

    h2: H2Connection
    executor: Any
    budget: ReceiveBudget
    """The request bytes the connection's calls hold (:data:`~.limits.RECEIVE_BUDGET`)."""

    @property
    def over_budget(self) -> bool:
        """Whether the connection's calls hold :data:`~.limits.CONNECTION_PENDING` bytes or
        more, not yet sent."""
        ...

    def schedule(self, call: Call) -> None: ...

    def reopen(self, stream_id: int, size: int) -> None: ...

    def queued(self, size: int) -> None:
        """``size`` bytes were added to (negative: removed from) a call's ``pending``."""

    def starve(self, call: Call) -> None:
        """Release ``call``'s drain once the connection is under its budget again."""


class Call:
    """One stream's call (module docstring)."""

    def __init__(
        self,
        link: Link,
        stream_id: int,
        handler: Handler,
        metadata: Metadata,
        timeout: float | None,
        peer: str,
        auth: dict[str, list[bytes]],
        limit: int,
    ) -> None:
        self.link = link
        self.stream_id = stream_id
        self.handler = handler
        self.metadata = metadata
        self.peer = peer
        self.auth = auth
        self.limit = limit
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pending = Outbox()
        self.headers_sent = False
        self._initial: list[tuple[bytes, bytes]] = []
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.finished = False
        """The status is decided (trailers queued or sent)."""
        self.closed = False
        """The stream is gone (reset, connection lost, or trailers sent)."""
        self._reader = MessageReader(limit)
        self._requests: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._owed = 0
        self._held = 0
        """Request bytes counted against the connection's budget (``_account``)."""
        self._released = False
        """The call counts nothing any more (finished or gone)."""
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._deadline_hit = False
        self.task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        sync = not (
            inspect.iscoroutinefunction(self._behaviour)
            or inspect.isasyncgenfunction(self._behaviour)
        )
        self.context: ServicerContext | SyncContext = (
            SyncContext(self) if sync else ServicerContext(self, handler.response_serializer)
        )
        if timeout is not None:
            self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)
        if handler.request_streaming:
            self.start()

    @property
    def _behaviour(self) -> Callable[..., Any]:
        h = self.handler
        return h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream  # type: ignore[no-any-return]

    def start(self) -> None:
        if self.task is None and not self.finished:
            self.task = asyncio.get_running_loop().create_task(self._run())

    # -- from the connection --------------------------------------------------------------

    def on_data(self, data: bytes, flow: int) -> None:
        if self.finished:
            self.link.reopen(self.stream_id, flow)
            return
        try:
            messages = self._reader.feed(data)
        except MessageTooLarge as error:
            self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
            return
        except FramingError as error:
            self._fail(grpc.StatusCode.INTERNAL, str(error))
            return
        for message in messages:
            self._requests.append(message)
            self._queued += len(message)
        self._owed += flow
        self._account()
        self.retry()
        self._wake()

    def on_end(self) -> None:
        self._ended = True
        if self._reader.partial and not self.finished:
            self._fail(grpc.StatusCode.INTERNAL, "stream ended inside a message")
            return
        self._wake()
        self.start()

    def on_reset(self) -> None:
        """The peer reset the stream or the connection is gone: cancel, send nothing (the
        context's ``cancelled()`` is True from now, unless the status was already decided)."""
        if not self.finished:
            self.context.status.code = grpc.StatusCode.CANCELLED
        self.closed = True
        self.finished = True
        self._release()
        if self.pending:
            self.link.queued(-len(self.pending))
            self.pending.clear()
        self._cancel_timer()
        self._wake()
        self._release_drain()
        if self.task is not None:
            self.task.cancel()
        else:
            self.context.ended()

    def cancel(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with ``code`` now (the server stops): the task is cancelled."""
        self._fail(code, details)

    @property
    def in_message(self) -> bool:
        """Whether part of a request has arrived and the rest has not."""
        return self._reader.partial

    def retry(self) -> None:
        """Reopen the stream's window by what is owed, if a step is owed and both this call's
        :data:`RECEIVE_BUFFER` and the connection's budget allow it."""
        if (
            self._owed >= WINDOW_STEP
            and self._queued <= RECEIVE_BUFFER
            and not self._released
            and self.link.budget.may_receive(self)
        ):
            self.link.reopen(self.stream_id, self._owed)
            self._owed = 0

    def is_active(self) -> bool:
        return not self.finished

    @property
    def ended_by_peer(self) -> bool:
        """Whether the client has sent all its requests (half-closed its side)."""
        return self._ended

    # -- for the context ------------------------------------------------------------------

    def send(self, data: Piece | tuple[Piece, ...], framed: bool) -> bool:
        """Queue a response (``framed``: already prefixed; a tuple: its pieces in order); True
        when ``pending`` is full."""
        if self.finished:
            raise asyncio.CancelledError
        pending = self.pending
        before = len(pending)
        if not framed:
            size = sum(map(len, data)) if isinstance(data, tuple) else len(data)
            if size > self.limit:
                context = self.context
                context._record_abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Sent message larger than max ({size} vs. {self.limit})",
                    (),
                )
                raise grpc.aio.AbortError("message too large")
            pending.add(data, PREFIX.pack(0, size))
        else:
            pending.add(data, keeps=True)
        link = self.link
        link.queued(len(pending) - before)
        link.schedule(self)
        return len(pending) >= HIGH_WATER or link.over_budget

    def full(self) -> bool:
        """Whether a write must wait (:meth:`drained`) before it queues more."""
        return len(self.pending) >= HIGH_WATER or self.link.over_budget

    async def drained(self) -> None:
        """Wait until this call's ``pending`` is under :data:`HIGH_WATER` and its connection
        under its budget (CancelledError when the stream is gone meanwhile)."""
        while not self.closed:
            if len(self.pending) < HIGH_WATER:
                if not self.link.over_budget:
                    break
                self.link.starve(self)
            if self._drain is None:
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain
        if self.closed:
            raise asyncio.CancelledError

    async def receive(self) -> object:
        while not self._requests:
            if self._ended or self.finished:
                return grpc.aio.EOF
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        raw = self._requests.popleft()
        self._queued -= len(raw)
        self._account()
        self.retry()
        decode = self.handler.request_deserializer
        return decode(raw) if decode is not None else raw

    async def send_headers(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        if self.headers_sent or self._initial:
            raise grpc.aio.UsageError("initial metadata was already sent")
        self._initial = [(k.encode(), header_value(k, v)) for k, v in metadata]
        self.link.schedule(self)

    # -- for the connection's flush -------------------------------------------------------

    def pump(self, h2: H2Connection, out: list[Piece]) -> bool:
        """Send what the windows allow: HEADERS and trailers through h2, DATA as frames
        appended to ``out`` (after whatever h2 had to say before them); True when something
        is left for a later flush."""
        if self.closed:
            return False
        sid = self.stream_id
        if not self.headers_sent and (self.pending or self._initial or self.trailers is not None):
            if self.trailers is not None and not self.pending and self.trailers[0][0] == b":status":
                h2.send_headers(sid, self.trailers, end_stream=True)
                self._closed_by_us()
                return False
            h2.send_headers(
                sid, [(b":status", b"200"), (b"content-type", b"application/grpc"), *self._initial]
            )
            self.headers_sent = True
        pending = self.pending
        if pending:
            size = min(h2.local_flow_control_window(sid), pending.size)
            if size > 0:
                claim_data(h2, sid, size)
                before = h2.data_to_send()
                if before:
                    out.append(before)
                out += frames(sid, pending.take(size), h2.max_outbound_frame_size)
                self.link.queued(-size)
            if pending.size < HIGH_WATER:
                self._release_drain()
            if pending:
                return True
        if self.trailers is not None:
            h2.send_headers(sid, self.trailers, end_stream=True)
            self._closed_by_us()
        return False

    # -- inside ---------------------------------------------------------------------------

    def _closed_by_us(self) -> None:
        self.closed = True
        self.trailers = None

    def _account(self) -> None:
        """Tell the connection how the request bytes this call holds changed."""
        if self._released:
            return
        held = self._queued + self._reader.buffered
        change, self._held = held - self._held, held
        self.link.budget.held(self, change)

    def _release(self) -> None:
        """The call is finished: its request bytes stop counting, a partial one is dropped."""
        if self._released:
            return
        self._released = True
        self._reader = MessageReader(self.limit)
        held, self._held = self._held, 0
        self.link.budget.held(self, -held)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake_writer(self) -> None:
        """The connection is under its budget again: a write waiting in :meth:`drained`
        looks again."""
        self._release_drain()

    def _release_drain(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._deadline_hit = True
        self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        """End with ``code`` at once, whatever the handler is doing (cancelled)."""
        if self.finished:
            return
        self._finish(code, details, ())
        self._wake()
        self._release_drain()
        if self.task is not None:
            self.task.cancel()
        else:
            self.context.ended()

    def _finish(
        self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str | bytes]]
    ) -> None:
        if self.finished:
            return
        self.finished = True
        self._release()
        self._cancel_timer()
        status = [(b"grpc-status", str(code.value[0]).encode())]
        if details:
            status.append((b"grpc-message", encode_message(details)))
        status += [(k.encode(), header_value(k, v)) for k, v in trailing]
        if not self.headers_sent and not self.pending and not self._initial:
            status = [(b":status", b"200"), (b"content-type", b"application/grpc"), *status]
        self.trailers = status
        self.link.schedule(self)

    async def _requests_iterator(self) -> AsyncIterator[object]:
        while True:
            message = await self.receive()
            if message is grpc.aio.EOF:
                return
            yield message

    async def _single(self) -> object:
        first = await self.receive()
        if first is grpc.aio.EOF:
            raise _Unframed("Missing request message")
        if self._requests:
            raise _Unframed("Too many requests for a unary call")
        return first

    async def _run(self) -> None:
        context = self.context
        handler = self.handler
        try:
            request = (
                self._requests_iterator() if handler.request_streaming else await self._single()
            )
            if isinstance(context, SyncContext):
                await self._run_sync(request, context)
            elif handler.response_streaming:
                result = self._behaviour(request, context)
                if hasattr(result, "__aiter__"):
                    async with contextlib.aclosing(result):
                        async for response in result:
                            await context.write(response)
                else:
                    await result
            else:
                response = await self._behaviour(request, context)
                if context.status.code == grpc.StatusCode.OK:
                    await context.write(response)
            status = context.status
            self._finish(status.code, status.details, status.trailing)
        except grpc.aio.AbortError:
            status = context.status
            self._finish(status.code, status.details, status.trailing)
        except asyncio.CancelledError:
            # the status (deadline, reset, server stop) was decided by who cancelled; a
            # CancelledError the handler raised itself decided none
            self._finish(grpc.StatusCode.CANCELLED, "handler cancelled", ())
        except _Unframed as error:
            self._finish(grpc.StatusCode.INTERNAL, str(error), ())
        except Exception as error:
            LOG.error("exception in the handler of stream %d", self.stream_id, exc_info=True)
            self._finish(grpc.StatusCode.UNKNOWN, f"Unexpected {type(error)}: {error}", ())
        finally:
            context.ended()

    async def _run_sync(self, request: object, context: SyncContext) -> None:
        """A synchronous behaviour in the server's worker threads (grpcio's health servicer)."""
        loop = asyncio.get_running_loop()
        handler = self.handler
        if handler.request_streaming:
            request = iter([m async for m in request])  # type: ignore[attr-defined]
        if handler.response_streaming:
            iterator = await loop.run_in_executor(
                self.link.executor, lambda: iter(self._behaviour(request, context))
            )
            serialize = handler.response_serializer
            while True:
                item = await loop.run_in_executor(self.link.executor, next, iterator, _DONE)
                if item is _DONE:
                    return
                if self.full():
                    await self.drained()
                self.send(serialize(item) if serialize else item, False)  # type: ignore[arg-type]
        response = await loop.run_in_executor(self.link.executor, self._behaviour, request, context)
        if context.status.code == grpc.StatusCode.OK:
            serialize = handler.response_serializer
            self.send(serialize(response) if serialize else response, False)


class _Unframed(Exception):
    """A unary call without exactly one request."""
