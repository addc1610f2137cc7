"""``ClientSettings``: how a client connects, reconnects and retries, with every default in one
place.

Two mechanisms work together when the server goes away and comes back:

- **Reconnecting** is gRPC's: the channel notices the lost connection and tries to connect again
  after a backoff (``reconnect_initial_s``, growing by 1.6 per failed attempt, ±20 % jitter, up
  to ``reconnect_max_s``). gRPC's defaults (1 s growing to 120 s) are for fleets of clients
  behind load balancers; they left a tidelog client failing for seconds after its server was
  back. The cap bounds that wait: once the server listens again, the next connection attempt
  comes within 1.2 times ``reconnect_max_s`` (the jitter).
- **Retrying** is the client's (``tidelog.client.retry``): a call that is safe to repeat and
  failed with UNAVAILABLE waits for the channel to be ready again and is sent again, for at most
  ``retry_budget_s`` (or the call's own ``timeout``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.security import ClientTls
from tidelog.wire import MAX_FRAME


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Pass as ``AsyncClient(server, settings=...)`` or ``Client(server, settings=...)``."""

    reconnect_initial_s: float = 0.1
    """First wait before reconnecting after a failed connection attempt
    (``grpc.initial_reconnect_backoff_ms``; gRPC's default is 1 s)."""

    reconnect_max_s: float = 0.25
    """Cap of the reconnect backoff (``grpc.max_reconnect_backoff_ms``; gRPC's default is 120 s).
    It bounds how late a client notices its server is back. The price of a small cap is more
    connection attempts while the server is down: at most about 1 / ``reconnect_max_s`` per
    second per client (4 by default). Each is a refused TCP connect, a few microseconds on
    loopback and one SYN/RST pair across a network; raise it for thousands of clients per
    server or for servers reached over slow links."""

    connect_timeout_s: float = 20.0
    """How long one connection attempt (TCP and HTTP/2 handshake) may take. gRPC names this
    ``grpc.min_reconnect_backoff_ms`` although it is not a backoff: it is the minimum connect
    deadline (``MIN_CONNECT_TIMEOUT`` in gRPC's connection-backoff spec, floored at 100 ms).
    Setting it as small as the backoff would make connecting to a distant server fail, so it
    keeps gRPC's 20 s and is spelled out here to stop that mistake."""

    retry_budget_s: float = 10.0
    """How long a retryable call keeps retrying, from its start, when it has no ``timeout`` of
    its own (with one, the timeout is the budget). 0 disables retrying."""

    retry_first_backoff_s: float = 0.05
    """Pause before the first retry; doubled after each further failed attempt."""

    retry_max_backoff_s: float = 1.0
    """Cap of the pause between retries. The pause only spaces attempts against a server that
    accepts connections and still answers UNAVAILABLE (one shutting down); while it does not
    listen at all, a retry waits for the channel to connect instead (``reconnect_max_s``)."""

    ack_all: bool = False
    """Publishes are acknowledged only once every in-sync replica of the partition holds them
    (ack policy ALL: in a cluster, a leader's crash then loses no acknowledged message; on one
    broker, once they are synced to disk). False: once the leader has them (LEADER)."""

    channel_options: tuple[tuple[str, str | int], ...] = ()
    """More gRPC channel arguments, appended last, so they win. Keepalive, for instance
    (``("grpc.keepalive_time_ms", 60_000)``), detects a server host that vanished without closing
    its connections; the server must then allow pings that often, or it closes the connection
    with ``too_many_pings`` (gRPC servers accept one ping per 5 minutes without calls by
    default)."""

    tls: ClientTls = field(default_factory=ClientTls)
    """TLS and credentials: the server's CA, a client certificate and key (mutual TLS), a bearer
    token (sent only over TLS). Default: plaintext, no credentials. :meth:`from_env` reads them
    from ``TIDELOG_TLS_CA``, ``TIDELOG_TLS_CERT``, ``TIDELOG_TLS_KEY``, ``TIDELOG_TOKEN``."""

    @classmethod
    def from_env(cls, **given: object) -> ClientSettings:
        """Settings with ``given`` values, and TLS and credentials from the environment when not
        given (``tls``): the variables the CLI reads too."""
        if "tls" not in given:
            given["tls"] = tls_from(environ=os.environ)
        return cls(**given)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if not 0 < self.reconnect_initial_s <= self.reconnect_max_s:
            raise ValueError(
                f"need 0 < reconnect_initial_s <= reconnect_max_s, got "
                f"{self.reconnect_initial_s} and {self.reconnect_max_s}"
            )
        if self.connect_timeout_s < 0.1:
            raise ValueError(f"connect_timeout_s must be >= 0.1, not {self.connect_timeout_s}")
        if self.retry_budget_s < 0:
            raise ValueError(f"retry_budget_s must be >= 0, not {self.retry_budget_s}")
        if not 0 < self.retry_first_backoff_s <= self.retry_max_backoff_s:
            raise ValueError(
                f"need 0 < retry_first_backoff_s <= retry_max_backoff_s, got "
                f"{self.retry_first_backoff_s} and {self.retry_max_backoff_s}"
            )

    def grpc_options(self) -> list[tuple[str, str | int]]:
        """The channel arguments for ``grpc.aio.insecure_channel``."""
        return [
            ("grpc.max_receive_message_length", MAX_FRAME),
            ("grpc.max_send_message_length", MAX_FRAME),
            ("grpc.initial_reconnect_backoff_ms", _ms(self.reconnect_initial_s)),
            ("grpc.max_reconnect_backoff_ms", _ms(self.reconnect_max_s)),
            ("grpc.min_reconnect_backoff_ms", _ms(self.connect_timeout_s)),
            *self.channel_options,
        ]


def tls_from(
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    token: str | None = None,
    *,
    environ: dict[str, str] | os._Environ[str] | None = None,
) -> ClientTls:
    """A :class:`ClientTls` from paths and a token, each defaulting to its environment variable
    (``TIDELOG_TLS_CA``, ``TIDELOG_TLS_CERT``, ``TIDELOG_TLS_KEY``, ``TIDELOG_TOKEN``) when
    ``environ`` is given."""
    env = environ or {}

    def path(value: str | Path | None, variable: str) -> Path | None:
        chosen = value if value is not None else env.get(variable) or None
        return Path(chosen) if chosen is not None else None

    return ClientTls(
        ca=path(ca, "TIDELOG_TLS_CA"),
        cert=path(cert, "TIDELOG_TLS_CERT"),
        key=path(key, "TIDELOG_TLS_KEY"),
        token=token if token is not None else env.get("TIDELOG_TOKEN") or None,
    )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


__all__ = ["ClientSettings", "tls_from"]
