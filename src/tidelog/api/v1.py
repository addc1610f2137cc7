"""The ``tidelog.v1`` service: batched, columnar publish and subscribe for throughput."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Final

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.access import caller
from tidelog.api.browse_service import BrowseService
from tidelog.api.consume import consume
from tidelog.api.describe_service import DescribeService
from tidelog.api.draining import until_draining
from tidelog.api.framed import Framed, outbound_of, takes_framed
from tidelog.api.frames import (
    END_REASONS,
    encoded_record_batch,
    framed_record_batch,
    record_batch_without_values,
)
from tidelog.api.inflight import InFlight
from tidelog.api.metrics import Metrics
from tidelog.api.site_service import SiteService
from tidelog.api.status import is_refusal, log_failure, status_of
from tidelog.api.view_service import ViewService
from tidelog.broker import (
    MessageBatch,
    NewRecord,
    PackedValues,
    StartPosition,
    StopPosition,
    SubscribeRequest,
    delivery_gate,
)
from tidelog.control import Control
from tidelog.errors import InvalidArgument, ReadonlyEnd, StopReached
from tidelog.wire import columns

Context = grpc.aio.ServicerContext[object, object]


SMALL_BATCH: Final = 16
"""Up to this many values a batch is appended as a list of ``bytes`` (``columns.unpack``): for a
live publisher's handful, numpy's fixed cost per call (``PackedValues``) outweighs what it saves
per value."""


def _batch(messages: v1.Messages) -> Sequence[bytes | NewRecord]:
    """The records a publish appends, from its columns (``ValueError`` on malformed ones)."""
    if len(messages.value_sizes) <= 4 * SMALL_BATCH and not messages.values_omitted:
        values, keys, headers = columns.unpack(messages)
        if keys is None and headers is None:
            return values
    else:
        plain = columns.plain_values(messages)
        if plain is not None:
            return PackedValues(*plain)  # appended without one object per value
        values, keys, headers = columns.unpack(messages)
    return [
        NewRecord(
            value,
            key=None if keys is None else keys[i],
            headers=headers[i] if headers is not None else {},
        )
        for i, value in enumerate(values)
    ]


class TidelogService(
    ViewService, SiteService, BrowseService, DescribeService, v1_grpc.TidelogServicer
):
    """tidelog's own calls translated onto the control; every call reaches it through the guard,
    which maps errors to statuses."""

    def __init__(
        self, control: Control, metrics: Metrics | None = None, inflight: InFlight | None = None
    ) -> None:
        self.control = control
        self._latency = None if metrics is None else metrics.publish_latency.labels("tidelog.v1")
        self._inflight = inflight or InFlight()

    async def _publish(self, request: v1.PublishBatchRequest) -> v1.PublishBatchResponse:
        started = time.perf_counter()
        if not request.stream:
            raise InvalidArgument("publish needs a stream name")
        if request.ack_policy not in (v1.ACK_POLICY_LEADER, v1.ACK_POLICY_ALL, v1.ACK_POLICY_NONE):
            raise InvalidArgument(f"unknown ack_policy {request.ack_policy}")
        batch = _batch(request.messages)
        expected_offset = request.expected_offset if request.expected_offset >= 0 else None
        durable = request.ack_policy == v1.ACK_POLICY_ALL
        duplicate = False
        if request.producer_id or request.producer_sequence:
            # NONE too: an unacknowledged batch with a producer id is still deduplicated.
            published = await self.control.publish_idempotent(
                request.stream,
                request.partition,
                batch,
                request.producer_id,
                request.producer_sequence,
                expected_offset=expected_offset,
                durable=durable,
                owner=caller().identity,
            )
            offsets, duplicate = published.offsets, published.duplicate
        else:
            published = await self.control.publish(
                request.stream,
                request.partition,
                batch,
                expected_offset=expected_offset,
                durable=durable,
            )
            offsets = published.offsets
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - started)
        if request.ack_policy == v1.ACK_POLICY_NONE:
            return v1.PublishBatchResponse()
        return v1.PublishBatchResponse(
            first_offset=offsets.start, count=len(offsets), duplicate=duplicate
        )

    async def PublishBatch(
        self, request: v1.PublishBatchRequest, context: Context
    ) -> v1.PublishBatchResponse:
        async with self._inflight.admit(context, request):  # bytes in flight (inflight.py)
            return await self._publish(request)

    async def PublishStream(
        self, request_iterator: AsyncIterator[v1.PublishBatchRequest], context: Context
    ) -> AsyncIterator[v1.PublishBatchResponse]:
        # A drain ends the stream: UNAVAILABLE. Bytes in flight: read on once they fit.
        pacer = self._inflight.pacer(context)
        try:
            async for request in until_draining(self.control, request_iterator):
                await pacer.take(request)
                answer = await self._answer(request)
                pacer.done(1)
                yield answer
        finally:
            pacer.close()

    async def _answer(self, request: v1.PublishBatchRequest) -> v1.PublishBatchResponse:
        """One ``PublishStream`` request's response: a refusal is answered in the response,
        and the stream stays open."""
        try:
            return await self._publish(request)
        except Exception as error:
            if not is_refusal(error):
                raise
            log_failure(error)
            code, detail = status_of(error)
            if isinstance(error, ValueError | TypeError):
                code = grpc.StatusCode.INVALID_ARGUMENT
            return v1.PublishBatchResponse(error_code=code.value[0], error_message=detail)

    async def SubscribeBatches(  # type: ignore[override]  # frames may come serialised
        self, request: v1.SubscribeBatchesRequest, context: Context
    ) -> AsyncIterator[v1.RecordBatch | bytes | Framed]:
        if request.without_value_sizes and not request.without_values:
            raise InvalidArgument(
                "without_value_sizes needs without_values: a frame with values has their sizes"
            )
        subscription = await self.control.subscribe(
            request.stream,
            request.partition,
            SubscribeRequest(
                start=StartPosition(request.start_position),
                start_offset=request.start_offset,
                start_timestamp=request.start_timestamp,
                stop=StopPosition(request.stop_position),
                stop_offset=request.stop_offset,
                stop_timestamp=request.stop_timestamp,
                reverse=request.reverse,
            ),
            resume=request.resume,
            max_messages=request.max_messages or None,
            max_bytes=request.max_bytes or None,
        )
        timestamps = not request.without_timestamps
        framed: Callable[[MessageBatch], v1.RecordBatch | bytes | Framed] = partial(
            encoded_record_batch, timestamps=timestamps
        )
        if takes_framed(context):  # the records' bytes go out as read, not joined into a frame
            framed = partial(framed_record_batch, timestamps=timestamps)
        if request.without_values:
            framed = partial(
                record_batch_without_values,
                timestamps=timestamps,
                value_sizes=not request.without_value_sizes,
            )
            subscription.send_without_values()  # fewer, larger frames: see its docstring
        elif not request.max_messages and not request.max_bytes:
            outbound = outbound_of(context)  # when each frame has left the call (native only)
            if outbound is not None:
                subscription.send_whole_spans(outbound)  # catch-up frames up to 1 MiB: docstring
        yield v1.RecordBatch()  # the handshake: the subscription exists
        gate = delivery_gate()
        try:
            async for batch in subscription.batches():
                frame = framed(batch)
                turn = await gate.turn()  # one send per frame (broker/delivery.py)
                try:
                    yield frame
                    turn.progress()
                finally:
                    turn.release()
        except (StopReached, ReadonlyEnd):
            pass  # ended by itself: the reason is on the subscription
        yield v1.RecordBatch(end=END_REASONS[subscription.end_reason])

    async def Consume(
        self, request_iterator: AsyncIterator[v1.ConsumeRequest], context: Context
    ) -> AsyncIterator[v1.ConsumeBatch]:
        async for batch in consume(self.control, request_iterator):
            yield batch
