"""Turns at the event loop for subscriptions that push messages to their clients.

Why. gRPC flow control stops a subscription's writes only once its client's HTTP/2 receive
window is full, and clients grow that window (BDP probing) to megabytes per stream whether or not
their application reads. Until it is full, a subscriber whose client never reads is, for the
server, a busy one: every message it is sent costs a turn of the one event loop (~100 µs through
grpc.aio). Each loop iteration runs every ready callback once, so with hundreds of such
subscribers a publisher's request waits behind hundreds of sends at each of its steps
(measured: 500 idle subscribers cut a publisher from ~85 to ~6 MB/s while their windows filled;
once full, they cost nothing).

Rule. A subscription sends a chunk (one batch it read, at most its byte budget) only while it
holds a turn; at most ``turns`` subscriptions hold one at once, and the others wait in order of
arrival. A holder reports each completed write (:meth:`Turn.progress`); one that makes no
progress for ``stall_s`` (its write is blocked: the client's window is full, or the client is
gone) loses its turn, so a stuck subscriber never holds back the others. Losing a turn ends
nothing: the holder finishes its chunk when its client reads, and waits for a turn for the next.

Invariants: ``held <= turns``; a waiter is handed a turn only when one is free; a turn is
released once (by its holder, on a stall, or when its holder's call is cancelled).
"""

from __future__ import annotations

import asyncio
import collections
import weakref

DEFAULT_TURNS = 4
"""Subscriptions sending at once. Small, so a loop iteration holds few sends besides the
publishers' work (8 turns kept a publisher at 0.67 of its rate beside 500 idle subscribers, 4 at
0.83; docs/performance.md, "Isolation"); a stalled holder loses its turn, so a slow client does
not serialise the rest."""
DEFAULT_STALL_S = 0.02
"""A write that has not completed after this long is waiting for its client."""


class Turn:
    """One subscription's right to send a chunk; release it when the chunk is sent."""

    __slots__ = ("_gate", "_last", "held")

    def __init__(self, gate: DeliveryGate) -> None:
        self._gate = gate
        self._last = gate.loop.time()
        self.held = True

    def progress(self) -> None:
        """A write completed: the client's window had room."""
        self._last = self._gate.loop.time()

    def release(self) -> None:
        if self.held:
            self.held = False
            self._gate._returned(self)


class DeliveryGate:
    """Hands out at most ``turns`` :class:`Turn` objects at a time, first come first served.

    One timer per gate looks for stalled holders, armed while there are holders, for the
    earliest moment one of them may have stalled: a live subscription takes a turn per frame
    and its write completes at once, so a timer per turn (armed and cancelled for every frame)
    was most of what a turn cost."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        turns: int = DEFAULT_TURNS,
        stall_s: float = DEFAULT_STALL_S,
    ) -> None:
        if turns < 1 or stall_s <= 0:
            raise ValueError(f"need turns >= 1 and stall_s > 0, got {turns}, {stall_s}")
        self.loop = loop
        self.turns = turns
        self.stall_s = stall_s
        self.held = 0
        self._holders: set[Turn] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: collections.deque[asyncio.Future[Turn]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(not w.done() for w in self._waiting)

    async def turn(self) -> Turn:
        """Wait for a turn (immediately when one is free and nobody is waiting)."""
        if self.held < self.turns and not self._waiting:
            return self._grant()
        waiter: asyncio.Future[Turn] = self.loop.create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                waiter.result().release()  # granted, but its taker is gone: pass it on
            else:
                waiter.cancel()  # skipped when a turn is handed out
            raise

    def _grant(self) -> Turn:
        self.held += 1
        turn = Turn(self)
        self._holders.add(turn)
        if self._timer is None:  # else one is due no later than this turn's first stall
            self._timer = self.loop.call_at(turn._last + self.stall_s, self._check)
        return turn

    def _returned(self, turn: Turn) -> None:
        self._holders.discard(turn)
        self.held -= 1
        while self._waiting and self.held < self.turns:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(self._grant())

    def _check(self) -> None:
        """Take the turn of every holder without progress for ``stall_s``; look again when the
        next holder could stall."""
        now = self.loop.time()
        for turn in [t for t in self._holders if now >= t._last + self.stall_s]:
            turn.release()  # stalled: let the next subscription send
        self._timer = None
        if self._holders:
            due = min(t._last for t in self._holders) + self.stall_s
            self._timer = self.loop.call_at(due, self._check)


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DeliveryGate] = (
    weakref.WeakKeyDictionary()
)


def delivery_gate() -> DeliveryGate:
    """The running loop's gate: the loop is what its subscriptions share."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = DeliveryGate(loop)
    return gate
