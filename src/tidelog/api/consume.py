"""One ``tidelog.v1/Consume`` call: requests in, epoch-stamped batches out.

Theory. The client owns the epoch. It raises it before it drops its buffered messages and only
then sends ``Seek(epoch, position)``; the broker's seekable subscription switches to the new
position and stamps every batch with the epoch current **when the batch was read**. A batch read
before the seek (even one still in flight, or delayed) therefore carries an older epoch, and the
client drops it; the first batch the client accepts after a seek starts at the seek position.
Permits bound what the server sends: it never reads more than the client granted, and a seek
resets the grant to the amount the seek carries.

This module only translates: the reading, the permits and the seeks are the broker's
(``tidelog.broker.subscription``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.api.frames import END_REASONS, record_batch
from tidelog.broker import (
    DEFAULT_CONSUME_BATCH_MESSAGES,
    StartPosition,
    StopPosition,
    SubscribeRequest,
    Subscription,
)
from tidelog.control import Control
from tidelog.errors import InvalidArgument, PermissionDenied, TidelogError


def _position(reverse: bool, kind: int, offset: int, timestamp: int) -> SubscribeRequest:
    return SubscribeRequest(
        start=StartPosition(kind),
        start_offset=offset,
        start_timestamp=timestamp,
        stop=StopPosition.ON_CANCEL,
        reverse=reverse,
    )


async def consume(
    control: Control, requests: AsyncIterator[v1.ConsumeRequest]
) -> AsyncIterator[v1.ConsumeBatch]:
    """Serve one Consume call: the first request opens it, later ones grant permits or seek."""
    try:
        first = await anext(requests, None)
    except PermissionDenied:  # the guard's check of the frame
        raise
    except Exception as error:  # an unparsable frame
        raise InvalidArgument(f"malformed Consume request: {error!r}") from None
    if first is None or first.WhichOneof("kind") != "start":
        raise InvalidArgument("a Consume call starts with a ConsumeStart request")
    start = first.start
    reverse = start.reverse
    subscription = control.consume(
        start.stream,
        start.partition,
        _position(reverse, start.start_position, start.start_offset, start.start_timestamp),
        max_messages=start.max_messages or DEFAULT_CONSUME_BATCH_MESSAGES,
    )
    failure: list[BaseException] = []
    pump = asyncio.create_task(_pump(requests, subscription, reverse, failure))
    try:
        async for batch in subscription.batches():
            if batch:
                frame = record_batch(batch)
            else:  # the subscription stopped (a reverse read passed the oldest record)
                frame = v1.RecordBatch(end=END_REASONS[subscription.end_reason])
            yield v1.ConsumeBatch(epoch=subscription.batch_epoch, batch=frame)
        if failure:
            raise failure[0]
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


async def _pump(
    requests: AsyncIterator[v1.ConsumeRequest],
    subscription: Subscription,
    reverse: bool,
    failure: list[BaseException],
) -> None:
    """Apply the client's later requests to the subscription; end it when they end."""
    try:
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "permits":
                subscription.grant(request.permits)
            elif kind == "seek":
                seek = request.seek
                if seek.epoch <= subscription.epoch:
                    continue  # a stale seek, from before a newer one
                subscription.seek(
                    _position(reverse, seek.position, seek.offset, seek.timestamp),
                    epoch=seek.epoch,
                    permits=seek.permits,
                )
            else:
                raise InvalidArgument("ConsumeStart may only open a Consume call")
    except TidelogError as error:
        failure.append(error)
    except Exception as error:  # an unparsable frame
        failure.append(InvalidArgument(f"malformed Consume request: {error!r}"))
    finally:
        subscription.cancel()
