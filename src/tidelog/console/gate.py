"""The console's gate: every request passes it before any page, action or asset.

In order, for each HTTP request (:class:`GateMiddleware`):

1. the ``Host`` header must be one of :attr:`Gate.hosts` (``console_hosts``), else 421 with a page
   naming the setting. A page served under another name is what DNS rebinding needs: a site the
   attacker owns, whose name resolves to this console, then reads and acts with the browser;
2. the visitor is identified (:class:`~tidelog.console.sessions.Via`): a session opened by signing
   in with a token, else the connection's client certificate (mutual TLS), else nobody, which is
   enough only while the server asks no credentials (:attr:`Gate.login_required` false: no
   tokens_file, no acl_file). A visitor nobody knows is sent to ``/login``; only the login page
   and the assets are served to it;
   A session opened for a request that would not have carried the cookie (a cross-site one
   other than a top-level GET navigation, :func:`carries_the_cookie`) serves that request only:
   its cookie would replace the visitor's;
3. every response carries the headers of :data:`SECURITY_HEADERS` (no framing, no inline script,
   no sniffing, no referrer to other sites) and, except the assets, ``Cache-Control: no-store``.

The CSRF token every action checks is the session's (``sessions.py``); each browser gets a session
on its first page, before it can see a form.

What the console asks of the server is the :class:`Gate` protocol: the server's live guard (a
SIGHUP reload replaces it), its tokens, its principal rules for certificates. ``tidelog serve``
hands its own (``tidelog.api.http``); :class:`OpenGate` is a console without any.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidelog.access import ANONYMOUS, Guard
from tidelog.console.sessions import Session, Sessions, Via

PEER_CERTIFICATE: Final = "tidelog.peer_certificate"
"""The scope extension under which the HTTP server puts the connection's verified client
certificate (``ssl.SSLSocket.getpeercert()``'s dictionary), when there is one."""

LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; base-uri 'none'; object-src 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    # "same-origin", not "no-referrer": under no-referrer a browser sends `Origin: null` with
    # the console's own form posts, which the action check refuses.
    ("referrer-policy", "same-origin"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
)
"""Sent with every response of the console, assets included."""

LOGIN_PATH: Final = "/login"
OPEN_PREFIXES: Final = ("/login", "/static/")
"""Served to a visitor nobody has identified yet."""


class Gate(Protocol):
    """What the console needs to know of the server it fronts (module docstring)."""

    @property
    def guard(self) -> Guard:
        """The server's guard as it is now (read for each request: a reload replaces it)."""
        ...

    @property
    def login_required(self) -> bool:
        """Whether a visitor must be identified (the server requires credentials)."""
        ...

    @property
    def accepts_tokens(self) -> bool:
        """Whether the login page can take a token (the server has a tokens file)."""
        ...

    @property
    def host_names(self) -> tuple[str, ...]:
        """The names the console is served under (``console_hosts``: ``name`` for that name on
        the console's port, ``name:port`` as it is); empty: :func:`default_host_names`."""
        ...

    @property
    def bound_host(self) -> str:
        """The address the console's port is bound to."""
        ...

    @property
    def port(self) -> int:
        """The console's port."""
        ...

    @property
    def secure(self) -> bool:
        """Whether the console is served over TLS (its cookie is then ``Secure``)."""
        ...

    def principal_of_token(self, token: str) -> str | None:
        """The principal a token stands for now; None when it is unknown or revoked."""
        ...

    def principal_of_peer(self, certificate: Mapping[str, Any]) -> str | None:
        """The principal of a verified client certificate; None when it names none."""
        ...


@dataclass(frozen=True)
class OpenGate:
    """A console without login, acting with its own client's credentials: ``tidelog console``,
    and a server with neither tokens nor an ACL."""

    port: int = 80
    host_names: tuple[str, ...] = ()
    bound_host: str = "127.0.0.1"
    guard: Guard = field(default_factory=Guard)
    secure: bool = False
    login_required: bool = False
    accepts_tokens: bool = False

    def principal_of_token(self, token: str) -> str | None:
        return None

    def principal_of_peer(self, certificate: Mapping[str, Any]) -> str | None:
        return None


# -- the Host allow-list ---------------------------------------------------------------------------


def host_name(host: str) -> str:
    """How a bound address appears in a ``Host`` header: IPv6 in brackets; "" for a wildcard
    address (no browser asks for it)."""
    host = host.strip().lower()
    if host in ("", "0.0.0.0", "::", "[::]"):
        return ""
    if ":" in host and not host.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return host
        return f"[{host}]"
    return host


def _has_port(name: str) -> bool:
    return name.rsplit("]", 1)[-1].count(":") == 1 if name.startswith("[") else ":" in name


def allowed_hosts(names: Iterable[str], port: int, secure: bool = False) -> frozenset[str]:
    """The ``Host`` values served: each name with ``port`` (a name that gives its own port is
    kept as it is), and the bare name too when ``port`` is the scheme's default (a browser then
    omits it)."""
    default_port = 443 if secure else 80
    hosts: set[str] = set()
    for raw in names:
        name = host_name(raw)
        if not name:
            continue
        if _has_port(name):
            hosts.add(name)
            continue
        hosts.add(f"{name}:{port}")
        if port == default_port:
            hosts.add(name)
    return frozenset(hosts)


def default_host_names(bound_host: str) -> tuple[str, ...]:
    """``console_hosts`` when it is not set: the loopback names and the bound host."""
    bound = host_name(bound_host)
    return LOOPBACK_NAMES + ((bound,) if bound and bound not in LOOPBACK_NAMES else ())


# -- the middleware --------------------------------------------------------------------------------

Refusal = Callable[[Request, int, str, str], Response]
"""(request, status, title, detail) -> the console's page saying so."""


def session_of(request: Request) -> Session | None:
    """The request's session (set by the gate); None for an asset."""
    session: Session | None = getattr(request.state, "session", None)
    return session


def principal_of(request: Request) -> str:
    session = session_of(request)
    return session.principal if session is not None and session.principal else ANONYMOUS


class Keeper:
    """The sessions of one console and how a request finds its own (module docstring)."""

    def __init__(
        self, gate: Gate, signed_in: Sessions | None = None, visitors: Sessions | None = None
    ) -> None:
        self.gate = gate
        names = gate.host_names or default_host_names(gate.bound_host)
        self.hosts = allowed_hosts(names, gate.port, gate.secure)
        """The ``Host`` header values served."""
        self.signed_in = signed_in or Sessions()
        """Sessions opened by signing in with a token."""
        self.visitors = visitors or Sessions()
        """Everyone else's (a store apart: opening many of these never ends a signed-in one)."""
        # Under TLS the __Host- prefix: the browser takes the cookie only from this origin over
        # TLS, with Path=/ and no Domain (no sibling host can plant one).
        self.cookie = "__Host-tidelog_console" if gate.secure else "tidelog_console"

    def identify(self, request: Request) -> tuple[Session, bool]:
        """The request's session, and whether it was opened now (its cookie is then sent)."""
        cookie = request.cookies.get(self.cookie)
        gate = self.gate
        signed_in = self.signed_in.find(cookie)
        if signed_in is not None:
            # A reload that revoked the token ends the session at its next request.
            if signed_in.token and gate.principal_of_token(signed_in.token) == signed_in.principal:
                return signed_in, False
            self.signed_in.close(cookie)
        certificate = request.scope.get("extensions", {}).get(PEER_CERTIFICATE)
        peer = gate.principal_of_peer(certificate) if certificate else None
        principal: str | None = peer
        via = Via.CERTIFICATE
        if peer is None:
            principal, via = (None if gate.login_required else ANONYMOUS), Via.OPEN
        visitor = self.visitors.find(cookie)
        if visitor is not None and visitor.principal == principal and visitor.via is via:
            return visitor, False
        self.visitors.close(cookie)
        return self.visitors.open(principal, via), True

    def sign_in(self, request: Request, token: str) -> Session | None:
        """A new session for the token's principal, ending the visitor's session (a new id on
        signing in: an id planted before cannot be ridden); None for an unknown token."""
        principal = self.gate.principal_of_token(token)
        if principal is None:
            return None
        self.visitors.close(request.cookies.get(self.cookie))
        return self.signed_in.open(principal, Via.TOKEN, token)

    def sign_out(self, request: Request) -> None:
        cookie = request.cookies.get(self.cookie)
        self.signed_in.close(cookie)
        self.visitors.close(cookie)

    def cookie_for(self, session: Session | None) -> str:
        """The ``Set-Cookie`` value for ``session``; None: the cookie cleared."""
        value = session.id if session is not None else ""
        # Lax, not Strict: a link to the console followed from another site (chat, a dashboard)
        # must carry the cookie, else the visit opens a new session whose cookie replaces the
        # signed-in one. Actions stay another site's to forge only with the CSRF token (and
        # past the Origin check); a cross-site POST still arrives without the cookie.
        cookie = f"{self.cookie}={value}; Path=/; HttpOnly; SameSite=Lax"
        if session is None:
            cookie += "; Max-Age=0"
        return cookie + ("; Secure" if self.gate.secure else "")


class GateMiddleware:
    """The gate as ASGI middleware (module docstring)."""

    def __init__(self, app: ASGIApp, keeper: Keeper, refuse: Refusal) -> None:
        self.app = app
        self.keeper = keeper
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = request.url.path
        asset = path.startswith("/static/")
        send = _with_headers(send, no_store=not asset)
        host = request.headers.get("host", "").lower()
        hosts = self.keeper.hosts
        if host not in hosts:
            names = ", ".join(sorted(hosts)) or "none"
            response = self.refuse(
                request,
                421,
                "This console is not served under that name",
                f"The address {host or '(none)'} is not one this console answers to ({names}). "
                f"Open the console by one of those names, or add this one to the server's "
                f"console_hosts setting (TIDELOG_CONSOLE_HOSTS; `tidelog console --allow-host` "
                f"for a standalone console).",
            )
            await response(scope, receive, send)
            return
        session: Session | None = None
        if not asset:  # assets load in parallel with the first page: no session of their own
            session, opened = self.keeper.identify(request)
            scope.setdefault("state", {})["session"] = session
            if opened and carries_the_cookie(request):
                send = _with_cookie(send, self.keeper.cookie_for(session))
        unknown = session is None or session.principal is None
        if unknown and not asset and not path.startswith(OPEN_PREFIXES):
            await self._to_login(request)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _to_login(self, request: Request) -> Response:
        if request.method in ("GET", "HEAD"):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{LOGIN_PATH}?next={quote(target, safe='')}", 303)
        return self.refuse(
            request, 401, "Sign in first", "This console acts only for a signed-in user."
        )


def carries_the_cookie(request: Request) -> bool:
    """Whether the browser would have sent the (``SameSite=Lax``) session cookie with this request
    had it one: every request but a cross-site one (``Sec-Fetch-Site``), and of those only a
    top-level navigation by GET. Any other arrives without it even when the browser is signed in,
    so a new session's cookie is not sent with its answer: it would replace the signed-in one (a
    page of another site posting a form would sign the visitor out)."""
    headers = request.headers
    if headers.get("sec-fetch-site") != "cross-site":
        return True
    return (
        request.method in ("GET", "HEAD")
        and headers.get("sec-fetch-mode") == "navigate"
        and headers.get("sec-fetch-dest", "document") == "document"
    )


def _with_headers(send: Send, *, no_store: bool) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [
                (k, v)
                for k, v in message.get("headers", [])
                if not (no_store and k.lower() == b"cache-control")
            ]
            headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS]
            if no_store:
                headers.append((b"cache-control", b"no-store"))
            message = {**message, "headers": headers}
        await send(message)

    return sending


def _with_cookie(send: Send, cookie: str) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
            message = {**message, "headers": headers}
        await send(message)

    return sending
