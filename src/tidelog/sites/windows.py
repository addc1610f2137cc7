"""The two ends of a site-to-site transfer: which batches a sink applies, which a sender resends.

Framing. The sender ships one site's entries in batches. A batch carries ``(prev, current)``:
``current`` is the position of its last entry, ``prev`` the position of the last entry for the
same site before the batch (``NONE`` before the first). Positions are offsets in the source's
delta queue, so they grow but are not dense for one site. The sink acks cumulatively: an ack of
``p`` says every entry for it up to ``p`` is applied (and persisted with its position).

Sink (:class:`ApplyWindow`): a batch applies when ``prev <= last_applied < current`` (nothing
missing before it, something new in it; when ``prev < last_applied`` the batch overlaps what was
applied and the entries up to ``last_applied`` are skipped). A batch with ``current <=
last_applied`` is a duplicate (a resend): dropped, and the ack repeated. A batch with ``prev >
last_applied`` is early (one before it is still on the way): kept, keyed by ``prev``, up to a
bound, and applied as soon as the gap closes. Past the bound it is dropped; the sender resends it.

Where a window starts. A sink's window for a source starts at what its receive queues hold
(``NONE`` when it holds nothing from that source). A sender does not always start at ``NONE``:
for a site declared after the source stored entries, it starts after the last position before the
site's ``since`` (nothing before it was ever for the site), so its first batch's ``prev`` is that
position and would wait as early forever. The sender's first batch on a stream is always the
one negotiation put at its starting point (a stream carries its batches in order, and the send
window makes each batch follow the one before), so a sink that has applied nothing from the
source takes that batch's ``prev`` as its starting point (:meth:`ApplyWindow.open_at`); a sink
that has applied anything keeps its own position, which the sender negotiated from.

How far a batch may reach. Positions grow with the source's queue, not with one site's
entries, so a sink cannot know where a source's next entry for it lies; it knows what it
applied (and acknowledged). A batch whose ``current`` lies more than ``max_jump`` positions past
``max(last_applied, prev)`` is refused whole (:meth:`ApplyWindow.too_far`): one forged entry far
ahead would otherwise move ``last_applied`` there, and every real entry below it would be
dropped as a duplicate. A real sender never reaches that far: it steps (``sender_deltas.py``),
sending batches without entries ``(prev, prev + step]`` over positions that hold nothing for the
site, with ``step`` below ``max_jump``, so a site that receives rarely while others receive a lot
never trips the bound. A source that did (a ``step`` configured above this sink's bound) is
refused, and answers with a snapshot sync, whose covered position moves the window (a snapshot
is trusted for what its sender is: the source's identity, ``docs/security.md``). The bound is
the same with and without TLS: with TLS only the source itself can send as the source, so it
checks that source's sanity; without, it stops a one-batch forgery only (a forger can step too).

Sender (:class:`SendWindow`): at most ``capacity`` batches are in flight. A batch not acked
within ``resend_after_s`` is sent again, and the wait doubles with each resend (up to
``max_resend_after_s``); after ``max_resends`` the window reports a timeout, which makes the
session start a snapshot sync (``sync_states.py``). An ack evicts every batch it covers and
restarts the timer of the oldest one left.

Both are sans-IO: the caller sends, applies, persists and keeps the time (``clock``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from tidelog.sites.negotiation import NONE

RECORD_POSITIONS: Final = 1 << 16
"""Positions per record of the source's queue (``envelope.py``: offset * 65,536 + index)."""
WINDOW_RECORDS: Final = 1 << 22
"""How many of the source's records a batch may reach past what the sink applied, by default
(the server's ``sites_position_window_records``)."""

SENDER_STEP: Final = WINDOW_RECORDS * RECORD_POSITIONS // 2
"""How far past its ``prev`` a sender's batch reaches at most, by default (half the sink's
default reach: ``LocalSite`` uses half of its own ``sites_position_window_records``)."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Framed(Generic[T]):
    prev: int
    current: int
    entries: T

    def __post_init__(self) -> None:
        if not NONE <= self.prev < self.current:
            raise ValueError(f"a batch needs prev < current, got ({self.prev}, {self.current})")


@dataclass(frozen=True, slots=True)
class Ready(Generic[T]):
    """A batch to apply now: its entries at positions up to ``skip_through`` are applied
    already (an overlap with an earlier batch) and must be skipped."""

    batch: Framed[T]
    skip_through: int


class ApplyWindow(Generic[T]):
    """Sink side, for one source site: which batches to apply, in order, exactly once."""

    def __init__(
        self,
        last_applied: int = NONE,
        capacity: int = 40,
        max_jump: int = WINDOW_RECORDS * RECORD_POSITIONS,
    ) -> None:
        self.last_applied = last_applied
        """Position of the last entry applied: what the sink acks."""
        self.capacity = capacity
        self.max_jump = max_jump
        """How far past ``max(last_applied, prev)`` a batch's ``current`` may lie."""
        self._early: dict[int, Framed[T]] = {}
        """Batches waiting for a gap before them to close, by ``prev``."""
        self.duplicates = 0
        self.dropped_early = 0

    @property
    def waiting(self) -> int:
        return len(self._early)

    def open_at(self, prev: int) -> bool:
        """Start at ``prev``, the ``prev`` of a sender's first batch on a new stream, when
        nothing from the source is applied yet (``last_applied`` is ``NONE``): the sender starts
        there because nothing before it is for this sink. Returns whether the window moved (a
        window that applied anything keeps its position: the sender negotiated from it)."""
        if self.last_applied != NONE or prev <= NONE:
            return False
        self.last_applied = prev
        return True

    def too_far(self, batch: Framed[T]) -> bool:
        """Whether ``batch`` reaches further than this window can account for (the module
        docstring): its ``current`` more than ``max_jump`` past ``max(last_applied, prev)``. The
        caller refuses such a batch whole, before :meth:`offer`."""
        return batch.current - max(self.last_applied, batch.prev) > self.max_jump

    def offer(self, batch: Framed[T]) -> list[Ready[T]]:
        """The batches that can be applied now, in order (``batch`` and any early ones it
        unblocks). The window counts them applied: the caller applies them in this order and
        persists ``last_applied`` with the result, atomically; after a failure it reopens the
        window from what it persisted."""
        if batch.current <= self.last_applied:
            self.duplicates += 1
            return []
        if batch.prev > self.last_applied:
            if batch.prev in self._early or len(self._early) < self.capacity:
                self._early[batch.prev] = batch
            else:
                self.dropped_early += 1
            return []
        ready = [self._take(batch)]
        while True:
            following = self._next_early()
            if following is None:
                return ready
            ready.append(self._take(following))

    def _take(self, batch: Framed[T]) -> Ready[T]:
        ready = Ready(batch, self.last_applied)
        self.last_applied = batch.current
        return ready

    def _next_early(self) -> Framed[T] | None:
        """An early batch that the last applied position now unblocks (forgetting those that
        became duplicates)."""
        for prev in sorted(self._early):
            if prev > self.last_applied:
                return None
            batch = self._early.pop(prev)
            if batch.current > self.last_applied:
                return batch
            self.duplicates += 1
        return None


@dataclass(slots=True)
class _InFlight(Generic[T]):
    batch: Framed[T]
    due: float
    resends: int = 0


class AckTimeout(Exception):
    """A batch went unacked through every resend: the session starts a snapshot sync."""


class SendWindow(Generic[T]):
    """Sender side, for one remote site: the batches sent and not yet acked."""

    def __init__(
        self,
        capacity: int = 8,
        *,
        resend_after_s: float = 5.0,
        max_resend_after_s: float = 60.0,
        max_resends: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"a send window needs room for one batch, got {capacity}")
        self.capacity = capacity
        self.resend_after_s = resend_after_s
        self.max_resend_after_s = max_resend_after_s
        self.max_resends = max_resends
        self._clock = clock
        self._in_flight: list[_InFlight[T]] = []
        self.acked = NONE
        """The highest position the sink acked."""

    @property
    def has_room(self) -> bool:
        return len(self._in_flight) < self.capacity

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def last_sent(self) -> int:
        """Position of the last entry sent (the ``prev`` of the next batch)."""
        return self._in_flight[-1].batch.current if self._in_flight else self.acked

    def sent(self, batch: Framed[T]) -> None:
        if not self.has_room:
            raise ValueError("the send window is full: wait for an ack")
        if batch.prev != self.last_sent:
            raise ValueError(
                f"batch ({batch.prev}, {batch.current}) does not follow position {self.last_sent}"
            )
        self._in_flight.append(_InFlight(batch, self._clock() + self.resend_after_s))

    def ack(self, position: int) -> int:
        """The sink applied everything up to ``position``: evict what it covers; returns how
        many batches left the window. An ack at or below one seen before changes nothing (a
        repeated or reordered ack)."""
        if position <= self.acked:
            return 0
        self.acked = position
        kept = [f for f in self._in_flight if f.batch.current > position]
        evicted = len(self._in_flight) - len(kept)
        if evicted and kept:
            kept[0].due = self._clock() + self.resend_after_s
            kept[0].resends = 0
        self._in_flight = kept
        return evicted

    def due(self) -> list[Framed[T]]:
        """The batches to send again now (each one's wait doubled). Raises :class:`AckTimeout`
        when one has been resent ``max_resends`` times already."""
        now = self._clock()
        again: list[Framed[T]] = []
        for flight in self._in_flight:
            if flight.due > now:
                continue
            if flight.resends >= self.max_resends:
                raise AckTimeout(
                    f"batch ({flight.batch.prev}, {flight.batch.current}) was not acked after "
                    f"{flight.resends} resends"
                )
            flight.resends += 1
            wait = min(self.resend_after_s * 2**flight.resends, self.max_resend_after_s)
            flight.due = now + wait
            again.append(flight.batch)
        return again
