"""What the native transport refuses to let one client cost it, and the small tools that say so.

The bounds of one connection: :data:`CONNECTION_PENDING` response bytes held for it, not yet
sent; :data:`RECEIVE_BUDGET` request bytes received, not yet taken (:class:`ReceiveBudget`);
PINGs and SETTINGS with nothing else between (:class:`Strikes`, :data:`PING_STRIKES`).
They are enforced where the thing bounded lives (``connection.py``, ``call.py``,
``server.py``); this module holds what they share, and the rate-limited log line a misbehaving
or broken connection leaves (:class:`RateLimited`: one line per interval, the rest counted, so
a client cannot fill the log).

Invariants: a :class:`RateLimited` logs at most one line per ``interval`` seconds, whatever the
number of calls; the first line after a quiet spell says how many were not logged. A
:class:`Strikes` counts only frames less than :data:`STRIKE_INTERVAL_S` apart with no other
traffic between (``clear``).
"""

from __future__ import annotations

import logging
import time
from typing import Final, Protocol

CONNECTION_PENDING: Final = 8 << 20
"""Response bytes the calls of one connection may hold, not yet sent, before their writes wait
(``call.py``): what a client that opens streams and never reads pins, whatever their number.
Eight calls at their own high-water mark (``call.HIGH_WATER``, 1 MiB) fit."""

RECEIVE_BUDGET: Final = 16 << 20
"""Request bytes the calls of one connection may hold, received but not yet taken by their
handlers (decoded requests and the parts of messages still arriving), before stream windows
stop being reopened (``call.py``). One message in progress at a time may grow past it (up to
the server's message limit), so a single request larger than the budget is still received."""


class Receiver(Protocol):
    """What :class:`ReceiveBudget` needs of a call."""

    @property
    def stream_id(self) -> int: ...

    @property
    def finished(self) -> bool: ...

    @property
    def in_message(self) -> bool:
        """Whether part of a request has arrived and the rest has not."""
        ...

    def retry(self) -> None:
        """Ask again (:meth:`ReceiveBudget.may_receive`) for the window owed, if any."""


class ReceiveBudget:
    """The request bytes one connection's calls hold against :data:`RECEIVE_BUDGET`.

    Under the budget every call may have its stream's window reopened; past it, one call in
    the middle of a message (``big``) may, until that message is in, and the others are held
    back and asked again (``Receiver.retry``) once it is, or once the handlers have taken the
    connection under the budget."""

    __slots__ = ("_held_back", "big", "limit", "received")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.received = 0
        self.big: int | None = None
        self._held_back: dict[int, Receiver] = {}

    def may_receive(self, call: Receiver) -> bool:
        sid = call.stream_id
        if self.received <= self.limit or self.big == sid:
            return True
        if self.big is None and call.in_message:
            self.big = sid
            return True
        self._held_back[sid] = call
        return False

    def held(self, call: Receiver, size: int) -> None:
        """``call`` holds ``size`` more request bytes (negative: fewer)."""
        self.received += size
        if call.finished:
            self._held_back.pop(call.stream_id, None)
        if self.big == call.stream_id and not call.in_message:
            self.big = None
            self._retry()
        elif size < 0 and self.received <= self.limit:
            self._retry()

    def _retry(self) -> None:
        if self._held_back:
            held_back, self._held_back = self._held_back, {}
            for call in held_back.values():
                call.retry()


MAX_CONNECTIONS: Final = 4096
"""Connections one native server serves at once by default (``grpc_max_connections``)."""

PREFACE_TIMEOUT_S: Final = 10.0
"""How long a new connection may take over its TLS handshake, and then over the HTTP/2 preface
and first SETTINGS, before it is closed."""

REFUSED_LOG_INTERVAL_S: Final = 10.0
"""At most one WARNING per this many seconds for connections refused over the cap."""

UNEXPECTED_LOG_INTERVAL_S: Final = 60.0
"""At most one WARNING (with its traceback) per this many seconds for errors no code path
expected on a connection (each closes that connection only)."""


class RateLimited:
    """One log line per interval, the rest counted (module docstring)."""

    def __init__(self, log: logging.Logger, interval: float) -> None:
        self.log = log
        self.interval = interval
        self._next = 0.0
        self.suppressed = 0

    def warn(self, message: str, *args: object, traceback: bool = True) -> bool:
        """Log ``message`` at WARNING (with the exception being handled when ``traceback``)
        unless one was logged less than ``interval`` seconds ago; whether it was logged."""
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.interval
        suppressed, self.suppressed = self.suppressed, 0
        if suppressed:
            message += f" ({suppressed} more like it not logged)"
        self.log.warning(message, *args, exc_info=traceback)
        return True


PING_STRIKES: Final = 10
"""PINGs (and, apart, SETTINGS frames) a client may send each less than
:data:`STRIKE_INTERVAL_S` after the previous one with no other traffic between (no HEADERS or
DATA either way) before the connection is closed with GOAWAY ENHANCE_YOUR_CALM
``too_many_pings``, as grpc-core's servers do. grpc clients ping with data (BDP) or every 10 s
or more (keepalive), so they never come near it."""

STRIKE_INTERVAL_S: Final = 1.0


class Strikes:
    """Frames of one kind with nothing else between them, arriving too fast (module
    docstring, :data:`PING_STRIKES`)."""

    __slots__ = ("_last", "count")

    def __init__(self) -> None:
        self.count = 0
        self._last = float("-inf")

    def hit(self, now: float) -> bool:
        """One more such frame at ``now``; True when the client is over the limit."""
        if now - self._last < STRIKE_INTERVAL_S:
            self.count += 1
        self._last = now
        return self.count > PING_STRIKES

    def clear(self) -> None:
        """Other traffic: what came before is forgiven."""
        self.count = 0
        self._last = float("-inf")
