"""Subscriptions: the one loop through which anything reads a partition as it grows.

Every subscriber of a partition goes through :class:`Subscription`: Liftbridge ``Subscribe``,
``tidelog.v1`` ``SubscribeBatches`` and ``Consume`` (permits, seeks, epochs), and through them the
client's consumers and the Spark source. The api translates requests into a
:class:`SubscribeRequest` and batches into frames; nothing above the broker builds a log reader.
(Inside the broker, the materialised views and the ``__cursors`` index catch up with bounded
reads of the log up to its high watermark, in a worker thread: they never wait, seek or stop.)

Theory of operation. A subscriber never receives messages pushed by publishers; it always pulls
verified batches from the partition's commit log, by offset. It is *resuming* while reads return
data (catching up), and *live* once caught up: it then waits on the partition's commit signal and
reads again when the high watermark moves. Because both states read the same log by offset, the
hand-over from resuming to live cannot miss or repeat a message, whatever publishers do meanwhile.
The only per-subscriber buffer is the batch in hand, and a byte budget bounds it (``buffer_bytes``:
a batch is never read larger, except that a single larger message is read alone, and that a catch-up
sending whole read-ahead spans holds a larger one on a lease of the process-wide read-ahead budget
until its call has sent it, :meth:`Subscription.send_whole_spans`): a slow client stops the loop
at its ``yield`` once gRPC flow control holds its write, which costs the publisher and the other
subscribers nothing, and the subscriber resumes from the log where it stopped - the log is the
buffer. Until a non-reading client's flow-control window is full, its sends still cost the event
loop; ``tidelog.broker.delivery`` keeps them from crowding out publishers.

A *seekable* subscription (``Consume``) adds two things: *permits*, the messages its client has
room for (it never reads more than granted), and *seeks*, which switch it to a new position and
stamp what it reads from then on with the seek's *epoch*. A batch carries the epoch current when
it was read, so a batch read before a seek, even one still in flight, is recognisably stale. A
seekable subscription that reaches its end (a reverse read passing the oldest record) says so
once and waits for the next seek instead of ending.

The states and events are one table, :data:`TRANSITIONS`; a pair missing from it is a bug.
Where a subscription starts and stops is resolved into offsets before it reads
(``positions.py``; :class:`SubscribeRequest` and ``resolve`` are re-exported here).
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from tidelog.broker.partition import Partition
from tidelog.broker.positions import Bounds
from tidelog.broker.positions import SubscribeRequest as SubscribeRequest
from tidelog.broker.positions import resolve as resolve
from tidelog.broker.span_leases import Outbound, SpanLeases
from tidelog.errors import (
    Fenced,
    InvalidArgument,
    LogClosed,
    PartitionPaused,
    ReadonlyEnd,
    StopReached,
    TidelogError,
)
from tidelog.log import MessageBatch, Reader

READAHEAD_BYTES: Final = 1 << 20
"""A forward subscription reads the log this many bytes at a time and sends them in batches of
its own size (``ForwardReader``'s read-ahead): one index lookup, one ``pread`` and one CRC pass
(one native call, ``tidelog.log.crcs``) per span rather than per batch. A catching-up
subscription therefore holds up to this much of verified records besides the batch it sends;
a live one reads only what was committed since its last read. A subscription that sends whole
spans (:meth:`Subscription.send_whole_spans`) hands such a read out as one batch instead."""


class EndReason(enum.Enum):
    """Why a subscription ended by itself."""

    STOP = "stop"
    """its stop bound was delivered (forward) or reached (reverse)"""
    OLDEST = "oldest"
    """a reverse read passed the oldest retained record"""
    READONLY = "readonly"
    """a read-only partition was delivered to its end"""


class SubscriberState(enum.Enum):
    RESUMING = "resuming"
    """reads return data: catching up"""
    LIVE = "live"
    """caught up: waiting for the commit signal"""
    STOPPED = "stopped"
    """at its end (stop bound, oldest record, read-only end) or cancelled by its subscriber; a
    seekable subscription leaves it on a seek"""
    FAILED = "failed"
    """ended by the partition: paused, deleted, the broker closing, or fenced"""


class Event(enum.Enum):
    DATA = "a read returned data"
    CAUGHT_UP = "a read returned nothing"
    END = "the stop bound, the oldest record or a read-only end was reached"
    SEEK = "the subscriber moved to a new position (seekable only)"
    PERMITS = "the subscriber granted permits (seekable only)"
    CANCEL = "the subscriber went away"
    FAIL = "the partition was paused or deleted, the broker is closing, or the subscriber fenced"


_R, _L, _S, _F = (
    SubscriberState.RESUMING,
    SubscriberState.LIVE,
    SubscriberState.STOPPED,
    SubscriberState.FAILED,
)
TRANSITIONS: Final[dict[tuple[SubscriberState, Event], SubscriberState]] = {
    (_R, Event.DATA): _R,
    (_L, Event.DATA): _R,
    (_R, Event.CAUGHT_UP): _L,
    (_L, Event.CAUGHT_UP): _L,
    (_R, Event.END): _S,
    (_L, Event.END): _S,
    (_R, Event.SEEK): _R,
    (_L, Event.SEEK): _R,
    (_S, Event.SEEK): _R,
    (_R, Event.PERMITS): _R,
    (_L, Event.PERMITS): _L,
    (_S, Event.PERMITS): _S,
    (_F, Event.PERMITS): _F,
    (_R, Event.CANCEL): _S,
    (_L, Event.CANCEL): _S,
    (_S, Event.CANCEL): _S,
    (_F, Event.CANCEL): _F,
    (_R, Event.FAIL): _F,
    (_L, Event.FAIL): _F,
    (_S, Event.FAIL): _F,
    (_F, Event.FAIL): _F,
}
"""(state, event) -> next state. STOPPED is final unless the subscription is seekable; FAILED
is final (permits, a cancel or a second failure arriving after it change nothing)."""


VALUELESS_BUDGET_FACTOR: Final = 4
"""How many times the byte budget of record bytes a batch sent without values may read
(:meth:`Subscription.send_without_values`)."""


class Subscription:
    """Feeds one subscriber from one partition; iterate :meth:`batches`.

    ``max_bytes`` (what the subscriber asked for) and ``buffer_bytes`` (the broker's budget) both
    cap a batch; the smaller one wins (the broker fills in what the subscriber left out from its
    config). ``seekable`` subscriptions read only what :meth:`grant` allowed, move on
    :meth:`seek`, and stamp batches with :attr:`batch_epoch`.
    """

    def __init__(
        self,
        partition: Partition,
        bounds: Bounds,
        *,
        max_messages: int,
        max_bytes: int,
        buffer_bytes: int,
        seekable: bool = False,
    ) -> None:
        self.partition = partition
        self.bounds = bounds
        self.state = SubscriberState.RESUMING
        self.seekable = seekable
        self._max_messages = max_messages
        self._max_bytes = min(max_bytes, buffer_bytes)
        self._asked_bytes = max_bytes
        self._buffer_bytes = buffer_bytes
        self._end_at_readonly = not seekable and bounds.stop_offset is None
        self.end_reason: EndReason | None = None
        self.fenced = False
        self._cancelled = False
        self.on_close: Callable[[], None] | None = None
        """Called once when the subscription ends (a consumer group deregisters it)."""
        self._permits: int | None = 0 if seekable else None
        """Messages the subscriber still has room for; None: no flow control (not seekable)."""
        self.epoch = 0
        """The epoch of the latest seek (seekable subscriptions)."""
        self.batch_epoch = 0
        """The epoch that was current when the batch last yielded was read."""
        self._changed = asyncio.Event()
        """Set by seek, grant and cancel: what a waiting seekable subscription wakes on."""
        self._log = partition.log  # a pause closes it; a resume opens another: this one is over
        self._reader = self._open_reader(bounds)
        self._spans: SpanLeases | None = None
        """Catch-up reads go out whole, on these leases (:meth:`send_whole_spans`)."""
        self._tails = (
            not seekable
            and not bounds.reverse
            and bounds.stop_offset is None
            and bounds.stop_timestamp is None
        )
        """Forward without stop bounds and no seeks: a read that reached the high watermark
        means caught up (see :meth:`_at_tip`)."""

    def send_without_values(self) -> None:
        """The subscriber takes frames without value bytes (``without_values``): what it holds in
        hand per record is then its offset, timestamp, value size, key and headers, never more
        than the record's stored bytes and, for values of 100 B, about a sixth of them. So a
        batch may read up to :data:`VALUELESS_BUDGET_FACTOR` times the byte budget of record
        bytes (still within what the subscriber asked for): fewer, larger frames, which is most
        of what such a read costs the server (each frame's send). Every record is still read
        and CRC-checked whole."""
        self._max_bytes = min(self._asked_bytes, VALUELESS_BUDGET_FACTOR * self._buffer_bytes)

    def send_whole_spans(self, outbound: Outbound) -> None:
        """A catching-up forward read of up to :data:`READAHEAD_BYTES` goes out as one batch
        rather than in pieces of the byte budget: for a subscriber that left the batch size to
        the broker (``SubscribeBatches`` without ``max_messages`` or ``max_bytes``), whose
        frames cost the server and its client mostly per frame. ``outbound`` reports the call's
        queue of response bytes: a batch larger than the byte budget is read only on a lease of
        the process-wide read-ahead budget (``tidelog.log.readahead``), kept until the
        transport has sent its frame (``broker/span_leases.py``: at most three per subscription,
        and never the last half of the budget). Without a lease, batches are the budget's size
        as before. So every byte of a whole span, in hand or queued, is on lease: subscribers
        together hold no more than what their byte budgets and calls' queues hold and half the
        read-ahead budget, and other readers keep the other half. Not for a seekable or a
        reverse subscription (permits and descending reads size their own)."""
        if not self.seekable and not self.bounds.reverse:
            self._spans = SpanLeases(outbound)

    def _open_reader(self, bounds: Bounds) -> Reader | None:
        if bounds.empty:
            return None
        if bounds.reverse:
            return self._log.reverse_reader(
                bounds.start_offset,
                stop_offset=bounds.stop_offset,
                stop_timestamp=bounds.stop_timestamp,
            )
        return self._log.forward_reader(
            bounds.start_offset,
            stop_offset=bounds.stop_offset,
            stop_timestamp=bounds.stop_timestamp,
            readahead_bytes=READAHEAD_BYTES,
        )

    def _on(self, event: Event) -> None:
        self.state = TRANSITIONS[(self.state, event)]

    # -- events from the subscriber and the broker -------------------------------------------------

    def grant(self, permits: int) -> None:
        """Let a seekable subscription read ``permits`` more messages."""
        if self._permits is None:
            raise InvalidArgument("only a Consume subscription takes permits")
        self._permits += permits
        self._on(Event.PERMITS)
        self._changed.set()

    def seek(self, request: SubscribeRequest, *, epoch: int, permits: int) -> None:
        """Move to ``request``'s start position: batches read from now on carry ``epoch``, and the
        grant is reset to ``permits`` (what the subscriber has room for after dropping what it
        held). Errors of the position are raised here, and the subscription stays where it was."""
        if not self.seekable:
            raise InvalidArgument("only a Consume subscription can seek")
        self._check_partition()
        bounds = resolve(self._log, request)
        self._reader = self._open_reader(bounds)
        self.bounds = bounds
        self.end_reason = None
        self.epoch = epoch
        self._permits = permits
        self._on(Event.SEEK)
        self._changed.set()

    def cancel(self) -> None:
        """End the subscription from outside its loop (the subscriber's requests ended)."""
        self._cancelled = True
        self._changed.set()

    def fence(self) -> None:
        """End this subscription: a group subscriber with a newer epoch took the partition."""
        self.fenced = True
        self.partition.signal.fire_threadsafe()

    def _check_partition(self) -> None:
        try:
            if self.fenced:
                raise Fenced(
                    "a consumer-group subscriber with a newer epoch took this partition over"
                )
            partition = self.partition
            partition.check_serving()
            if partition.current_log is not self._log:  # paused and resumed since we started
                raise PartitionPaused(partition.stream, partition.number)
        except TidelogError:
            self._on(Event.FAIL)
            raise

    # -- the loop --------------------------------------------------------------------------------

    def available(self) -> Iterator[MessageBatch]:
        """The batches readable now, in order, without waiting: the one read step.

        It ends when the subscription is caught up (LIVE), reaches its end (STOPPED, with
        ``end_reason``), runs out of permits or is cancelled, and raises what ends it from the
        partition (FAILED). :meth:`batches` runs it between waits.
        """
        while not self._cancelled and self.state is not SubscriberState.STOPPED:
            if self._permits == 0:
                return
            self._check_partition()
            batch = self._read()
            if batch:
                yield batch
                if not self._at_tip():
                    continue
            ended = self._ended()
            if ended is None:
                self._on(Event.CAUGHT_UP)
            else:
                self.end_reason = ended
                self._on(Event.END)
            return

    async def batches(self) -> AsyncIterator[MessageBatch]:
        """Verified batches in delivery order until a stop bound, or forever (cancel to end).

        Forward subscriptions that pass their stop bound end with ``StopReached``; reverse ones
        end by returning once the oldest record (or the stop bound) is behind them. A seekable
        subscription does neither: it yields one empty batch (``end_reason`` says why) and waits
        for a seek.
        """
        partition = self.partition
        stats = partition.stats
        partition.subscribers += 1
        try:
            while not self._cancelled:
                self._check_partition()  # also while waiting for a seek or for permits
                woken = partition.signal.current()
                stopped_before = self.state is SubscriberState.STOPPED
                for batch in self.available():
                    stats.messages_out += len(batch)
                    stats.bytes_out += batch.byte_size
                    if faults.delivery_delay_s:
                        await asyncio.sleep(faults.delivery_delay_s)
                    yield batch
                if self.state is not SubscriberState.STOPPED or stopped_before:
                    await self._wait(woken)  # new data, or (seekable) a seek, permits, a cancel
                elif self.seekable:
                    self.batch_epoch = self.epoch
                    yield MessageBatch.empty()
                elif self.end_reason is EndReason.READONLY:
                    raise ReadonlyEnd("end of readonly partition")
                elif self.bounds.reverse:
                    return
                else:
                    raise StopReached("stop offset reached")
        finally:
            partition.subscribers -= 1
            if self._spans is not None:
                self._spans.release()
            if self.state in (SubscriberState.RESUMING, SubscriberState.LIVE):
                self._on(Event.CANCEL)
            if self.on_close is not None:
                self.on_close()

    def _read(self) -> MessageBatch:
        reader = self._reader
        if reader is None:  # nothing can ever be delivered
            return _NOTHING
        permits = self._permits
        limit = self._max_messages if permits is None else min(permits, self._max_messages)
        max_bytes = self._max_bytes
        epoch = self.epoch
        spans = self._spans
        lease = spans.lease(READAHEAD_BYTES) if spans is not None else None
        if lease is not None:
            limit *= -(-READAHEAD_BYTES // max_bytes)
            max_bytes = max(max_bytes, READAHEAD_BYTES)
        batch = _NOTHING
        try:
            batch = reader.read(limit, max_bytes)
        except LogClosed:
            self._check_partition()
            raise
        finally:
            if lease is not None:
                if batch.byte_size > self._max_bytes and spans is not None:  # until sent
                    spans.hold(lease)
                else:  # within the subscription's own budget (a live read), or no batch
                    lease.release()
        if batch:
            self._on(Event.DATA)
            if permits is not None:
                self._permits = permits - len(batch)
            self.batch_epoch = epoch
        return batch

    def _at_tip(self) -> bool:
        """True when a tailing subscription's reads have reached the high watermark, so the
        next read could only return nothing: it is caught up without paying for that read. A
        live subscriber is woken once per commit, and this halves the reads of each wake-up.
        (Anything committed meanwhile has fired the signal captured before the reads.)"""
        reader = self._reader
        return (
            self._tails
            and not self._cancelled
            and reader is not None
            and not reader.done
            and reader.next_offset > self._log.high_watermark
        )

    def _ended(self) -> EndReason | None:
        """Why a read that returned nothing means the end, or None: wait for more."""
        reader = self._reader
        if reader is None or reader.done:
            if not self.bounds.reverse:
                return EndReason.STOP
            # Older records left undelivered means a stop bound ended the read.
            if reader is not None and reader.next_offset >= self._log.oldest_offset:
                return EndReason.STOP
            return EndReason.OLDEST
        if (
            self._end_at_readonly
            and self.partition.readonly
            and reader.next_offset > self._log.high_watermark
        ):
            return EndReason.READONLY
        return None

    async def _wait(self, woken: asyncio.Future[None]) -> None:
        """Until the partition's commit signal fires (new data, a pause, a delete, a fence) or,
        for a seekable subscription, a seek, a grant or a cancel."""
        if not self.seekable:
            # The future is shared by every waiter: shield it, so that cancelling this
            # subscriber (a client going away) does not cancel it for the others.
            await asyncio.shield(woken)
            return
        self._changed.clear()
        woken.add_done_callback(self._wake)
        try:
            await self._changed.wait()
        finally:
            woken.remove_done_callback(self._wake)

    def _wake(self, _: object) -> None:
        self._changed.set()


_NOTHING: Final = MessageBatch.empty()


@dataclass(slots=True)
class DeliveryFaults:
    """Fault-injection points of the read loop, for tests; every one is off by default.

    Only :func:`arm_faults_from_environment` (called by ``Broker.start``) sets them, from
    environment variables a test passes to the server process; ``docs/operations.md`` lists
    them. They are not settings: nothing in production configures them.
    """

    delivery_delay_s: float = 0.0
    """Wait this long between reading a batch and handing it out (``TIDELOG_TEST_READ_DELAY_S``):
    makes the race between a batch in flight and a seek deterministic."""


faults = DeliveryFaults()


def arm_faults_from_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Arm :data:`faults` from ``TIDELOG_TEST_*`` variables; unset variables leave them off."""
    delay = environ.get("TIDELOG_TEST_READ_DELAY_S")
    if delay:
        faults.delivery_delay_s = float(delay)
