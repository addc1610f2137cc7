"""tidelog's own gRPC server on asyncio and HTTP/2, standing in for ``grpc.aio.server()``.

The rest of the server sees the same object grpcio gives it: services are registered with
``add_generic_rpc_handlers`` and ``add_registered_method_handlers`` (what the generated
``add_*Servicer_to_server`` functions call, through ``GuardedRegistry``), ports are bound with
``add_insecure_port`` / ``add_secure_port`` (which return the bound port, and raise
RuntimeError when the address cannot be bound, as grpcio does), then ``start``, ``stop(grace)``
and ``wait_for_termination``.

Why it exists: grpcio's server spends tens of microseconds of CPU on every message of a stream
(one batch operation, one future, one wake-up each) and cannot write several messages at once;
this one appends every response of a turn of the loop to its stream's bytes and writes them in
one go (``call.py``), and writes a handler's :class:`~tidelog.api.framed.Framed` as it is.

Bounds: at most ``max_connections`` connections at once (a further one is closed as soon as
it is accepted); a TLS handshake, and then the HTTP/2 preface and first SETTINGS, must each
come within :data:`~.limits.PREFACE_TIMEOUT_S` (``connection.py``).

Stop: the listening sockets close, every connection says GOAWAY in grpc's two steps (streams the
client opened before it heard are still served, later ones refused so that it retries them
elsewhere: ``connection.py``), the calls in flight get ``grace`` seconds to end; those still running
are then cancelled and answered UNAVAILABLE, and the connections closed. Synchronous handlers
(grpcio's health servicer) run in this server's worker threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import grpc

from tidelog.api.transport.connection import Connection
from tidelog.api.transport.limits import MAX_CONNECTIONS, PREFACE_TIMEOUT_S
from tidelog.wire import MAX_FRAME

Handler = Any
"""A ``grpc.RpcMethodHandler``."""

SYNC_WORKERS = 8
"""Threads for synchronous handlers (the health service's Check and Watch)."""


class HandlerCallDetails(NamedTuple):
    """What a generic handler's ``service`` is asked about (grpcio's fields)."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class NativeServer:
    """A gRPC server (module docstring)."""

    def __init__(
        self, *, max_message_length: int = MAX_FRAME, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self.limit = max_message_length
        self.max_connections = max_connections
        self.connections: set[Connection] = set()
        self.accepted = 0
        """Connections accepted and not yet lost (those still in their handshake too)."""
        self.executor = concurrent.futures.ThreadPoolExecutor(
            SYNC_WORKERS, thread_name_prefix="tidelog-grpc-sync"
        )
        self._registered: dict[str, Handler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._listeners: list[asyncio.Server] = []
        self._stopped: asyncio.Event | None = None
        self._started = False

    # -- what grpc.aio.Server offers ------------------------------------------------------

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Handler]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        """``context``: a server context offering ALPN ``h2`` (``ServerTls.ssl_context``)."""
        return self._bind(address, context)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sock, context in self._sockets:
            listener = await loop.create_server(
                lambda: Connection(self),
                sock=sock,
                ssl=context,
                backlog=1024,
                ssl_handshake_timeout=PREFACE_TIMEOUT_S if context is not None else None,
            )
            self._listeners.append(listener)

    async def stop(self, grace: float | None) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        for sock, _ in self._sockets:  # bound but never started
            sock.close()
        self._sockets.clear()
        for connection in list(self.connections):
            connection.go_away()
        if grace:
            await _calls_ended(self.connections, grace)
        for connection in list(self.connections):
            connection.go_away(final=True)
            connection.cancel_calls(grpc.StatusCode.UNAVAILABLE, "server shutting down")
        lost = [connection.lost for connection in self.connections]
        if lost:
            _, open_still = await asyncio.wait(lost, timeout=1.0)
            if open_still:
                for connection in list(self.connections):
                    connection.abort()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._stopped is not None:
            self._stopped.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._stopped is None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout)
        return self._stopped.is_set()

    # -- for connections ------------------------------------------------------------------

    def lookup(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> Handler:
        handler = self._registered.get(method)
        if handler is not None:
            return handler
        details = HandlerCallDetails(method, metadata)
        for generic in self._generic:
            handler = generic.service(details)  # type: ignore[arg-type]
            if handler is not None:
                return handler
        return None

    # -- inside ---------------------------------------------------------------------------

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        host, _, port_text = address.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
            infos = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except (ValueError, OSError) as error:
            raise RuntimeError(f"cannot bind {address}: {error}") from error
        bound: list[socket.socket] = []
        for family, kind, proto, _, where in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if bound:  # every address of the name on the port the first one got
                    where = (where[0], bound[0].getsockname()[1], *where[2:])
                sock.bind(where)
                sock.listen(1024)
                sock.setblocking(False)
            except OSError as error:
                sock.close()
                for other in bound:
                    other.close()
                raise RuntimeError(f"cannot bind {address}: {error}") from error
            bound.append(sock)
        if not bound:
            raise RuntimeError(f"cannot bind {address}: no address")
        self._sockets += [(sock, context) for sock in bound]
        return int(bound[0].getsockname()[1])


async def _calls_ended(connections: set[Connection], grace: float) -> None:
    """Wait until every connection has said its final GOAWAY and has no call open, or
    ``grace`` seconds."""
    loop = asyncio.get_running_loop()
    until = loop.time() + grace
    while not all(c.settled for c in connections) and loop.time() < until:
        await asyncio.sleep(0.02)
