"""One client connection of the native gRPC server: an asyncio protocol over an h2 state machine.

Theory of operation. Bytes in go to ``h2`` (``receive_data``); its events open calls
(``call.py``) for new streams, feed them DATA, end or reset them. Whatever h2 has to say
(SETTINGS and PING acknowledgements, WINDOW_UPDATE, RST_STREAM) is written at the end of each
``data_received``, so a client's keepalive and BDP pings are answered at once.

Out: calls ask for a flush (:meth:`Connection.schedule`); one flush per turn of the loop sends, for
every call with something to say, what the peer's windows allow (DATA frames up to its maximum
frame size, built beside the responses' bytes by ``outbox.py``, h2 told of the window used) and
then the trailers, in one socket write: ``writev`` of the pieces straight to a plaintext socket
while asyncio's transport holds nothing, the transport for the rest and for TLS. A call left with
bytes when its window is empty waits for a WINDOW_UPDATE (or a SETTINGS change of the initial
window); while the socket's buffer is above asyncio's high-water mark (``pause_writing``) nothing
is flushed, and the handlers' writes wait (``call.HIGH_WATER``).

In: the connection's window is reopened as DATA arrives (in steps of a quarter of it); each
stream's window is reopened by its call as its handler takes requests (``RECEIVE_BUFFER``), in
steps of ``call.WINDOW_STEP``. Request bytes the calls hold (decoded, or part of a message still
arriving) are counted (``limits.ReceiveBudget``); past ``limits.RECEIVE_BUDGET`` only one call
in the middle of a message at a time has its window reopened, the others wait until it has its
message or the handlers take enough. So a connection holds at most the budget, one message up
to the server's limit, and the windows already granted (``STREAM_WINDOW`` per open stream).

Control frames: while the socket's buffer is full, reading stops too (``pause_writing``), so a
client that sends without reading gets no answers queued; PINGs or SETTINGS sent quickly with
no HEADERS or DATA between them are strikes (``limits.Strikes``), and past
``limits.PING_STRIKES`` the connection is closed with GOAWAY ENHANCE_YOUR_CALM.

Admission: a connection over the server's ``max_connections`` is aborted as it is accepted
(one WARNING per ``limits.REFUSED_LOG_INTERVAL_S``); one whose HTTP/2 preface and first
SETTINGS have not arrived ``limits.PREFACE_TIMEOUT_S`` after it was accepted (after its TLS
handshake) is aborted.

Settings (``h2setup.py``): ``MAX_CONCURRENT_STREAMS``, ``STREAM_WINDOW``, ``MAX_HEADER_LIST``,
``MAX_FRAME_SIZE`` (what the peer may send us). A call whose headers exceed ``MAX_HEADER_LIST``
fails alone (RESOURCE_EXHAUSTED); only a header list over ``HEADER_DECODE_LIMIT`` ends the
connection.

Going away (the server stops), in grpc's two steps: a GOAWAY naming the highest stream id possible
(2^31-1: stop opening streams) and a PING; streams the client opened before it saw that GOAWAY
arrive before the PING's acknowledgement and are served. At the acknowledgement (or after
:data:`GOAWAY_PING_TIMEOUT_S`, or at once when the server is about to cancel what is left) the
final GOAWAY names the highest stream opened; later streams are refused (RST_STREAM REFUSED_STREAM:
never processed, so a client may retry them elsewhere). The calls open go on until they end or the
server cancels them; the socket closes once the final GOAWAY is out and no call is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Final, Protocol

import grpc
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    PingReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error
from hyperframe.frame import GoAwayFrame

from tidelog.api.framed import Piece
from tidelog.api.transport.call import Call
from tidelog.api.transport.h2setup import CONNECTION_WINDOW, MAX_HEADER_LIST, h2_connection
from tidelog.api.transport.limits import (
    CONNECTION_PENDING,
    PREFACE_TIMEOUT_S,
    RECEIVE_BUDGET,
    REFUSED_LOG_INTERVAL_S,
    UNEXPECTED_LOG_INTERVAL_S,
    RateLimited,
    ReceiveBudget,
    Strikes,
)
from tidelog.api.transport.messages import peer_name
from tidelog.api.transport.peer import auth_context
from tidelog.api.transport.requests import (
    GrpcRefusal,
    HttpRefusal,
    read_request,
    trailers_only,
)
from tidelog.api.transport.sockets import writev

LOG = logging.getLogger("tidelog.api.transport")

GOAWAY_PING_TIMEOUT_S: Final = 1.0
"""How long the first GOAWAY's PING may go unanswered before the final GOAWAY is sent."""
CALM_DOWN_CLOSE_S: Final = 1.0
"""How long a flooding client's socket stays open for its GOAWAY to be read."""
_MAX_STREAM_ID: Final = (1 << 31) - 1
_DRAIN_PING: Final = b"tl-drain"
_unexpected: Final = RateLimited(LOG, UNEXPECTED_LOG_INTERVAL_S)
_refused: Final = RateLimited(LOG, REFUSED_LOG_INTERVAL_S)


class Router(Protocol):
    """What a connection needs of its server (``server.py``)."""

    executor: Any
    limit: int
    connections: set[Connection]
    max_connections: int
    accepted: int

    def lookup(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> Any: ...


class Connection(asyncio.Protocol):
    """One HTTP/2 connection (module docstring)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.executor = router.executor
        self.h2 = h2_connection()
        self.calls: dict[int, Call] = {}
        self._ready: dict[int, Call] = {}
        self._blocked: dict[int, Call] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._paused = False
        self._transport: asyncio.Transport | None = None
        self._fd: int | None = None
        """The socket's descriptor when the connection is plaintext (``_send`` writes to it)."""
        self._owed = 0
        self.pending_bytes = 0
        """Response bytes the calls hold, not yet sent (``limits.CONNECTION_PENDING``)."""
        self._starved: dict[int, Call] = {}
        self.budget = ReceiveBudget(RECEIVE_BUDGET)
        self._pings = Strikes()
        self._settings = Strikes()
        self._going_away = False
        """New streams are refused (the final GOAWAY is sent, or the peer said GOAWAY)."""
        self._draining = False
        """The first GOAWAY (any stream) and its PING are sent."""
        self._goaway_sent = False
        self._drain_timer: asyncio.TimerHandle | None = None
        self._preface_timer: asyncio.TimerHandle | None = None
        self._counted = False
        self.peer = "unknown"
        self.auth: dict[str, list[bytes]] = {}
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        router = self.router
        if router.accepted >= router.max_connections:
            _refused.warn(
                "%s refused: %d connections open (grpc_max_connections)",
                peer_name(transport.get_extra_info("peername")),
                router.accepted,
                traceback=False,
            )
            transport.abort()
            return
        router.accepted += 1
        self._counted = True
        self._preface_timer = asyncio.get_running_loop().call_later(
            PREFACE_TIMEOUT_S, self._no_preface
        )
        if transport.get_extra_info("sslcontext") is None:
            sock = transport.get_extra_info("socket")
            self._fd = None if sock is None else sock.fileno()
        self.peer = peer_name(transport.get_extra_info("peername"))
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() not in (None, "h2"):
            transport.close()
            return
        self.auth = auth_context(tls)
        self.router.connections.add(self)
        self._write()  # the server's preface: its SETTINGS and window (``h2setup``)

    def data_received(self, data: bytes) -> None:
        try:
            self._received(data)
        except Exception:  # a bug here must cost this connection only, never the loop's handler
            _unexpected.warn("%s: unexpected error on an HTTP/2 connection; closing it", self.peer)
            self.abort()

    def _received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except H2Error as error:
            LOG.debug("%s: HTTP/2 protocol error: %s", self.peer, error)
            self._write()
            self._close()
            return
        for event in events:
            if isinstance(event, DataReceived):
                self._traffic()
                self._on_data(event)
            elif isinstance(event, RequestReceived):
                self._traffic()
                with contextlib.suppress(H2Error):  # reset (and forgotten) in the same read
                    self._on_request(event.stream_id, event.headers or [])
            elif isinstance(event, StreamEnded):
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.on_end()
            elif isinstance(event, StreamReset):
                call = self.calls.pop(event.stream_id, None)
                if call is not None:
                    call.on_reset()
            elif isinstance(event, WindowUpdated):
                self._unblock()
            elif isinstance(event, RemoteSettingsChanged):
                if self._preface_timer is not None:  # the preface and first SETTINGS are in
                    self._preface_timer.cancel()
                    self._preface_timer = None
                self._unblock()
                if self._settings.hit(time.monotonic()):
                    self._calm_down(b"too_many_settings")
                    return
            elif isinstance(event, PingReceived):
                if self._pings.hit(time.monotonic()):
                    self._calm_down(b"too_many_pings")
                    return
            elif isinstance(event, ConnectionTerminated):
                self._going_away = True
            elif isinstance(event, PingAckReceived) and event.ping_data == _DRAIN_PING:
                self._final_go_away()
        self._write()

    def pause_writing(self) -> None:
        """The socket's buffer is full: flush nothing, and read nothing either (what a client
        sends makes answers: PING and SETTINGS acknowledgements would pile up unsent)."""
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()
        self._schedule_flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fd = None
        if self._counted:
            self._counted = False
            self.router.accepted -= 1
        if self._preface_timer is not None:
            self._preface_timer.cancel()
            self._preface_timer = None
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.on_reset()
        self.router.connections.discard(self)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self.lost.done():
            self.lost.set_result(None)

    # -- for calls ------------------------------------------------------------------------

    def schedule(self, call: Call) -> None:
        self._ready[call.stream_id] = call
        if self._flush_handle is None:
            self._schedule_flush()

    @property
    def over_budget(self) -> bool:
        return self.pending_bytes >= CONNECTION_PENDING

    def queued(self, size: int) -> None:
        self.pending_bytes += size
        if size < 0 and self._starved and self.pending_bytes < CONNECTION_PENDING:
            starved, self._starved = self._starved, {}
            for call in starved.values():
                call.wake_writer()

    def starve(self, call: Call) -> None:
        self._starved[call.stream_id] = call

    def reopen(self, stream_id: int, size: int) -> None:
        if size <= 0:
            return
        self._reopen_stream(stream_id, size)
        if self._flush_handle is None:
            self._schedule_flush()

    # -- for the server -------------------------------------------------------------------

    def go_away(self, *, final: bool = False) -> None:
        """Refuse new streams and say so, in two steps (module docstring); ``final``: take
        the second step now (the server is about to cancel what is left)."""
        transport = self._transport
        if transport is None:
            self._going_away = True
            return
        if final or self._going_away:
            self._final_go_away()
            return
        if self._draining:
            return
        self._draining = True
        self._write()
        transport.write(GoAwayFrame(0, last_stream_id=_MAX_STREAM_ID, error_code=0).serialize())
        self.h2.ping(_DRAIN_PING)
        self._write()
        self._drain_timer = asyncio.get_running_loop().call_later(
            GOAWAY_PING_TIMEOUT_S, self._final_go_away
        )

    @property
    def settled(self) -> bool:
        """Going away is done here: the final GOAWAY is out (or the socket gone) and no call
        is open."""
        return not self.calls and (self._goaway_sent or self._transport is None)

    def cancel_calls(self, code: grpc.StatusCode, details: str) -> None:
        for call in list(self.calls.values()):
            call.cancel(code, details)

    def _final_go_away(self) -> None:
        """The second GOAWAY: the last stream this connection serves is the highest opened
        so far; later ones are refused. Closes at once when no call is open."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        if self._going_away and self._goaway_sent:
            return
        self._going_away = True
        transport = self._transport
        if transport is None:
            return
        self._goaway_sent = True
        self._write()
        last = self.h2.highest_inbound_stream_id
        transport.write(GoAwayFrame(0, last_stream_id=last, error_code=0).serialize())
        if not self.calls:
            self._close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- inside ---------------------------------------------------------------------------

    def _no_preface(self) -> None:
        self._preface_timer = None
        LOG.debug("%s: no HTTP/2 preface in %.0f s; closing", self.peer, PREFACE_TIMEOUT_S)
        self.abort()

    def _traffic(self) -> None:
        """HEADERS or DATA went either way: PINGs and SETTINGS before it are not strikes."""
        self._pings.clear()
        self._settings.clear()

    def _calm_down(self, reason: bytes) -> None:
        """GOAWAY ENHANCE_YOUR_CALM and close: the client floods control frames."""
        LOG.debug("%s: %s; closing", self.peer, reason.decode())
        self._going_away = self._goaway_sent = True
        with contextlib.suppress(H2Error):
            self.h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM, additional_data=reason)
        self._write()
        self._close()  # the GOAWAY goes if the client reads; it is cut off a second later anyway
        asyncio.get_running_loop().call_later(CALM_DOWN_CLOSE_S, self.abort)

    def _on_data(self, event: DataReceived) -> None:
        flow = event.flow_controlled_length or 0
        self._owed += flow
        if self._owed >= CONNECTION_WINDOW // 4:
            self.h2.increment_flow_control_window(self._owed)
            self._owed = 0
        call = self.calls.get(event.stream_id)
        if call is not None:
            call.on_data(event.data or b"", flow)
        elif flow:
            self._reopen_stream(event.stream_id, flow)

    def _reopen_stream(self, stream_id: int, size: int) -> None:
        """A WINDOW_UPDATE of ``size`` for ``stream_id``, unless the stream is gone: h2 may have
        closed (and forgotten) it while parsing the same read as the DATA being accounted,
        and indexes ``streams`` directly (a KeyError, not an H2Error)."""
        if stream_id not in self.h2.streams:
            return
        with contextlib.suppress(H2Error):  # closed but not yet forgotten
            self.h2.increment_flow_control_window(size, stream_id)

    def _on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self._going_away:
            self.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        request = read_request(headers, MAX_HEADER_LIST)
        if isinstance(request, HttpRefusal):
            self.h2.send_headers(stream_id, [(b":status", request.status)], end_stream=True)
            return
        if isinstance(request, GrpcRefusal):
            self._answer(stream_id, request.code, request.details)
            return
        handler = self.router.lookup(request.method, request.metadata)
        if handler is None:
            self._answer(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        elif request.bad_timeout is not None:
            self._answer(stream_id, grpc.StatusCode.INTERNAL, request.bad_timeout)
        elif request.timeout is not None and request.timeout <= 0:
            self._answer(stream_id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        else:
            self.calls[stream_id] = Call(
                self,
                stream_id,
                handler,
                request.metadata,
                request.timeout,
                self.peer,
                self.auth,
                self.router.limit,
            )

    def _answer(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """A trailers-only response for a stream that gets no call."""
        self.h2.send_headers(stream_id, trailers_only(code, details), end_stream=True)

    def _unblock(self) -> None:
        if self._blocked:
            self._ready.update(self._blocked)
            self._blocked.clear()
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and self._transport is not None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        try:
            self._flush_calls()
        except Exception:  # as in data_received: this connection only
            _unexpected.warn("%s: unexpected error on an HTTP/2 connection; closing it", self.peer)
            self.abort()

    def _flush_calls(self) -> None:
        if self._transport is None:
            return
        out: list[Piece] = []
        if not self._paused and self._ready:
            ready, self._ready = self._ready, {}
            h2 = self.h2
            for stream_id, call in ready.items():
                try:
                    left = call.pump(h2, out)
                except H2Error:  # the peer closed the stream in the meantime
                    self.calls.pop(stream_id, None)
                    call.on_reset()
                    continue
                if left:
                    self._blocked[stream_id] = call
                elif call.closed:
                    self.calls.pop(stream_id, None)
                    if not call.ended_by_peer:
                        with contextlib.suppress(H2Error):
                            h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        if out:
            self._traffic()
            rest = self.h2.data_to_send()
            if rest:
                out.append(rest)
            self._send(out)
        else:
            self._write()
        if self._going_away and self._goaway_sent and not self.calls:
            self._close()

    def _write(self) -> None:
        data = self.h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _send(self, pieces: list[Piece]) -> None:
        """Write ``pieces`` in order: straight to the socket with ``writev`` while the
        transport holds nothing (plaintext), the rest (or all, with TLS) through it."""
        transport = self._transport
        if transport is None:
            return
        fd = self._fd
        if fd is not None and not transport.is_closing() and not transport.get_write_buffer_size():
            pieces = writev(fd, pieces)
        if pieces:
            transport.writelines(pieces)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()
