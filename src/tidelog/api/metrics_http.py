"""``/metrics`` behind the server's credentials: with an ACL or a tokens file, a scraper names
itself as any client does (a bearer token over TLS, or the client certificate of a mutual-TLS
port) and sees only the samples of streams and sites it may see; without credentials it gets
401, or, when the server admits anonymous callers (``allow_anonymous``), what the ACL lets
``anonymous`` see. With neither (the default) the endpoint is Prometheus' own, unchanged.

Prometheus sends a token with ``authorization: {credentials: …}`` (or ``bearer_token_file``) and
a client certificate with ``tls_config``; ``docs/security.md`` shows both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from tidelog.access import ALLOW_ALL, Guard, Kind, Resource
from tidelog.errors import Unauthenticated

PEER_CERTIFICATE = "tidelog.peer_certificate"

_FILTERED_LABELS = (("stream", Kind.STREAM), ("site", Kind.SITE))


class ScrapeGate(Protocol):
    """What ``/metrics`` asks of the server (``http.ServerGate`` gives it)."""

    @property
    def guard(self) -> Guard: ...
    @property
    def login_required(self) -> bool: ...
    def identify(self, authorization: str | None, certificate: Any) -> str:
        """The scraper's principal, as the gRPC port would name a caller with the same
        credentials (:class:`~tidelog.errors.Unauthenticated` likewise)."""
        ...


class _Visible:
    """``registry``'s samples an identity may see (a collector for ``generate_latest``)."""

    def __init__(self, registry: CollectorRegistry, guard: Guard, identity: str) -> None:
        self.registry, self.guard, self.identity = registry, guard, identity

    def collect(self) -> Iterator[Metric]:
        seen: dict[tuple[Kind, str], bool] = {}

        def visible(labels: dict[str, str]) -> bool:
            for label, kind in _FILTERED_LABELS:
                name = labels.get(label)
                if name is None:
                    continue
                key = (kind, name)
                if key not in seen:
                    seen[key] = self.guard.may_see(self.identity, Resource(kind, name))
                if not seen[key]:
                    return False
            return True

        for family in self.registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if visible(s.labels)]
            yield kept


class GuardedMetrics:
    """The ``/metrics`` ASGI app (module docstring)."""

    def __init__(self, registry: CollectorRegistry, gate: ScrapeGate | None) -> None:
        self.registry = registry
        self.gate = gate
        self._open = make_asgi_app(registry)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        gate = self.gate
        open_to_all = gate is None or (gate.guard.policy is ALLOW_ALL and not gate.login_required)
        if open_to_all or scope.get("type") != "http":
            await self._open(scope, receive, send)
            return
        assert gate is not None
        try:
            identity = gate.identify(_header(scope, b"authorization"), _certificate(scope))
        except Unauthenticated as error:
            problem = f"{error}\n".encode()
            await _answer(send, 401, problem, (b"www-authenticate", b'Bearer realm="tidelog"'))
            return
        body = generate_latest(_Visible(self.registry, gate.guard, identity))
        await _answer(send, 200, body, content_type=CONTENT_TYPE_LATEST.encode())


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode(errors="replace"))
    return None


def _certificate(scope: Any) -> Any:
    return scope.get("extensions", {}).get(PEER_CERTIFICATE)


async def _answer(
    send: Any,
    status: int,
    body: bytes,
    *extra: tuple[bytes, bytes],
    content_type: bytes = b"text/plain; charset=utf-8",
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
