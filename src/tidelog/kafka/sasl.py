"""SASL on the Kafka listener: ``SaslHandshake`` (v0-v1) and ``SaslAuthenticate`` (v0-v2), with
the mechanisms PLAIN and SCRAM-SHA-256, whose password is a tidelog token.

Who a login names. PLAIN carries a user name and a password: the password must be a token of
the tokens file, and the user name the principal that token stands for (anything else is
``SASL_AUTHENTICATION_FAILED``). SCRAM-SHA-256 (``tidelog.security.scram``) proves knowledge of
the token without sending it, against keys stored beside the token's hash
(``tidelog token create --scram``); the user name is the principal. Where the connection also
presented a client certificate, the SASL login names the principal (as a bearer token wins over
a certificate on the gRPC port).

Theory of operation, per connection:

- a ``SaslHandshake`` names a mechanism. It is refused (and the connection closed after the
  answer) on a plaintext connection (``ILLEGAL_SASL_STATE``: SASL needs TLS, as bearer tokens
  do; the log line says so), when the listener offers no SASL or not that mechanism
  (``UNSUPPORTED_SASL_MECHANISM`` with the offered list), after a login, and after any request
  other than ``ApiVersions`` (``ILLEGAL_SASL_STATE``);
- then the mechanism's messages: in ``SaslAuthenticate`` requests after a handshake v1, as bare
  size-prefixed frames after a handshake v0 (Kafka before 1.0); PLAIN takes one, SCRAM two;
- a failed step answers ``SASL_AUTHENTICATION_FAILED`` with its reason (a v0 exchange has no
  room for one: the connection just closes), and the connection is closed, as Kafka does. So a
  connection gets one attempt, and holds one exchange at most; before its login a connection's
  frames are capped at :data:`UNAUTHENTICATED_MAX_BYTES` and its login must end within
  :data:`LOGIN_TIMEOUT_S` (``serving.py``);
- a completed login sets the session's identity and lets every api through. Sessions are never
  re-authenticated (``session_lifetime`` 0), but a reload of the tokens file ends each
  connection whose token was revoked (:func:`still_admitted`, asked by the listener).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.kafka.protocol import SIZE, Request, answer
from tidelog.kafka.session import Session
from tidelog.security import Authenticator, TokenStore
from tidelog.security.scram import MECHANISM as SCRAM_SHA_256
from tidelog.security.scram import ScramExchange, ScramFailure
from tidelog.security.tokens import digest

LOG = logging.getLogger("tidelog.kafka")

PLAIN: Final = "PLAIN"
MECHANISMS: Final = (PLAIN, SCRAM_SHA_256)
"""The mechanisms this module serves (``kafka_sasl_mechanisms`` picks among them)."""
UNAUTHENTICATED_MAX_BYTES: Final = 512 * 1024
"""The largest frame a connection may send before its login (Kafka's
``sasl.server.max.receive.size``)."""
LOGIN_TIMEOUT_S: Final = 30.0
"""How long a connection that must log in may take to (from its first byte)."""
_EXCHANGE: Final = "sasl.exchange"
_LOGIN: Final = "sasl.login"


@dataclass(frozen=True, slots=True)
class Login:
    """A completed SASL login: who, how, and with which token (its hash, never the token)."""

    mechanism: str
    principal: str
    digest: str


@dataclass(slots=True)
class _Exchange:
    mechanism: str
    raw: bool
    """After a handshake v0: the mechanism's messages come as bare size-prefixed frames."""
    scram: ScramExchange | None = None


class _Failed(Exception):
    """A SASL step that does not log in; the message says why."""


async def handshake(session: Session, request: Request) -> Any:
    mechanism: str = request.body.mechanism
    offered = session.config.sasl_mechanisms
    if not session.secure:
        return _refuse(
            session,
            request,
            ErrorCode.illegal_sasl_state,
            (),
            f"SASL {mechanism} asked on a plaintext connection: refused, SASL needs TLS (its "
            f"password would cross the network readable: rotate it if this network is not "
            f"yours); use security.protocol=SASL_SSL with a server that has TLS (tls_cert, "
            f"tls_key) and kafka_sasl_mechanisms",
        )
    if not offered:
        return _refuse(
            session,
            request,
            ErrorCode.unsupported_sasl_mechanism,
            (),
            "SASL asked of a listener that offers none (kafka_sasl_mechanisms is empty): use "
            "security.protocol=SSL",
        )
    if _LOGIN in session.state or _EXCHANGE in session.state:
        return _refuse(
            session,
            request,
            ErrorCode.illegal_sasl_state,
            offered,
            "a second SASL handshake on one connection (re-authentication is not served)",
        )
    if session.settled:
        return _refuse(
            session,
            request,
            ErrorCode.illegal_sasl_state,
            offered,
            "a SASL handshake after other requests (SASL comes first on a connection)",
        )
    if mechanism not in offered:
        return _refuse(
            session,
            request,
            ErrorCode.unsupported_sasl_mechanism,
            offered,
            f"SASL mechanism {mechanism!r} is not offered (offered: {', '.join(offered)})",
        )
    session.state[_EXCHANGE] = _Exchange(mechanism, raw=request.version == 0)
    return answer(request, error_code=ErrorCode.none, mechanisms=offered)


def _refuse(
    session: Session,
    request: Request,
    error: ErrorCode,
    offered: tuple[str, ...],
    reason: str,
) -> Any:
    session.closing = reason
    return answer(request, error_code=error, mechanisms=offered)


async def authenticate(session: Session, request: Request) -> Any:
    exchange = session.state.get(_EXCHANGE)
    if not isinstance(exchange, _Exchange) or exchange.raw:
        reason = (
            "SaslAuthenticate after the login"
            if _LOGIN in session.state
            else "SaslAuthenticate without a SaslHandshake (v1) before it"
        )
        return _failed(session, request, ErrorCode.illegal_sasl_state, reason)
    try:
        reply = _step(session, exchange, request.body.auth_bytes)
    except _Failed as failure:
        return _failed(
            session,
            request,
            ErrorCode.sasl_authentication_failed,
            f"Authentication failed ({exchange.mechanism}): {failure}",
        )
    return answer(
        request,
        error_code=ErrorCode.none,
        error_message=None,
        auth_bytes=reply,
        session_lifetime=timedelta(0),
    )


def _failed(session: Session, request: Request, error: ErrorCode, message: str) -> Any:
    session.closing = message
    return answer(
        request,
        error_code=error,
        error_message=message,
        auth_bytes=b"",
        session_lifetime=timedelta(0),
    )


def in_raw_exchange(session: Session) -> bool:
    """Whether the connection's next frame is a bare SASL message (after a handshake v0)."""
    exchange = session.state.get(_EXCHANGE)
    return isinstance(exchange, _Exchange) and exchange.raw


def answer_raw(session: Session, frame: bytes) -> bytes | None:
    """The size-prefixed reply to a bare SASL message; None (and the session closing) when the
    step fails: a v0 exchange has no place for an error."""
    exchange = session.state[_EXCHANGE]
    try:
        reply = _step(session, exchange, frame)
    except _Failed as failure:
        session.closing = f"Authentication failed ({exchange.mechanism}, v0): {failure}"
        return None
    return SIZE.pack(len(reply)) + reply


def _step(session: Session, exchange: _Exchange, message: bytes) -> bytes:
    """One message of the exchange: the reply to send, the session logged in when it was the
    last one; :class:`_Failed` otherwise."""
    tokens = session.gate.authenticator.tokens  # the tokens of this moment (reloaded on SIGHUP)
    if exchange.mechanism == PLAIN:
        login, reply = _plain(tokens, message), b""
    else:
        try:
            if exchange.scram is None:
                exchange.scram = ScramExchange(tokens.scram if tokens is not None else {})
                return exchange.scram.first(message)
            reply = exchange.scram.final(message)
        except ScramFailure as failure:
            raise _Failed(str(failure)) from None
        login = Login(SCRAM_SHA_256, exchange.scram.user, exchange.scram.digest)
    del session.state[_EXCHANGE]
    session.state[_LOGIN] = login
    session.identity = login.principal
    session.authenticated = True
    LOG.info(
        "kafka connection from %s logged in as %s (SASL %s)",
        session.peer,
        login.principal,
        login.mechanism,
    )
    return reply


def _plain(tokens: TokenStore | None, message: bytes) -> Login:
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise _Failed("a PLAIN message is authzid NUL username NUL password")
    try:
        authzid, user, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        raise _Failed("the PLAIN message is not UTF-8") from None
    if authzid and authzid != user:
        raise _Failed("an authorization id other than the username is not supported")
    if tokens is None:
        raise _Failed("this server accepts no tokens (it has no tokens_file)")
    principal = tokens.principal_of(password)
    if principal is None:
        raise _Failed("unknown token as password (revoked, mistyped, or for another server)")
    if not hmac.compare_digest(principal.encode(), user.encode()):
        raise _Failed(f"username {user!r} is not the principal of this token")
    return Login(PLAIN, principal, digest(password))


def login_of(session: Session) -> Login | None:
    login = session.state.get(_LOGIN)
    return login if isinstance(login, Login) else None


def still_admitted(session: Session, authenticator: Authenticator) -> bool:
    """Whether the session's SASL login (if any) still holds under ``authenticator``'s tokens:
    its token's hash still names the same principal (and, for SCRAM, its keys are still
    there)."""
    login = login_of(session)
    if login is None:
        return True
    tokens = authenticator.tokens
    if tokens is None or tokens.principals.get(login.digest) != login.principal:
        return False
    if login.mechanism == SCRAM_SHA_256:
        user = tokens.scram.get(login.principal)
        return user is not None and login.digest in user.keys
    return True


SERVED: Final = (
    (17, "SaslHandshake", 0, 1, handshake),
    (36, "SaslAuthenticate", 0, 2, authenticate),
)
"""(api key, name, min version, max version, handler) of the SASL apis (``apis.py``)."""
