"""The Kafka listener: a TCP (or TLS) server, one :class:`Session` per connection.

Theory of operation. A connection's requests are answered one at a time, in the order they came
(Kafka's broker does the same: it reads no further request of a connection until the previous one
is answered), so a client's pipelined produce requests to one partition are appended in their
order, and responses never need reordering. A long-polling fetch holds its connection only.

What a connection does with each frame:

- a size below a header's or above ``request_max_bytes``, or a frame that does not decode: a log
  line and the connection is closed (a framing error leaves nothing to answer on);
- an api or version not in :data:`~tidelog.kafka.apis.APIS`: ``ApiVersions`` is answered in its
  version-0 shape with ``UNSUPPORTED_VERSION`` and the served ranges (the client then retries at a
  version it shares); any other is answered with the correlation id and ``UNSUPPORTED_VERSION``,
  and the connection stays open;
- before a SASL exchange completes (when the listener requires one), anything but ``ApiVersions``
  and the SASL calls closes the connection, as Kafka does;
- a handler's bug is logged with its traceback and closes the connection; every known failure is
  an error code inside the response (``status.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Mapping
from typing import Any, Final

from tidelog.control import Control
from tidelog.errors import Unauthenticated
from tidelog.kafka.apis import APIS, AUTH_FREE, unsupported
from tidelog.kafka.protocol import (
    SIZE,
    MalformedRequest,
    decode_request,
    encode_response_parts,
)
from tidelog.kafka.protocol import frame_start as read_frame_start
from tidelog.kafka.session import Gate, KafkaConfig, OpenGate, Session

LOG = logging.getLogger("tidelog.kafka")
_MIN_FRAME: Final = 8
_ERROR_ONLY: Final = struct.Struct(">iih")
Response = list[bytes | bytearray | memoryview]
"""A response frame as buffers to write in order (``protocol.encode_response_parts``)."""


def certificate_context(tls: ssl.SSLObject | None) -> Mapping[str, list[bytes]]:
    """The verified peer certificate in the shape the authenticator reads (grpc's auth
    context): SANs (DNS, email, URI, IP) and the common name."""
    if tls is None:
        return {}
    context: dict[str, list[bytes]] = {"transport_security_type": [b"ssl"]}
    cert: Any = tls.getpeercert()  # typeshed's union of value types hides the SAN pairs
    if not cert:
        return context
    sans = [
        str(value).encode()
        for kind, value in cert.get("subjectAltName", ())
        if kind in ("DNS", "email", "URI", "IP Address")
    ]
    if sans:
        context["x509_subject_alternative_name"] = sans
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                context.setdefault("x509_common_name", []).append(str(value).encode())
    return context


class KafkaListener:
    """The Kafka front of one server (module docstring)."""

    def __init__(
        self,
        control: Control,
        config: KafkaConfig,
        gate: Gate | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.control = control
        self.config = config
        self.gate: Gate = gate or OpenGate()
        self.tls = tls
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.peers: dict[str, tuple[str, int]] = {}
        """Other brokers' Kafka addresses by broker id, for Metadata (a cluster fills it)."""

    async def start(self) -> int:
        """Bind and serve; the bound port (``OSError`` naming the address when it is taken)."""
        try:
            self._server = await asyncio.start_server(
                self._connection,
                self.config.host,
                self.config.port,
                ssl=self.tls,
                reuse_address=True,
                limit=1 << 16,
            )
        except OSError as error:
            raise OSError(
                f"cannot listen for Kafka clients on {self.config.host}:{self.config.port}: "
                f"{error.strerror or error}; choose another --kafka-port"
            ) from error
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def advertised(self) -> tuple[str, int]:
        return (
            self.config.advertised_host or self.config.host,
            self.config.advertised_port or self.port,
        )

    async def stop(self) -> None:
        """Stop accepting, end every connection (their requests in flight are cancelled)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:
            session = self._session(writer, where)
            if session is not None:
                await self._serve(session, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the listener stops
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    def _session(self, writer: asyncio.StreamWriter, where: str) -> Session | None:
        session = Session(
            self.control, self.config, self.gate, where, self.advertised, peers=self.peers
        )
        tls: ssl.SSLObject | None = writer.get_extra_info("ssl_object")
        try:
            session.identity = self.gate.authenticator.identify(certificate_context(tls), None)
            session.authenticated = not self.config.sasl_mechanisms
        except Unauthenticated as refusal:
            if not self.config.sasl_mechanisms:
                LOG.warning("kafka connection from %s refused: %s", where, refusal)
                return None
        return session

    async def _serve(
        self, session: Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limit = self.config.request_max_bytes
        while True:
            (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
            if not _MIN_FRAME <= size <= limit:
                LOG.warning(
                    "kafka connection from %s closed: a request of %d bytes (at most %d, "
                    "socket.request.max.bytes: --kafka-request-max-bytes)",
                    session.peer,
                    size,
                    limit,
                )
                return
            frame = await reader.readexactly(size)
            try:
                response = await self._answer(session, frame)
            except MalformedRequest as error:
                LOG.warning("kafka connection from %s closed: %s", session.peer, error)
                return
            except _Close as close:
                LOG.warning("kafka connection from %s closed: %s", session.peer, close)
                return
            if response is not None:
                for part in response:  # the records as the fetch built them: not joined
                    writer.write(part)
                await writer.drain()

    async def _answer(self, session: Session, frame: bytes) -> Response | None:
        start = read_frame_start(frame)
        api = APIS.get(start.api_key)
        if api is None or not api.min_version <= start.version <= api.max_version:
            LOG.info(
                "kafka client %s asked for api %d v%d, which is not served",
                session.peer,
                start.api_key,
                start.version,
            )
            body = unsupported(start)
            if body is None:
                return [_ERROR_ONLY.pack(6, start.correlation_id, 35)]
            return encode_response_parts(start, body)
        if not session.authenticated and start.api_key not in AUTH_FREE:
            raise _Close(f"api {start.api_key} before authenticating (SASL is required here)")
        request = decode_request(frame)
        session.client_id = request.client_id
        try:
            body = await api.handler(session, request)
            return None if body is None else encode_response_parts(request, body)
        except (MalformedRequest, _Close):
            raise
        except Unauthenticated as error:
            raise _Close(str(error)) from error
        except Exception as error:
            LOG.error(
                "kafka api %d v%d from %s failed",
                start.api_key,
                start.version,
                session.peer,
                exc_info=error,
            )
            raise _Close(f"the broker failed on api {start.api_key} (logged)") from error


class _Close(Exception):
    """End the connection after a log line."""
