"""The Liftbridge-compatible ``proto.API`` service on top of the broker.

Behaviour follows Liftbridge where it is sound; where tidelog chooses differently it says so in
``docs/api.md`` ("Differences from Liftbridge"). In short: every Publish is acknowledged (no
fire-and-forget without a deadline), a reverse subscription ends with OK after the oldest message
instead of UNKNOWN "EOF", no ``subject``/``reply`` headers are injected into stored messages,
``PublishToSubject`` is routed by the broker over the streams' subjects (no NATS), and every
failed PublishAsync request is answered whatever its ack policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.api.draining import DRAINED
from tidelog.api.metrics import Metrics
from tidelog.api.status import (
    as_tidelog_error,
    handed_over,
    is_refusal,
    log_failure,
    status_of,
)
from tidelog.broker import (
    MessageBatch,
    NewRecord,
    Partition,
    Published,
    StartPosition,
    StopPosition,
    StreamConfig,
    delivery_gate,
)
from tidelog.broker import SubscribeRequest as BrokerSubscribe
from tidelog.control import BrokerInfo, Control, Forwarded, PartitionInfo, StreamInfo
from tidelog.errors import (
    FailedPrecondition,
    IncorrectOffset,
    InvalidArgument,
    MessageTooLarge,
    NotLeader,
    PartitionNotFound,
    PartitionReadonly,
    PermissionDenied,
    StreamNotFound,
    SubjectNotFound,
    TidelogError,
)
from tidelog.wire import FORWARDED

Context = grpc.aio.ServicerContext[object, object]

_log = logging.getLogger(__name__)

# Coalesce at most this many queued PublishAsync requests into one append.
_ASYNC_BATCH = 1000


def _ms(value: pb.NullableInt64, present: bool) -> float | None:
    return value.value / 1000 if present and value.value > 0 else None


def stream_config(request: pb.CreateStreamRequest) -> StreamConfig:
    """A Liftbridge CreateStreamRequest as tidelog stream settings (unsupported options refused;
    the replication factor and minIsr are the control's to check)."""
    if request.HasField("encryption") and request.encryption.value:
        raise InvalidArgument("encryption at rest is not available in this tidelog release")
    has = request.HasField
    return StreamConfig(
        partitions=request.partitions or 1,
        subject=request.subject,
        group=request.group,
        retention_bytes=request.retentionMaxBytes.value if has("retentionMaxBytes") else None,
        retention_messages=(
            request.retentionMaxMessages.value if has("retentionMaxMessages") else None
        ),
        retention_age_s=_ms(request.retentionMaxAge, has("retentionMaxAge")),
        segment_max_bytes=request.segmentMaxBytes.value if has("segmentMaxBytes") else None,
        segment_max_age_s=_ms(request.segmentMaxAge, has("segmentMaxAge")),
        optimistic_concurrency=(
            has("optimisticConcurrencyControl") and request.optimisticConcurrencyControl.value
        ),
        auto_pause_s=_ms(request.autoPauseTime, has("autoPauseTime")),
        compact=has("compactEnabled") and request.compactEnabled.value,
    )


def partition_metadata(info: PartitionInfo) -> pb.PartitionMetadata:
    """A partition as Liftbridge describes it; offsets -1 when this broker holds no replica."""
    partition = info.local
    if partition is None:
        return pb.PartitionMetadata(
            id=info.number,
            leader=info.leader,
            replicas=list(info.replicas),
            isr=list(info.isr),
            highWatermark=-1,
            newestOffset=-1,
            readonly=info.readonly,
        )
    stats = partition.stats
    return pb.PartitionMetadata(
        id=info.number,
        leader=info.leader,
        replicas=list(info.replicas),
        isr=list(info.isr),
        highWatermark=partition.high_watermark,
        newestOffset=partition.newest_offset,
        paused=partition.paused,
        readonly=partition.readonly,
        messagesReceivedTimestamps=pb.PartitionEventTimestamps(
            firstTimestamp=stats.first_message_received,
            latestTimestamp=stats.latest_message_received,
        ),
        pauseTimestamps=pb.PartitionEventTimestamps(
            firstTimestamp=stats.first_paused, latestTimestamp=stats.latest_paused
        ),
        readonlyTimestamps=pb.PartitionEventTimestamps(
            firstTimestamp=stats.first_readonly, latestTimestamp=stats.latest_readonly
        ),
    )


def _broker(info: BrokerInfo) -> pb.Broker:
    return pb.Broker(
        id=info.broker_id,
        host=info.host,
        port=info.port,
        partitionCount=info.partitions,
        leaderCount=info.leading,
    )


def _stream_metadata(name: str, info: StreamInfo | None) -> pb.StreamMetadata:
    if info is None:
        return pb.StreamMetadata(name=name, error=pb.StreamMetadata.UNKNOWN_STREAM)
    return pb.StreamMetadata(
        name=name,
        subject=info.subject,
        creationTimestamp=info.created_ns,
        partitions={n: partition_metadata(p) for n, p in info.partitions.items()},
    )


def _check_ack_policy(policy: int) -> None:
    if policy not in (pb.LEADER, pb.ALL, pb.NONE):
        raise InvalidArgument(f"unknown ackPolicy {policy}: use LEADER (0), ALL (1) or NONE (2)")


# Liftbridge's exact texts: Go clients have no sentinel errors for these and compare the text.
INCORRECT_OFFSET_TEXT = "incorrect expected offset"
OCC_NEEDS_ACK_TEXT = "stream with concurrency control must have AckPolicy set"


def _liftbridge_text(error: IncorrectOffset) -> str:
    """The conflict as Liftbridge words it; tidelog's explanation (which offset the partition
    is at) goes to the server's debug log."""
    _log.debug("publish refused: %s", error)
    return INCORRECT_OFFSET_TEXT


FORWARD_TIMEOUT_S = 30.0
"""How long a publish handed to the partition's leader may take when the caller set no deadline."""


def _message(request: pb.PublishRequest | pb.PublishToSubjectRequest) -> bytes | NewRecord:
    if not request.key and not request.headers:
        return request.value
    return NewRecord(request.value, key=request.key or None, headers=dict(request.headers))


def _async_error(error: BaseException) -> pb.PublishAsyncError:
    codes = pb.PublishAsyncError
    error = as_tidelog_error(error)  # a raw OSError for a full disk: as DiskFull
    if isinstance(error, StreamNotFound | PartitionNotFound):
        code = codes.NOT_FOUND
    elif isinstance(error, PartitionReadonly):
        code = codes.READONLY
    elif isinstance(error, IncorrectOffset):
        return pb.PublishAsyncError(code=codes.INCORRECT_OFFSET, message=_liftbridge_text(error))
    elif isinstance(error, PermissionDenied):
        code = codes.PERMISSION_DENIED
    elif isinstance(error, InvalidArgument | MessageTooLarge):
        code = codes.BAD_REQUEST
    elif isinstance(error, TidelogError):
        code = codes.INTERNAL
    else:
        code = codes.UNKNOWN
    return pb.PublishAsyncError(code=code, message=status_of(error)[1])


def _failure_response(
    request: pb.PublishRequest, failure: pb.PublishAsyncError
) -> pb.PublishResponse:
    """A failed request's answer, shaped as Liftbridge's: the error, the request's correlation
    id, and an ack with an empty correlation id (older clients look for an ack in every
    response)."""
    return pb.PublishResponse(
        asyncError=failure, correlationId=request.correlationId, ack=pb.Ack(correlationId="")
    )


class LiftbridgeService(pb_grpc.APIServicer):
    """Liftbridge's calls translated onto the control (module docstring); every call reaches
    it through the guard, which maps errors to statuses."""

    def __init__(self, control: Control, metrics: Metrics | None = None) -> None:
        self.control = control
        self._latency = None if metrics is None else metrics.publish_latency.labels("liftbridge")

    def _observe(self, started: float) -> None:
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - started)

    # -- streams ---------------------------------------------------------------------------------

    async def CreateStream(
        self, request: pb.CreateStreamRequest, context: Context
    ) -> pb.CreateStreamResponse:
        min_isr = request.minIsr.value if request.HasField("minIsr") else 1
        await self.control.create_stream(
            request.name, stream_config(request), request.replicationFactor, min_isr
        )
        return pb.CreateStreamResponse()

    async def DeleteStream(
        self, request: pb.DeleteStreamRequest, context: Context
    ) -> pb.DeleteStreamResponse:
        await self.control.delete_stream(request.name)
        return pb.DeleteStreamResponse()

    async def PauseStream(
        self, request: pb.PauseStreamRequest, context: Context
    ) -> pb.PauseStreamResponse:
        self.control.pause(request.name, list(request.partitions), request.resumeAll)
        return pb.PauseStreamResponse()

    async def SetStreamReadonly(
        self, request: pb.SetStreamReadonlyRequest, context: Context
    ) -> pb.SetStreamReadonlyResponse:
        await self.control.set_readonly(request.name, list(request.partitions), request.readonly)
        return pb.SetStreamReadonlyResponse()

    # -- metadata --------------------------------------------------------------------------------

    async def _group_metadata(self, group_id: str) -> pb.ConsumerGroupMetadata:
        found = await self.control.group_coordinator(group_id)
        if found is None:
            return pb.ConsumerGroupMetadata(
                groupId=group_id, error=pb.ConsumerGroupMetadata.UNKNOWN_GROUP
            )
        return pb.ConsumerGroupMetadata(groupId=group_id, coordinator=found[0], epoch=found[1])

    async def FetchMetadata(
        self, request: pb.FetchMetadataRequest, context: Context
    ) -> pb.FetchMetadataResponse:
        control = self.control
        names = list(request.streams) or control.stream_names()
        return pb.FetchMetadataResponse(
            brokers=[_broker(b) for b in control.brokers()],
            streamMetadata=[_stream_metadata(n, control.describe_stream(n)) for n in names],
            groupMetadata=[await self._group_metadata(g) for g in request.groups],
        )

    async def FetchPartitionMetadata(
        self, request: pb.FetchPartitionMetadataRequest, context: Context
    ) -> pb.FetchPartitionMetadataResponse:
        info = self.control.describe_partition(request.stream, request.partition)
        return pb.FetchPartitionMetadataResponse(metadata=partition_metadata(info))

    # -- publishing ------------------------------------------------------------------------------

    def _check_publish(self, request: pb.PublishRequest) -> None:
        """Liftbridge's checks before a publish, answered whatever the ack policy: a stream
        name, a known ack policy, and an ack policy on streams with optimistic concurrency
        (checked after the partition exists and is writable, as Liftbridge orders them)."""
        if not request.stream:
            raise InvalidArgument("publish needs a stream name")
        _check_ack_policy(request.ackPolicy)
        if request.ackPolicy != pb.NONE:
            return
        stream = self.control.find_stream(request.stream)
        if stream is not None and stream.config.optimistic_concurrency:
            partition = stream.partition(request.partition)
            if partition.readonly:
                raise PartitionReadonly(request.stream, request.partition)
            raise InvalidArgument(OCC_NEEDS_ACK_TEXT)

    def _ack(
        self, request: pb.PublishRequest, offset: int, received: int, committed: int
    ) -> pb.Ack:
        subject = self.control.stream(request.stream).subject
        return pb.Ack(
            stream=request.stream,
            partitionSubject=subject
            if request.partition == 0
            else f"{subject}.{request.partition}",
            msgSubject=subject,
            offset=offset,
            ackInbox=request.ackInbox,
            correlationId=request.correlationId,
            ackPolicy=request.ackPolicy,
            receptionTimestamp=received,
            commitTimestamp=committed,
        )

    async def Publish(self, request: pb.PublishRequest, context: Context) -> pb.PublishResponse:
        started = time.perf_counter()
        self._check_publish(request)
        try:
            published = await self.control.publish(
                request.stream,
                request.partition,
                [_message(request)],
                expected_offset=request.expectedOffset if request.expectedOffset >= 0 else None,
                durable=request.ackPolicy == pb.ALL,
            )
        except IncorrectOffset as error:
            raise FailedPrecondition(_liftbridge_text(error)) from None
        except NotLeader as error:
            # Liftbridge takes a publish on any broker: hand it to the leader, once (a publish
            # handed here is refused, so two brokers with stale views never pass it around).
            if handed_over(context):
                raise
            return await self._forward(request, error, context.time_remaining())
        self._observe(started)
        if request.ackPolicy == pb.NONE:
            return pb.PublishResponse()
        stored = published.timestamp
        ack = self._ack(request, published.offsets[0], stored, max(stored, time.time_ns()))
        return pb.PublishResponse(ack=ack, correlationId=request.correlationId)

    async def _forward(
        self, request: pb.PublishRequest, refusal: NotLeader, timeout: float | None
    ) -> pb.PublishResponse:
        """A publish sent to a broker of a cluster that does not lead its partition, published
        on the leader (Liftbridge clients publish on any broker); the refusal if none leads."""

        async def publish(channel: grpc.aio.Channel) -> pb.PublishResponse:
            response: pb.PublishResponse = await pb_grpc.APIStub(channel).Publish(
                request,
                timeout=FORWARD_TIMEOUT_S if timeout is None else timeout,
                metadata=((FORWARDED, "1"),),
            )
            return response

        return await self.control.on_leader(request.stream, request.partition, refusal, publish)

    async def _publish_run(self, run: Sequence[pb.PublishRequest]) -> list[pb.PublishResponse]:
        """Append consecutive requests for one partition as one batch; one response each."""
        first = run[0]
        started = time.perf_counter()
        try:
            self._check_publish(first)
            published = await self.control.publish(
                first.stream,
                first.partition,
                [_message(r) for r in run],
                expected_offset=first.expectedOffset if first.expectedOffset >= 0 else None,
                durable=any(r.ackPolicy == pb.ALL for r in run),
            )
        except Exception as error:
            if isinstance(error, NotLeader):
                return [await self._forward_async(r, error) for r in run]
            if not is_refusal(error):
                raise
            if len(run) > 1:
                # Nothing of the run was written (appends are all or nothing): publish each
                # request alone, so only the bad one fails.
                responses: list[pb.PublishResponse] = []
                for request in run:
                    responses += await self._publish_run([request])
                return responses
            log_failure(error)
            # Answered whatever the ack policy (as Liftbridge answers request errors): a
            # publisher that asked for no ack still learns that nothing was written.
            return [_failure_response(first, _async_error(error))]
        received = published.timestamp
        committed = max(received, time.time_ns())
        self._observe(started)
        return [
            pb.PublishResponse(
                ack=self._ack(r, offset, received, committed), correlationId=r.correlationId
            )
            for r, offset in zip(run, published.offsets, strict=True)
            if r.ackPolicy != pb.NONE
        ]

    async def _forward_async(
        self, request: pb.PublishRequest, refusal: NotLeader
    ) -> pb.PublishResponse:
        """One PublishAsync request published on the leader, answered as PublishAsync does."""
        try:
            forwarded = await self._forward(request, refusal, None)
        except (NotLeader, Forwarded) as error:
            log_failure(error)
            return _failure_response(request, _async_error(error))
        if request.ackPolicy == pb.NONE:
            return pb.PublishResponse(correlationId=request.correlationId)
        return forwarded

    def _checks_offsets(self, stream: str) -> bool:
        found = self.control.find_stream(stream)
        return found is not None and found.config.optimistic_concurrency

    async def _publish_group(self, requests: list[pb.PublishRequest]) -> list[pb.PublishResponse]:
        """Append runs of consecutive requests for one partition together. On streams with
        optimistic concurrency each request is its own run: each carries its own expectation."""
        responses: list[pb.PublishResponse] = []
        run: list[pb.PublishRequest] = []
        for request in requests:
            same = (
                run
                and request.stream == run[0].stream
                and request.partition == run[0].partition
                and request.ackPolicy in (pb.LEADER, pb.ALL, pb.NONE)
                and not self._checks_offsets(request.stream)
            )
            if run and not same:
                responses += await self._publish_run(run)
                run = []
            run.append(request)
        if run:
            responses += await self._publish_run(run)
        return responses

    async def PublishAsync(
        self, request_iterator: AsyncIterator[pb.PublishRequest], context: Context
    ) -> AsyncIterator[pb.PublishResponse]:
        """One response per request with an ack policy other than NONE. Requests that arrive
        together are appended together (one write per partition), in order."""
        queue: asyncio.Queue[pb.PublishRequest | None] = asyncio.Queue(maxsize=4 * _ASYNC_BATCH)
        broken: list[BaseException] = []

        async def pump() -> None:
            try:
                async for request in request_iterator:
                    await queue.put(request)
            except Exception as error:  # an unparsable frame ends the call
                broken.append(error)
            # Not in a ``finally``: once the call is gone (cancelled, or closed at a ``yield``
            # whose client vanished) nobody empties a full queue, and this put would wait forever,
            # keeping the task, its queue and the call alive.
            await queue.put(None)

        def stop_reading() -> None:
            # Shutdown: stop at the next request. Requests still queued were not appended and
            # get no ack, so the client knows to publish them again. A full queue is drained by
            # the loop below, which checks ``broker.draining`` before each group.
            reader.cancel()
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

        reader = asyncio.create_task(pump())
        withdraw = self.control.when_draining(stop_reading)
        try:
            ended = False
            while not ended and not self.control.draining:
                head = await queue.get()
                if head is None:
                    break
                group = [head]
                while len(group) < _ASYNC_BATCH and not queue.empty():
                    item = queue.get_nowait()
                    if item is None:
                        ended = True
                        break
                    group.append(item)
                for response in await self._publish_group(group):
                    yield response
            if self.control.draining:
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINED)
            if broken:
                error = broken[0]
                if isinstance(error, PermissionDenied):  # the guard refused a frame
                    raise error
                detail = str(error) if isinstance(error, TidelogError) else repr(error)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed PublishAsync request; the requests before it were published: "
                    f"{detail}",
                )
        finally:
            withdraw()
            reader.cancel()

    async def PublishToSubject(
        self, request: pb.PublishToSubjectRequest, context: Context
    ) -> pb.PublishToSubjectResponse:
        """Append to every stream partition listening on the subject (one stream of each
        load-balance group); the ack is the first one's, in stream-name order."""
        if not request.subject:
            raise InvalidArgument("publish to a subject needs a subject")
        _check_ack_policy(request.ackPolicy)
        targets = self.control.subject_targets(request.subject)
        if not targets:
            raise SubjectNotFound(request.subject)
        message = _message(request)
        first: tuple[Partition, Published] | None = None
        failures: list[Exception] = []
        for target in targets:
            try:
                published = await self.control.publish(
                    target.stream,
                    target.number,
                    [message],
                    durable=request.ackPolicy == pb.ALL,
                )
            except Exception as error:
                if not is_refusal(error):
                    raise
                failures.append(error)
                continue
            first = first or (target, published)
        if first is None:
            raise failures[0]
        for failure in failures:  # stored elsewhere: the publisher cannot be told more
            _log.warning("publish to subject %r: %s", request.subject, failure)
        if request.ackPolicy == pb.NONE:
            return pb.PublishToSubjectResponse()
        target, published = first
        stored = published.timestamp
        return pb.PublishToSubjectResponse(
            ack=pb.Ack(
                stream=target.stream,
                partitionSubject=request.subject,
                msgSubject=request.subject,
                offset=published.offsets[0],
                ackInbox=request.ackInbox,
                correlationId=request.correlationId,
                ackPolicy=request.ackPolicy,
                receptionTimestamp=stored,
                commitTimestamp=max(stored, time.time_ns()),
            )
        )

    # -- subscribing -----------------------------------------------------------------------------

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: Context
    ) -> AsyncIterator[pb.Message]:
        consumer = request.consumer
        group = None
        if consumer.groupId:
            if not consumer.consumerId:
                raise InvalidArgument("a group subscription needs a consumerId")
            group = (consumer.groupId, consumer.consumerId, consumer.groupEpoch)
        start_offset = request.startOffset
        if request.startPosition == pb.OFFSET:
            # As Liftbridge: a negative start counts as 0 (gufo-liftbridge sends -1 for a
            # cursor never set), and a start beyond the high watermark starts at the next
            # message. tidelog.v1 refuses the first and waits for the offset in the second.
            start_offset = max(start_offset, 0)
            if not request.reverse:
                partition = self.control.partition(request.stream, request.partition)
                start_offset = min(start_offset, partition.high_watermark + 1)
        subscription = await self.control.subscribe(
            request.stream,
            request.partition,
            BrokerSubscribe(
                start=StartPosition(request.startPosition),
                start_offset=start_offset,
                start_timestamp=request.startTimestamp,
                stop=StopPosition(request.stopPosition),
                stop_offset=request.stopOffset,
                stop_timestamp=request.stopTimestamp,
                reverse=request.reverse,
            ),
            resume=request.resume,
            group=group,
            read_replica=request.readISRReplica,
        )
        subject = self.control.stream(request.stream).subject
        name, number = request.stream, request.partition
        yield pb.Message()  # the handshake: the subscription exists
        gate = delivery_gate()
        async for batch in subscription.batches():
            # One send per message: take a turn for the batch (broker/delivery.py).
            turn = await gate.turn()
            try:
                for message in _messages(batch, name, number, subject):
                    yield message
                    turn.progress()
            finally:
                turn.release()

    # -- cursors ---------------------------------------------------------------------------------

    async def SetCursor(
        self, request: pb.SetCursorRequest, context: Context
    ) -> pb.SetCursorResponse:
        store = await self.control.cursors()
        await store.set(request.cursorId, request.stream, request.partition, request.offset)
        return pb.SetCursorResponse()

    async def FetchCursor(
        self, request: pb.FetchCursorRequest, context: Context
    ) -> pb.FetchCursorResponse:
        store = await self.control.cursors()
        offset = await store.fetch(request.cursorId, request.stream, request.partition)
        return pb.FetchCursorResponse(offset=offset)

    # -- consumer groups -------------------------------------------------------------------------

    async def JoinConsumerGroup(
        self, request: pb.JoinConsumerGroupRequest, context: Context
    ) -> pb.JoinConsumerGroupResponse:
        coordinator, epoch = await self.control.join_group(
            request.groupId, request.consumerId, list(request.streams)
        )
        consumer_timeout, coordinator_timeout = self.control.group_timeouts
        return pb.JoinConsumerGroupResponse(
            coordinator=coordinator,
            epoch=epoch,
            consumerTimeout=int(consumer_timeout * 1e9),
            coordinatorTimeout=int(coordinator_timeout * 1e9),
        )

    async def LeaveConsumerGroup(
        self, request: pb.LeaveConsumerGroupRequest, context: Context
    ) -> pb.LeaveConsumerGroupResponse:
        await self.control.leave_group(request.groupId, request.consumerId)
        return pb.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(
        self, request: pb.FetchConsumerGroupAssignmentsRequest, context: Context
    ) -> pb.FetchConsumerGroupAssignmentsResponse:
        epoch, assigned = await self.control.fetch_assignments(
            request.groupId, request.consumerId, request.epoch
        )
        return pb.FetchConsumerGroupAssignmentsResponse(
            epoch=epoch,
            assignments=[
                pb.PartitionAssignment(stream=stream, partitions=partitions)
                for stream, partitions in sorted(assigned.items())
            ],
        )

    async def ReportConsumerGroupCoordinator(
        self, request: pb.ReportConsumerGroupCoordinatorRequest, context: Context
    ) -> pb.ReportConsumerGroupCoordinatorResponse:
        await self.control.report_coordinator(
            request.groupId,
            request.consumerId,
            request.coordinator,
            request.epoch,
            handed=handed_over(context),
        )
        return pb.ReportConsumerGroupCoordinatorResponse()


def _messages(
    batch: MessageBatch, stream: str, partition: int, subject: str
) -> Iterator[pb.Message]:
    """The batch as Liftbridge messages, each value cut from the batch only when its message is
    built: a subscription holds its batch, not a second copy of it."""
    starts, lengths = batch.value_spans()
    keys = batch.keys() if batch.has_keys() else None
    headers = batch.headers() if batch.has_headers() else None
    data = batch.data
    for i, (offset, timestamp, start, length) in enumerate(
        zip(
            batch.offsets.tolist(),
            batch.timestamps.tolist(),
            starts.tolist(),
            lengths.tolist(),
            strict=True,
        )
    ):
        message = pb.Message(
            offset=offset,
            value=data[start : start + length],
            timestamp=timestamp,
            stream=stream,
            partition=partition,
            subject=subject,
        )
        if keys is not None and keys[i]:
            message.key = keys[i]  # type: ignore[assignment]
        if headers is not None and headers[i]:
            message.headers.update(headers[i])
        yield message
