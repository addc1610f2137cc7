"""The leases of a subscription's whole-span batches, held until the transport has sent them.

A subscription that sends whole read-ahead spans (``Subscription.send_whole_spans``) hands out
batches of up to ``READAHEAD_BYTES``, larger than its byte budget, and the bytes of such a batch
stay in memory until its call's transport has sent the last of them: the frame's pieces point
into the span that was read. So a whole span is read only on a lease of the process-wide
read-ahead budget (``tidelog.log.readahead``), and that lease is kept until the call's queue of
response bytes has moved past the frame's end, not merely until the next read.

Theory of operation. The transport reports the call's outbound queue as ``(pending, sent)``: the
bytes queued and not yet sent, and those sent so far (a running count). A subscription's next
read starts only after its last batch was written, and nothing else writes to the call
meanwhile, so at that read the last frame ends where the queue ends, ``sent + pending``: that is
its lease's mark. A lease is given back once ``sent`` reaches its mark (its frame has left the
call), or when the subscription ends.

Invariants: every whole span read and not yet sent by its call is on lease; a subscription holds
at most :data:`MAX_HELD` leases (a whole frame is more than the call's high-water mark, so a
client that reads, however slowly, has at most the tail of one frame and the next one queued when
the one after is read: it keeps getting whole spans; one that stopped reading holds two, one
queued and one in hand); whole spans lease only while at least :data:`KEEP_FREE` of the
read-ahead budget stays unleased, so however many subscribers catch up at once, other readers
keep read-ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from tidelog.log.readahead import BUDGET_BYTES, READAHEAD, Lease

Outbound = Callable[[], tuple[int, int]]
"""The call's response bytes ``(pending, sent)``: queued and not yet sent, sent so far."""

MAX_HELD: Final = 3
"""Whole spans a subscription holds on lease at once: two queued (one partly sent), one in hand."""

KEEP_FREE: Final = BUDGET_BYTES // 2
"""The share of the read-ahead budget whole spans leave to other readers."""


class SpanLeases:
    """One subscription's leases of whole spans, each until its frame has been sent."""

    __slots__ = ("_held", "_marks", "_outbound")

    def __init__(self, outbound: Outbound) -> None:
        self._outbound = outbound
        self._held: list[Lease] = []
        self._marks: list[int] = []
        """Where each held lease's frame ends in the call's stream (one fewer than ``_held``
        while the last one's batch is still in hand)."""

    def lease(self, size: int) -> Lease | None:
        """A lease of ``size`` bytes for the next whole span (call :meth:`hold` if the batch
        read is a whole span, else release it), or None: read a batch of the byte budget."""
        self._settle()
        if len(self._held) >= MAX_HELD:
            return None
        return READAHEAD.lease(size, keep_free=KEEP_FREE)

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` until the batch just read under it has been sent."""
        self._held.append(lease)

    @property
    def held(self) -> int:
        """The leases held now."""
        return len(self._held)

    def release(self) -> None:
        """Give every lease back (the subscription has ended)."""
        for lease in self._held:
            lease.release()
        self._held.clear()
        self._marks.clear()

    def _settle(self) -> None:
        held, marks = self._held, self._marks
        if not held:
            return
        pending, sent = self._outbound()
        if len(marks) < len(held):  # the last batch was written since: it ends the queue
            marks.append(sent + pending)
        gone = 0
        while gone < len(marks) and marks[gone] <= sent:
            held[gone].release()
            gone += 1
        del held[:gone], marks[:gone]
