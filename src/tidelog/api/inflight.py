"""Bytes of publish requests in flight, bounded per connection and per principal.

A publish request is *in flight* from the moment its handler takes it until it is answered. Two
budgets hold it: its connection's (``context.peer()``, ``max_inflight_bytes_per_connection``) and
its principal's (``tidelog.access.caller().identity`` over all its connections,
``max_inflight_bytes_per_principal``). A request is admitted when both budgets have room for it,
or when its connection and principal hold nothing else (so a request larger than a budget is
served alone rather than never; gRPC's frame limit bounds its size).

Who has no principal budget (the connection's still applies): callers without credentials
(``ANONYMOUS``: with security off that is every client, and one shared budget would let two
slow clients refuse everyone else), and a publish another broker forwards (the ``FORWARDED``
header) from a principal granted ``cluster``: it was charged to its client's principal on the
broker it came in through, and one broker's identity must not be one budget for all of its
clients. The header alone exempts nothing (any client can send it); nor does ``cluster`` alone
(without an ACL every principal has it, and its own publishes keep their budget).

One publish stream reads ahead at most :data:`STREAM_READ_AHEAD` bytes (or one request) past
what it has answered, whatever room the budgets have: a client that does not read its acks
holds that much, not the whole of its connection's or principal's budget.

Refuse or wait? It depends on who holds the bytes while waiting.

- A **unary** publish (``Publish``, ``PublishToSubject``, ``PublishBatch``) that does not fit
  is refused at once with RESOURCE_EXHAUSTED naming the setting (``LimitReached``).
  gRPC has received and decoded the whole request before the handler runs: a handler that
  waited would keep those bytes alive while the client (or eight of them) send more, so waiting
  bounds nothing. Refusing frees them at once, before the copies an append makes; the client
  retries later, as it does for any RESOURCE_EXHAUSTED.
- A **publish stream** (``PublishAsync``, ``PublishStream``) waits instead: its handler reads the
  next request only once the one in hand fits, so the client's further requests stay in its
  HTTP/2 window, unread — real backpressure, costing at most one request per stream, and no
  request of a well-behaved stream is ever refused.

Budgets are counters keyed by connection and principal, dropped when they reach zero: a client
that connects, publishes and goes costs nothing afterwards. Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final, Protocol

from tidelog.access import ANONYMOUS, ANY, Kind, Operation, caller
from tidelog.errors import LimitReached
from tidelog.wire import FORWARDED

DEFAULT_INFLIGHT_BYTES_PER_CONNECTION: Final = 128 << 20
"""Two of the largest frames (64 MiB) one connection may have in flight."""
DEFAULT_INFLIGHT_BYTES_PER_PRINCIPAL: Final = 256 << 20
"""What one principal may have in flight over all its connections."""

STREAM_READ_AHEAD: Final = 16 << 20
"""Bytes one publish stream holds, read and not yet answered, at most (one request if larger)."""

PER_CONNECTION: Final = "max_inflight_bytes_per_connection"
PER_PRINCIPAL: Final = "max_inflight_bytes_per_principal"


class Sized(Protocol):
    def ByteSize(self) -> int: ...


class Peer(Protocol):
    def peer(self) -> str: ...

    def invocation_metadata(self) -> Iterable[Any] | None: ...


class InFlight:
    """The two budgets of one server (module docstring)."""

    def __init__(
        self,
        per_connection: int = DEFAULT_INFLIGHT_BYTES_PER_CONNECTION,
        per_principal: int = DEFAULT_INFLIGHT_BYTES_PER_PRINCIPAL,
    ) -> None:
        self.per_connection = per_connection
        self.per_principal = per_principal
        self.connections: dict[str, int] = {}
        self.principals: dict[str, int] = {}
        self._released = asyncio.Event()
        """Set (and replaced) whenever bytes are released: waiters check again."""
        self.refused = 0
        self.waited = 0
        """Counts, for tests and metrics."""

    def _over(self, peer: str, principal: str | None, size: int) -> str | None:
        """The setting ``size`` more bytes would go past, or None when they fit."""
        connection = self.connections.get(peer, 0)
        if connection and connection + size > self.per_connection:
            return PER_CONNECTION
        held = self.principals.get(principal, 0) if principal is not None else 0
        if held and held + size > self.per_principal:
            return PER_PRINCIPAL
        return None

    def _hold(self, peer: str, principal: str | None, size: int) -> None:
        self.connections[peer] = self.connections.get(peer, 0) + size
        if principal is not None:
            self.principals[principal] = self.principals.get(principal, 0) + size

    def _release(self, peer: str, principal: str | None, size: int) -> None:
        budgets = [(self.connections, peer)]
        if principal is not None:
            budgets.append((self.principals, principal))
        for held, key in budgets:
            left = held[key] - size
            if left:
                held[key] = left
            else:
                del held[key]
        self._notify()

    def _notify(self) -> None:
        released, self._released = self._released, asyncio.Event()
        released.set()

    @contextlib.asynccontextmanager
    async def admit(self, context: Peer, request: Sized) -> AsyncIterator[None]:
        """Hold a unary publish's bytes while it runs; ``LimitReached`` (nothing held) when
        they do not fit."""
        peer, principal, size = context.peer(), _budgeted(context), request.ByteSize()
        over = self._over(peer, principal, size)
        if over is not None:
            self.refused += 1
            limit = self.per_connection if over == PER_CONNECTION else self.per_principal
            whose = "this connection" if over == PER_CONNECTION else "this principal"
            raise LimitReached(
                over,
                f"publish of {size} bytes refused: {whose} has publishes in flight and this one "
                f"would take it past {limit} bytes; retry once they are answered",
            )
        self._hold(peer, principal, size)
        try:
            yield
        finally:
            self._release(peer, principal, size)

    def pacer(self, context: Peer) -> Pacer:
        """The budget of one publish stream, whose requests wait for room (module docstring)."""
        return Pacer(self, context.peer(), _budgeted(None))

    async def _wait_for_room(
        self, peer: str, principal: str | None, size: int, own: Callable[[], int]
    ) -> None:
        """Until ``size`` more bytes fit the budgets and the stream's read-ahead (``own()``:
        what the stream holds)."""
        if self._over(peer, principal, size) is None and _fits_ahead(own(), size):
            return
        self.waited += 1
        while self._over(peer, principal, size) is not None or not _fits_ahead(own(), size):
            await self._released.wait()


def _budgeted(unary: Peer | None) -> str | None:
    """The caller's principal when it has a principal budget, else None (module docstring);
    ``unary``: the call's context when it may be a forwarded publish."""
    current = caller()
    if current.identity == ANONYMOUS:
        return None
    forwarded = unary is not None and any(
        key == FORWARDED for key, _ in unary.invocation_metadata() or ()
    )
    if forwarded and current.may(Operation.CLUSTER, Kind.CLUSTER, ANY):
        return None
    return current.identity


def _fits_ahead(held: int, size: int) -> bool:
    return not held or held + size <= STREAM_READ_AHEAD


class Pacer:
    """One publish stream's requests in flight, in the order they were taken: ``take`` each
    request before it is processed (it waits for room), ``done(n)`` once the first ``n`` taken
    are answered, ``close()`` when the stream ends (whatever is still held is released)."""

    def __init__(self, budget: InFlight, peer: str, principal: str | None) -> None:
        self._budget = budget
        self._peer = peer
        self._principal = principal
        self._held: list[int] = []

    async def take(self, request: Sized) -> None:
        size = request.ByteSize()
        await self._budget._wait_for_room(self._peer, self._principal, size, self._holding)
        self._budget._hold(self._peer, self._principal, size)
        self._held.append(size)

    def _holding(self) -> int:
        return sum(self._held)

    def done(self, count: int) -> None:
        answered, self._held = self._held[:count], self._held[count:]
        if answered:
            self._budget._release(self._peer, self._principal, sum(answered))

    def close(self) -> None:
        self.done(len(self._held))
