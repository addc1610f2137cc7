"""The server's HTTP ports: ``metrics_port`` serves ``/metrics`` and, mounted at ``/``, the web
console; with ``console_port`` set the console has that port of its own and the metrics port
serves ``/metrics`` alone.

Each port is one ASGI app (Starlette routing) served by uvicorn on a thread of its own with its
own event loop, so a Prometheus scrape or a console page never runs on the broker's loop. When the
server has TLS (``tls_cert``) every HTTP port serves HTTPS with the context of
:meth:`~tidelog.security.ServerTls.ssl_context`, which a SIGHUP reloads in place (new connections
get the new certificate); with ``tls_client_ca`` a client certificate is required there too, and
the console names its visitor by it (:class:`ServerGate`). The socket is
bound first (:meth:`HttpEndpoint.bind`), before anything else starts, so a port in use stops the
start at once with a message that names the setting; the app is served once the gRPC port is
known (:meth:`HttpEndpoint.start`), because the console reaches the broker through a client of
that port, like any other client. The api does not import the console (the layering forbids it):
whoever starts the server passes a factory that builds it (``tidelog serve`` does), handed the
console's address of the gRPC port and a :class:`ServerGate`: the server's live guard, tokens and
principal rules, which the console's gate uses to sign its visitors in (``tidelog.console.gate``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import uvicorn
from cryptography import x509
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from tidelog.access import Guard, Kind, Operation, on
from tidelog.api import metrics_http
from tidelog.api.credentials import ServerSecurity
from tidelog.api.metrics_http import GuardedMetrics
from tidelog.errors import Unauthenticated
from tidelog.security import ClientTls
from tidelog.security.identity import AUTHORIZATION, OTHER_SAN

LOG = logging.getLogger("tidelog.http")

ASGIApp = Callable[..., Any]

PEER_CERTIFICATE: Final = metrics_http.PEER_CERTIFICATE
"""The scope extension holding the connection's verified client certificate (the console's
``tidelog.console.gate.PEER_CERTIFICATE``; the api does not import the console)."""


_GRPC_SAN_KINDS: Final = ("DNS", "email", "URI", "IP Address")
"""The subject alternative names gRPC's auth context writes out, in ``getpeercert()``'s names."""

_GRPC_SAN_TYPES: Final[dict[type[x509.GeneralName], str]] = {
    x509.DNSName: "DNS",
    x509.RFC822Name: "email",
    x509.UniformResourceIdentifier: "URI",
    x509.IPAddress: "IP Address",
}
"""The same kinds as cryptography's types."""


def grpc_san(kind: str, value: object) -> str:
    """A subject alternative name as gRPC's auth context lists it (in the certificate's order):
    ``OTHER_SAN`` (``security.identity``) for a kind it does not write out, an IP address as
    ``inet_ntop`` writes it (``getpeercert()`` writes an IPv6 one in eight uncompressed groups).
    The HTTP ports hand the authenticator the list gRPC would, so a certificate names one
    principal on both."""
    if kind not in _GRPC_SAN_KINDS:
        return OTHER_SAN
    if kind != "IP Address":
        return str(value)
    try:
        address = ipaddress.ip_address(str(value).strip())
    except ValueError:
        return str(value)
    if isinstance(address, ipaddress.IPv6Address):
        # inet_ntop writes an IPv4 address carried in IPv6 (::ffff:a.b.c.d, ::a.b.c.d) dotted
        if address.ipv4_mapped is not None:
            return f"::ffff:{address.ipv4_mapped}"
        packed = address.packed
        if packed[:12] == bytes(12) and packed[12:14] != bytes(2):
            return f"::{ipaddress.IPv4Address(packed[12:])}"
    return str(address)


def _certificate_context(sans: list[str], common_names: list[str]) -> dict[str, list[bytes]]:
    """A certificate's names as gRPC's auth context holds them."""
    return {
        "x509_subject_alternative_name": [n.encode() for n in sans],
        "x509_common_name": [n.encode() for n in common_names],
    }


@dataclass(frozen=True)
class ServerGate:
    """What the console asks of the server (the ``Gate`` protocol of ``tidelog.console.gate``):
    read live from the server's security, so that a SIGHUP reload of the tokens or the ACL
    applies to the console at its next request."""

    security: ServerSecurity
    port: int
    """the console's HTTP port"""

    @property
    def guard(self) -> Guard:
        return self.security.door.guard

    @property
    def login_required(self) -> bool:
        return self.security.settings.authentication_required

    @property
    def accepts_tokens(self) -> bool:
        return self.security.door.authenticator.tokens is not None

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(self.security.settings.console_hosts)

    @property
    def bound_host(self) -> str:
        return self.security.settings.host

    @property
    def secure(self) -> bool:
        return self.security.tls is not None

    def principal_of_token(self, token: str) -> str | None:
        tokens = self.security.door.authenticator.tokens
        return tokens.principal_of(token) if tokens is not None else None

    def principal_of_peer(self, certificate: Mapping[str, Any]) -> str | None:
        """The principal the gRPC port would name for this verified certificate (in
        ``ssl.SSLSocket.getpeercert()``'s form)."""
        try:
            principal = self.identify(None, certificate)
        except Unauthenticated:
            return None
        return principal or None

    def identify(self, authorization: str | None, certificate: Mapping[str, Any] | None) -> str:
        """The caller of an HTTP request, named by the server's authenticator as a gRPC call
        with the same credentials would be: ``authorization`` (the header's value, a bearer
        token) over this port's TLS, else the connection's verified ``certificate`` (in
        ``getpeercert()``'s form). :class:`~tidelog.errors.Unauthenticated` as for gRPC."""
        auth_context: dict[str, list[bytes]] = {}
        if self.secure:
            auth_context["transport_security_type"] = [b"ssl"]
        if certificate:
            sans = [grpc_san(k, v) for k, v in certificate.get("subjectAltName", ())]
            names = [
                str(value)
                for rdn in certificate.get("subject", ())
                for key, value in rdn
                if key == "commonName"
            ]
            auth_context |= _certificate_context(sans, names)
        metadata = [(AUTHORIZATION, authorization)] if authorization is not None else []
        return self.security.door.authenticator.identify(auth_context, metadata)

    def own_principal(self) -> str | None:
        """The server's own principal: its certificate's, as the gRPC port names it."""
        path = self.security.settings.tls_cert
        if path is None:
            return None
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
        try:
            extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            sans = [
                grpc_san(_GRPC_SAN_TYPES.get(type(name), ""), getattr(name, "value", None))
                for name in extension.value
            ]
        except x509.ExtensionNotFound:
            sans = []
        names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        auth_context = {
            "transport_security_type": [b"ssl"],
            **_certificate_context(sans, [str(n.value) for n in names]),
        }
        try:
            return self.security.door.authenticator.identify(auth_context, ()) or None
        except Unauthenticated:
            return None

    def client_tls(self) -> ClientTls:
        """How the console's client calls the gRPC port: as the server itself (docs/security.md,
        "The console"): its own certificate as the client's and, when the server takes tokens, a
        token of its own principal made for this process (``ServerSecurity.own_token``), so that
        the broker names it the same with or without ``tls_client_ca``; the server's certificate
        is checked for ``advertised_host`` when that is set."""
        tls = self.security.peer_tls()
        if not tls.secure:
            return tls
        principal = self.own_principal()
        token = self.security.own_token(principal) if principal else None
        name = self.security.settings.advertised_host
        return dataclasses.replace(tls, token=token, server_name=name or tls.server_name)

    def warnings(self) -> list[str]:
        """What keeps the console from serving anyone, said once at start."""
        security = self.security
        if not security.settings.authentication_required:
            return []
        mutual = security.tls is not None and security.tls.mutual
        if not self.accepts_tokens and not mutual:
            return [
                "the console can sign nobody in: the server requires credentials but takes no "
                "tokens (tokens_file) and asks no client certificate (tls_client_ca)"
            ]
        own = self.own_principal()
        if own is None or not self.guard.policy.allows(own, on(Operation.ADMIN, Kind.CLUSTER)):
            return [
                f"the console calls the broker as the server's own principal "
                f"({own or 'none: no certificate'}), which the ACL does not make a super-user: "
                f"its pages will be refused (add it to super_users; docs/security.md)"
            ]
        return []


ConsoleFactory = Callable[[str, ServerGate], Starlette]
"""(gRPC address host:port, the server's gate) -> the console's ASGI app."""

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class _Asgi:
    """An ASGI callable as an object, so Starlette routes to it as an app (a plain function
    would be taken for a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def http_app(
    registry: CollectorRegistry | None,
    console: Starlette | None,
    gate: ServerGate | None = None,
) -> Starlette:
    """``/metrics`` from ``registry`` (when given; behind ``gate``'s credentials when the server
    requires them, ``metrics_http.py``), and ``console`` (when given) at ``/``."""
    routes: list[BaseRoute] = []
    if registry is not None:
        routes.append(Route("/metrics", _Asgi(GuardedMetrics(registry, gate))))
    if console is None:
        return Starlette(routes=routes)
    routes.append(Mount("/", app=console))
    # A mounted app's startup and shutdown do not run by themselves: the console's (its client,
    # its sampler) run as the port's.
    return Starlette(routes=routes, lifespan=console.router.lifespan_context)


class _PeerCertificateProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, handing each request of a mutual-TLS connection the client
    certificate the handshake verified (uvicorn puts none in the scope)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        certificate = transport.get_extra_info("peercert")
        if certificate:
            app = self.app

            async def with_certificate(scope: Any, receive: Any, send: Any) -> None:
                scope.setdefault("extensions", {})[PEER_CERTIFICATE] = certificate
                await app(scope, receive, send)

            self.app = with_certificate


class HttpEndpoint:
    """``bind``, then ``start`` once the gRPC port is known, then ``close``. ``registry``:
    serve ``/metrics``; ``console``: serve the console at ``/``; ``security``: the server's,
    for TLS and the console's gate."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        console: ConsoleFactory | None,
        security: ServerSecurity | None = None,
        setting: str = "--metrics-port (TIDELOG_METRICS_PORT, or metrics_port in the config file)",
    ) -> None:
        self.registry = registry
        self.console = console
        self.security = security
        self.setting = setting
        self.port = 0
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self, host: str, port: int) -> int:
        """Bind the port and return it. Raises ``OSError`` naming the address and the setting
        when it cannot be bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except OSError as error:
            sock.close()
            raise OSError(
                error.errno,
                f"cannot serve {self._serves()} on {host}:{port}: "
                f"{error.strerror or error}; choose another {self.setting}, or 0 to turn "
                f"{self._serves()} off",
            ) from None
        sock.setblocking(False)
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        return self.port

    def _serves(self) -> str:
        return " and ".join(
            what
            for what, on in (("metrics", self.registry), ("the console", self.console))
            if on is not None
        )

    def start(self, grpc_address: str) -> None:
        """Serve the bound port on a thread; returns once it answers."""
        assert self._socket is not None, "bind first"
        console = None
        security = self.security
        gate = ServerGate(security, self.port) if security is not None else None
        if self.console is not None:
            assert gate is not None, "the console needs the server's security"
            for warning in gate.warnings():
                LOG.warning("%s", warning)
            console = self.console(grpc_address, gate)
        tls = security.tls if security is not None else None
        tls_options: dict[str, Any] = {}
        if tls is not None:
            context = tls.ssl_context()  # the one a reload refills: served as it is

            def served_context(_config: uvicorn.Config, _default: Any) -> ssl.SSLContext:
                return context

            tls_options = {"ssl_context_factory": served_context, "http": _PeerCertificateProtocol}
        config = uvicorn.Config(
            http_app(self.registry, console, gate),
            loop="asyncio",
            lifespan="on" if console is not None else "off",
            log_config=None,  # leave the server's logging as configured
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            **tls_options,
        )
        server = uvicorn.Server(config)
        sockets = [self._socket]
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=sockets)),
            name="tidelog-http",
            daemon=True,
        )
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._server, self._thread = server, thread
        if not server.started:
            self.close()
            raise OSError(f"the HTTP port {self.port} did not start serving")

    def close(self) -> None:
        """Stop serving and release the port (idempotent). A mounted app that set
        ``state.before_shutdown`` (the console: it ends its live tails) is told first, so open
        streams end by themselves rather than be cancelled after the grace time."""
        if self._server is not None:
            app = self._server.config.app
            for route in getattr(app, "routes", ()):
                state = getattr(getattr(route, "app", None), "state", None)
                hook = getattr(state, "before_shutdown", None)
                if callable(hook):
                    hook()
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
