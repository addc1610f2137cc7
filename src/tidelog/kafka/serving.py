"""The Kafka listener: a TCP (or TLS) server, one :class:`Session` per connection.

Theory of operation. A connection's requests are answered one at a time, in the order they came
(Kafka's broker does the same: it reads no further request of a connection until the previous one
is answered), so a client's pipelined produce requests to one partition are appended in their
order, and responses never need reordering. A long-polling fetch holds its connection only.
While a request that waits on others is served (:data:`~tidelog.kafka.apis.WAITING`: Fetch,
JoinGroup, SyncGroup), the connection is read ahead (``inbox.py``): a client that closes it
meanwhile has that request cancelled at once (a JoinGroup's member leaves the group then, rather
than holding the rebalance until its timeout), while requests it pipelined behind it are kept
and answered in their turn.

What a connection does with each frame:

- a size below a header's or above ``request_max_bytes``, or a frame that does not decode: a log
  line and the connection is closed (a framing error leaves nothing to answer on); so does a
  request over the bounds of ``bounds.py`` (its frame's size by api, its arrays' elements), and
  an answer too large for a frame (``protocol.ResponseTooLarge``);
- an api or version not in :data:`~tidelog.kafka.apis.APIS`: ``ApiVersions`` is answered in its
  version-0 shape with ``UNSUPPORTED_VERSION`` and the served ranges (the client then retries at a
  version it shares); any other is answered with the correlation id and ``UNSUPPORTED_VERSION``,
  and the connection stays open;
- before a SASL exchange completes (when the listener requires one), anything but ``ApiVersions``
  and the SASL calls closes the connection, as Kafka does; so do a frame above
  ``sasl.UNAUTHENTICATED_MAX_BYTES`` and a login not done within ``sasl.LOGIN_TIMEOUT_S``;
- a handler may close the connection once its answer is sent (``Session.closing``: a refused
  SASL step), and after a SASL handshake v0 the frames are bare SASL messages (``sasl.py``);
- a handler's bug is logged with its traceback and closes the connection; every known failure is
  an error code inside the response (``status.py``).

Who a connection is: its verified client certificate, through the server's authenticator (as a
gRPC call without a token), else anonymous when the server admits it. When the listener offers
SASL, a connection that the certificate does not identify (and the server does not admit
anonymously) must log in first; one that it does may still log in, and the login names it
(``sasl.py``). Without SASL such a connection is closed at once. The listener keeps every open
session: :meth:`KafkaListener.recheck` (after a reload of the tokens) closes those whose SASL
token was revoked; every request is checked against the policy of its moment anyway.
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
from tidelog.kafka import sasl
from tidelog.kafka.apis import APIS, AUTH_FREE, WAITING, unsupported
from tidelog.kafka.bounds import ENCODE_APART_ITEMS, RequestTooBig, check_counts, check_frame
from tidelog.kafka.inbox import Inbox, PeerClosed
from tidelog.kafka.protocol import (
    SIZE,
    MalformedRequest,
    ResponseTooLarge,
    decode_request,
    encode_response_parts,
)
from tidelog.kafka.protocol import frame_start as read_frame_start
from tidelog.kafka.session import ClusterPeers, Gate, KafkaConfig, OpenGate, Session

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
    peer = tls.getpeercert()
    if not peer:
        return context
    cert: dict[str, Any] = dict(peer)  # typeshed's union of its values does not unpack
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
        unknown = set(config.sasl_mechanisms) - set(sasl.MECHANISMS)
        if unknown:
            raise ValueError(f"SASL mechanism(s) not served: {', '.join(sorted(unknown))}")
        if config.sasl_mechanisms and tls is None:
            raise ValueError(
                "SASL needs TLS on the Kafka listener: a password would cross the network "
                "readable (give the server tls_cert and tls_key)"
            )
        self.control = control
        self.config = config
        self.gate: Gate = gate or OpenGate()
        self.tls = tls
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._sessions: dict[asyncio.Task[None], Session] = {}
        self.peers: Mapping[str, tuple[str, int]] = ClusterPeers(control)
        """Other brokers' Kafka addresses by broker id, for Metadata: read from the control at
        each use, so it follows the cluster's membership (empty on a single broker)."""

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
                self._sessions[task] = session
                await self._serve(session, reader, writer)
        except PeerClosed:
            LOG.info("kafka connection from %s closed while a request waited", where)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the listener stops, or a reload revoked the connection's login
        except Exception:  # a bug outside a handler: this connection only
            LOG.exception("kafka connection from %s failed; closed", where)
        finally:
            self._connections.discard(task)
            self._sessions.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    def _session(self, writer: asyncio.StreamWriter, where: str) -> Session | None:
        session = Session(
            self.control, self.config, self.gate, where, self.advertised, peers=self.peers
        )
        tls: ssl.SSLObject | None = writer.get_extra_info("ssl_object")
        session.secure = tls is not None
        try:
            session.identity = self.gate.authenticator.identify(certificate_context(tls), None)
            session.authenticated = True
        except Unauthenticated as refusal:
            if not self.config.sasl_mechanisms:
                LOG.warning("kafka connection from %s refused: %s", where, refusal)
                return None
        return session

    def recheck(self) -> int:
        """Close the connections whose SASL login the authenticator of now refuses (a token
        revoked by a reload); how many. Each is logged."""
        authenticator = self.gate.authenticator
        ended = 0
        for task, session in list(self._sessions.items()):
            if sasl.still_admitted(session, authenticator):
                continue
            login = sasl.login_of(session)
            assert login is not None  # a session without a login is always still admitted
            LOG.warning(
                "kafka connection from %s closed: the token %s logged in with (SASL %s) was "
                "revoked by the reload",
                session.peer,
                login.principal,
                login.mechanism,
            )
            self._sessions.pop(task, None)
            task.cancel()
            ended += 1
        return ended

    async def _serve(
        self, session: Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        login_by = asyncio.get_running_loop().time() + sasl.LOGIN_TIMEOUT_S
        inbox = Inbox(reader)
        while True:
            try:
                async with asyncio.timeout_at(None if session.authenticated else login_by):
                    frame = await self._frame(session, inbox)
            except TimeoutError:
                LOG.warning(
                    "kafka connection from %s closed: no SASL login within %.0f s",
                    session.peer,
                    sasl.LOGIN_TIMEOUT_S,
                )
                return
            if frame is None:
                return
            response: Response | None
            try:
                if sasl.in_raw_exchange(session):
                    raw = sasl.answer_raw(session, frame)
                    response = None if raw is None else [raw]
                else:
                    response = await self._answer(session, frame, inbox)
            except (MalformedRequest, RequestTooBig) as error:
                LOG.warning("kafka connection from %s closed: %s", session.peer, error)
                return
            except _Close as close:
                LOG.warning("kafka connection from %s closed: %s", session.peer, close)
                return
            if response is not None:
                for part in response:  # the records as the fetch built them: not joined
                    writer.write(part)
                await writer.drain()
            if session.closing is not None:
                LOG.warning("kafka connection from %s closed: %s", session.peer, session.closing)
                return

    async def _frame(self, session: Session, inbox: Inbox) -> bytes | None:
        """The next frame's bytes; None (logged) for a size out of bounds: at most
        ``request_max_bytes``, before a login at most ``sasl.UNAUTHENTICATED_MAX_BYTES``."""
        (size,) = SIZE.unpack(await inbox.readexactly(SIZE.size))
        if session.authenticated:
            limit, what = self.config.request_max_bytes, "--kafka-request-max-bytes"
        else:
            limit, what = sasl.UNAUTHENTICATED_MAX_BYTES, "before logging in"
        smallest = 0 if sasl.in_raw_exchange(session) else _MIN_FRAME  # bare SASL: any size
        if not smallest <= size <= limit:
            LOG.warning(
                "kafka connection from %s closed: a request of %d bytes (at most %d, %s)",
                session.peer,
                size,
                limit,
                what,
            )
            return None
        return await inbox.readexactly(size)

    async def _answer(self, session: Session, frame: bytes, inbox: Inbox) -> Response | None:
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
        if start.api_key not in AUTH_FREE:
            if not session.authenticated:
                raise _Close(
                    f"api {start.api_key} before logging in: this server requires credentials "
                    f"(a client certificate, or a SASL login)"
                )
            session.settled = True
        check_frame(start.api_key, len(frame), self.config.request_max_bytes)
        request = decode_request(frame)
        items = check_counts(request.body)
        session.client_id = request.client_id
        try:
            if start.api_key in WAITING:
                body = await inbox.unless_closed(api.handler(session, request))
            else:
                body = await api.handler(session, request)
            if body is None:
                return None
            if items > ENCODE_APART_ITEMS:
                return await asyncio.to_thread(encode_response_parts, request, body)
            return encode_response_parts(request, body)
        except (MalformedRequest, _Close, PeerClosed):
            raise
        except ResponseTooLarge as error:
            raise _Close(str(error)) from error
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
