"""Where a subscription starts and stops: the positions a subscriber names, and their
resolution against a partition's log into offsets (:func:`resolve`).

A :class:`SubscribeRequest` names a start (:class:`StartPosition`: new messages only, an offset,
the earliest or latest message, or a timestamp) and a stop (:class:`StopPosition`: on cancel, at
an offset, at the latest message or at a timestamp), and a direction. :func:`resolve` turns it
into :class:`Bounds`, concrete offsets (and a time stop not yet reached), once, before any message
is sent. Invariants: every check of a request happens here (a request that cannot be served is
refused with ``InvalidArgument`` or ``StreamEmpty``, nothing is read); a forward read's stop is
at or after its start and a reverse read's at or below it, or the bounds are ``empty`` (nothing
can ever be delivered). The rules, position by position, are in ``docs/api.md`` ("Subscribe
positions"); :class:`~tidelog.broker.subscription.Subscription` reads within the bounds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidelog.errors import InvalidArgument, StreamEmpty
from tidelog.log import CommitLog


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


def resolve(log: CommitLog, request: SubscribeRequest) -> Bounds:
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
    log: CommitLog,
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
    if stop_timestamp is not None and log.offset_at_or_after_timestamp(stop_timestamp) is not None:
        # The log has reached the stop time: stop after the last message at or before it, now
        # known (as Liftbridge resolves STOP_TIMESTAMP). Waiting for a later timestamp instead
        # would hold a read whose newest messages share the stop's timestamp until another
        # message arrives.
        found = log.offset_at_or_before_timestamp(stop_timestamp)
        if found is None or found < offset:
            return Bounds(offset, found, None, reverse=False, empty=True)
        stop_offset, stop_timestamp = found, None
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
    log: CommitLog,
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
