"""The servicer context tidelog's handlers get from the native transport, shaped like grpc.aio's.

A handler sees what it sees under grpcio: ``abort`` raises ``grpc.aio.AbortError`` (the guard
lets that pass) after recording the status, ``write`` sends a response of a server stream,
``read`` takes the next request of a client stream (``grpc.aio.EOF`` at its end),
``invocation_metadata``, ``peer``, ``auth_context`` (grpcio's keys and values for TLS and mTLS,
built once per connection by ``peer.py``), ``time_remaining`` (None without a deadline),
``set_code``/``set_details``/``set_trailing_metadata``, and done callbacks. ``takes_framed`` is
True: a response that is a :class:`~tidelog.api.framed.Framed` goes out as its bytes.

Invariants: the status a call ends with is the one recorded last (by ``abort``, or
``set_code``/``set_details`` before the handler returns); ``write`` never buffers beyond the
call's high-water mark (nor starts while the connection is over its budget of pending bytes):
it waits for the peer's flow-control window instead.

:class:`SyncContext` is the same for a synchronous handler, which runs in a worker thread
(grpcio's health servicer): its ``abort`` raises at once, ``add_callback`` runs when the call
ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from tidelog.api.framed import Framed, Piece
from tidelog.api.transport.messages import Metadata
from tidelog.api.transport.outbox import Outbox


class CallPort(Protocol):
    """What a context needs of its call (``call.py``)."""

    deadline: float | None
    metadata: Metadata
    peer: str
    auth: dict[str, list[bytes]]
    pending: Outbox

    def send(self, data: Piece | tuple[Piece, ...], framed: bool) -> bool: ...

    def full(self) -> bool: ...

    async def drained(self) -> None: ...

    async def receive(self) -> object: ...

    async def send_headers(self, metadata: Sequence[tuple[str, str | bytes]]) -> None: ...

    def is_active(self) -> bool: ...


class Status:
    """The code, details and trailing metadata a call will end with."""

    __slots__ = ("aborted", "code", "details", "trailing")

    def __init__(self) -> None:
        self.code: grpc.StatusCode = grpc.StatusCode.OK
        self.details = ""
        self.trailing: Metadata = ()
        self.aborted = False


class _Common:
    """What both contexts share: metadata, peer, identity, deadline, status."""

    takes_framed = True

    def __init__(self, call: CallPort) -> None:
        self._call = call
        self.status = Status()
        self._callbacks: list[Callable[[], None]] = []

    def invocation_metadata(self) -> Metadata:
        return self._call.metadata

    def peer(self) -> str:
        return self._call.peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._call.auth

    def peer_identities(self) -> list[bytes] | None:
        auth = self._call.auth
        return auth.get("x509_subject_alternative_name") or auth.get("x509_common_name") or None

    def peer_identity_key(self) -> str | None:
        auth = self._call.auth
        if auth.get("x509_subject_alternative_name"):
            return "x509_subject_alternative_name"
        return "x509_common_name" if auth.get("x509_common_name") else None

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else max(deadline - time.monotonic(), 0.0)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.status.code = code

    def set_details(self, details: str) -> None:
        self.status.details = details

    def code(self) -> grpc.StatusCode:
        return self.status.code

    def details(self) -> str:
        return self.status.details

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.status.trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> Metadata:
        return self.status.trailing

    def set_compression(self, compression: object) -> None:
        """Accepted and ignored: this transport sends uncompressed messages."""

    def disable_next_message_compression(self) -> None:
        """Accepted and ignored (nothing is compressed)."""

    def is_active(self) -> bool:
        return self._call.is_active()

    def _record_abort(
        self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str | bytes]]
    ) -> None:
        if code == grpc.StatusCode.OK:
            code = grpc.StatusCode.UNKNOWN  # as grpcio: an abort never ends a call with OK
        self.status.code = code
        self.status.details = details
        if trailing:
            self.status.trailing = tuple(trailing)
        self.status.aborted = True

    def ended(self) -> None:
        """The call is over: run the done callbacks (once)."""
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class ServicerContext(_Common):
    """The context of an async handler (module docstring)."""

    def __init__(self, call: CallPort, serializer: Callable[[Any], bytes] | None) -> None:
        super().__init__(call)
        self._serialize = serializer

    async def write(self, message: object) -> None:
        call = self._call
        if call.full():  # before queueing: many calls cannot each add one past the budget
            await call.drained()
        if isinstance(message, Framed):
            call.send(message.data, True)
        else:
            call.send(self.serialize(message), False)

    def outbound(self) -> tuple[int, int]:
        """The call's response bytes queued and not yet handed to the connection, and those
        handed so far (a running count): a response written (queued) when the two summed to
        ``end`` has left the call once the second reaches ``end`` (``broker/span_leases.py``)."""
        pending = self._call.pending
        return pending.size, pending.taken

    def serialize(self, message: object) -> bytes:
        serialize = self._serialize
        return serialize(message) if serialize is not None else message  # type: ignore[return-value]

    async def read(self) -> object:
        return await self._call.receive()

    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, Any]]) -> None:
        await self._call.send_headers(initial_metadata)

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        self._record_abort(code, details, trailing_metadata)
        raise grpc.aio.AbortError(f"Locally aborted: {code} {details}")

    def add_done_callback(self, callback: Callable[[ServicerContext], None]) -> None:
        self._callbacks.append(lambda: callback(self))

    def cancelled(self) -> bool:
        return not self._call.is_active() and self.status.code == grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return not self._call.is_active()


class SyncContext(_Common):
    """The context of a synchronous handler run in a worker thread (module docstring)."""

    def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        self._record_abort(code, details, trailing_metadata)
        raise grpc.aio.AbortError(f"Locally aborted: {code} {details}")

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._callbacks.append(callback)
        return True

    def time_remaining(self) -> float | None:
        return super().time_remaining()
