"""Subscriptions: where a subscriber starts and stops, and the loop that feeds it.

Theory of operation. A subscriber never receives messages pushed by publishers; it always pulls
verified batches from the partition's commit log, by offset. It is *resuming* while reads return
data (catching up), and *live* once caught up: it then waits on the partition's commit signal and
reads again when the high watermark moves. Because both states read the same log by offset, the
hand-over from resuming to live cannot miss or repeat a message, whatever publishers do
meanwhile. The only per-subscriber buffer is the batch in hand, and a byte budget bounds it
(``buffer_bytes``: a batch is never read larger, except that a single larger message is read
alone): a slow client stops the loop at its ``yield`` once gRPC flow control holds its write,
which costs the publisher and the other subscribers nothing, and the subscriber resumes from the
log where it stopped - the log is the buffer. Until a non-reading client's flow-control window is
full, its sends still cost the event loop; ``tidelog.broker.delivery`` keeps them from crowding
out publishers.

State table (events on the left, ``RESUMING`` / ``LIVE``):

    read returned data       RESUMING -> RESUMING   LIVE -> RESUMING
    read returned nothing    RESUMING -> LIVE       LIVE -> LIVE (wait for the signal)
    stop bound passed        -> DONE (StopReached for forward; a clean end for reverse)
    partition paused         -> DONE (PartitionPaused)
    stream deleted / closing -> DONE (StreamDeleted)
    read-only and caught up  -> DONE (ReadonlyEnd), when the subscription stops on cancel
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tidelog.broker.config import DEFAULT_SUBSCRIBER_BUFFER_BYTES
from tidelog.broker.partition import Partition
from tidelog.errors import (
    Fenced,
    InvalidArgument,
    LogClosed,
    PartitionPaused,
    ReadonlyEnd,
    StopReached,
    StreamEmpty,
)
from tidelog.log import ForwardReader, MessageBatch, ReverseReader, SegmentedLog


class StartPosition(enum.IntEnum):
    """Numbered as Liftbridge's ``StartPosition``."""

    NEW_ONLY = 0
    OFFSET = 1
    EARLIEST = 2
    LATEST = 3
    TIMESTAMP = 4


class StopPosition(enum.IntEnum):
    """Numbered as Liftbridge's ``StopPosition``."""

    ON_CANCEL = 0
    OFFSET = 1
    LATEST = 2
    TIMESTAMP = 3


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
    LIVE = "live"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    start: StartPosition = StartPosition.NEW_ONLY
    start_offset: int = 0
    start_timestamp: int = 0
    stop: StopPosition = StopPosition.ON_CANCEL
    stop_offset: int = 0
    stop_timestamp: int = 0
    reverse: bool = False


@dataclass(frozen=True, slots=True)
class Bounds:
    """A subscription resolved against the log: concrete offsets and an optional time stop."""

    start_offset: int
    stop_offset: int | None
    stop_timestamp: int | None
    reverse: bool
    empty: bool = False
    """Nothing can ever be delivered: end right after the handshake (forward with the stop
    signal, reverse with a clean end)."""


def resolve(log: SegmentedLog, request: SubscribeRequest) -> Bounds:
    """Turn a request's start/stop positions into offsets (all checks happen here, before any
    message is sent). Rules are in ``docs/api.md`` ("Subscribe positions")."""
    if request.start is StartPosition.OFFSET and request.start_offset < 0:
        raise InvalidArgument(f"start offset must be >= 0, got {request.start_offset}")
    if request.stop is StopPosition.OFFSET and request.stop_offset < 0:
        raise InvalidArgument(f"stop offset must be >= 0, got {request.stop_offset}")
    high_watermark = log.high_watermark
    stop_offset: int | None = None
    stop_timestamp: int | None = None
    if request.stop is StopPosition.OFFSET:
        stop_offset = request.stop_offset
    elif request.stop is StopPosition.LATEST and not request.reverse:
        if high_watermark < 0:
            raise StreamEmpty("stream is empty: there is no latest offset to stop at")
        stop_offset = high_watermark
    # (Reverse reads start at or below the latest already: STOP_LATEST runs them to the oldest.)
    elif request.stop is StopPosition.TIMESTAMP:
        stop_timestamp = request.stop_timestamp
    return (_resolve_reverse if request.reverse else _resolve_forward)(
        log, request, high_watermark, stop_offset, stop_timestamp
    )


def _resolve_forward(
    log: SegmentedLog,
    request: SubscribeRequest,
    high_watermark: int,
    stop_offset: int | None,
    stop_timestamp: int | None,
) -> Bounds:
    start = request.start
    if start is StartPosition.NEW_ONLY:
        offset = high_watermark + 1
    elif start is StartPosition.EARLIEST:
        offset = log.oldest_offset
    elif start is StartPosition.LATEST:
        offset = max(high_watermark, 0)
    elif start is StartPosition.OFFSET:
        offset = max(request.start_offset, log.oldest_offset)
    else:
        found = log.offset_at_or_after_timestamp(request.start_timestamp)
        offset = high_watermark + 1 if found is None else found
    if stop_offset is not None and stop_offset < offset:
        if request.stop is StopPosition.LATEST:
            # Nothing lies between a start past the latest message and the latest message.
            return Bounds(offset, stop_offset, None, reverse=False, empty=True)
        raise InvalidArgument(
            f"stop offset {stop_offset} is before the start offset {offset}; a forward "
            f"subscription needs stop >= start"
        )
    return Bounds(offset, stop_offset, stop_timestamp, reverse=False)


def _resolve_reverse(
    log: SegmentedLog,
    request: SubscribeRequest,
    high_watermark: int,
    stop_offset: int | None,
    stop_timestamp: int | None,
) -> Bounds:
    start = request.start
    empty = high_watermark < 0
    if start in (StartPosition.NEW_ONLY, StartPosition.LATEST):
        offset = high_watermark
    elif start is StartPosition.EARLIEST:
        offset = log.oldest_offset
    elif start is StartPosition.OFFSET:
        offset = min(request.start_offset, high_watermark)
    else:
        found = log.offset_at_or_before_timestamp(request.start_timestamp)
        offset, empty = (0, True) if found is None else (found, empty)
    if stop_offset is not None and stop_offset > offset and not empty:
        raise InvalidArgument(
            f"stop offset {stop_offset} is above the start offset {offset}; a reverse "
            f"subscription reads downwards and needs stop <= start"
        )
    return Bounds(max(offset, 0), stop_offset, stop_timestamp, reverse=True, empty=empty)


class Subscription:
    """Feeds one subscriber from one partition; iterate :meth:`batches`.

    ``max_bytes`` (what the subscriber asked for) and ``buffer_bytes`` (the broker's budget) both
    cap a batch; the smaller one wins.
    """

    def __init__(
        self,
        partition: Partition,
        bounds: Bounds,
        *,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        buffer_bytes: int = DEFAULT_SUBSCRIBER_BUFFER_BYTES,
        stops_on_cancel: bool = True,
    ) -> None:
        self.partition = partition
        self.bounds = bounds
        self.state = SubscriberState.RESUMING
        self._max_messages = max_messages
        self._max_bytes = min(max_bytes, buffer_bytes)
        self._end_at_readonly = stops_on_cancel and bounds.stop_offset is None
        self.end_reason: EndReason | None = None
        self.fenced = False
        self.on_close: Callable[[], None] | None = None
        """Called once when the subscription ends (a consumer group deregisters it)."""
        log = partition.log
        self._log = log  # a pause closes it; a resume opens another: this subscription is over
        self._reader: ForwardReader | ReverseReader | None
        if bounds.empty:
            self._reader = None
        elif bounds.reverse:
            self._reader = log.reverse_reader(
                bounds.start_offset,
                stop_offset=bounds.stop_offset,
                stop_timestamp=bounds.stop_timestamp,
            )
        else:
            self._reader = log.forward_reader(
                bounds.start_offset,
                stop_offset=bounds.stop_offset,
                stop_timestamp=bounds.stop_timestamp,
            )

    def fence(self) -> None:
        """End this subscription: a group subscriber with a newer epoch took the partition."""
        self.fenced = True
        self.partition.signal.fire_threadsafe()

    def _check_partition(self) -> None:
        if self.fenced:
            raise Fenced("a consumer-group subscriber with a newer epoch took this partition over")
        partition = self.partition
        partition.check_serving()
        if partition.current_log is not self._log:  # paused and resumed since we started
            raise PartitionPaused(partition.stream, partition.number)

    async def batches(self) -> AsyncIterator[MessageBatch]:
        """Verified batches in delivery order until a stop bound, or forever (cancel to end).

        Forward subscriptions that pass their stop bound end with ``StopReached``; reverse ones
        end by returning once the oldest record (or the stop bound) is behind them.
        """
        partition = self.partition
        partition.subscribers += 1
        try:
            reader = self._reader
            if reader is None:
                self.state = SubscriberState.DONE
                if self.bounds.reverse:
                    self.end_reason = EndReason.OLDEST
                    return
                self.end_reason = EndReason.STOP
                raise StopReached("stop offset reached")
            while True:
                self._check_partition()
                woken = partition.signal.current()
                try:
                    batch = reader.read(self._max_messages, self._max_bytes)
                except LogClosed:
                    self._check_partition()
                    raise
                if batch:
                    self.state = SubscriberState.RESUMING
                    partition.stats.messages_out += len(batch)
                    partition.stats.bytes_out += batch.byte_size
                    yield batch
                    continue
                if reader.done:
                    self.state = SubscriberState.DONE
                    if self.bounds.reverse:
                        # Older records left undelivered means a stop bound ended the read.
                        below = reader.next_offset >= partition.log.oldest_offset
                        self.end_reason = EndReason.STOP if below else EndReason.OLDEST
                        return
                    self.end_reason = EndReason.STOP
                    raise StopReached("stop offset reached")
                if (
                    self._end_at_readonly
                    and partition.readonly
                    and reader.next_offset > partition.log.high_watermark
                ):
                    self.state = SubscriberState.DONE
                    self.end_reason = EndReason.READONLY
                    raise ReadonlyEnd("end of readonly partition")
                self.state = SubscriberState.LIVE
                # The future is shared by every waiter: shield it, so that cancelling this
                # subscriber (a client going away) does not cancel it for the others.
                await asyncio.shield(woken)
        finally:
            partition.subscribers -= 1
            if self.state is not SubscriberState.DONE:
                self.state = SubscriberState.DONE
            if self.on_close is not None:
                self.on_close()
