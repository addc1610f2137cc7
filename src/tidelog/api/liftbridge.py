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
from dataclasses import dataclass

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.api.draining import DRAINED
from tidelog.api.metrics import Metrics
from tidelog.api.status import (
    Forwarded,
    as_tidelog_error,
    grpc_errors,
    handed_over,
    is_refusal,
    log_failure,
    status_of,
)
from tidelog.broker import (
    Broker,
    CursorStore,
    MessageBatch,
    NewRecord,
    Partition,
    Published,
    StartPosition,
    StopPosition,
    StreamConfig,
    delivery_gate,
    validate_stream_name,
)
from tidelog.broker import SubscribeRequest as BrokerSubscribe
from tidelog.cluster.metadata import PartitionState
from tidelog.cluster.node import ClusterNode
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

Context = grpc.aio.ServicerContext[object, object]

_log = logging.getLogger(__name__)

# Coalesce at most this many queued PublishAsync requests into one append.
_ASYNC_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Advertised:
    """How this broker names itself in metadata."""

    broker_id: str
    host: str
    port: int


def _ms(value: pb.NullableInt64, present: bool) -> float | None:
    return value.value / 1000 if present and value.value > 0 else None


def stream_config(request: pb.CreateStreamRequest, clustered: bool = False) -> StreamConfig:
    """A Liftbridge CreateStreamRequest as tidelog stream settings (unsupported options refused;
    on a cluster the replication factor and minIsr are the controller's to check)."""
    if not clustered and request.replicationFactor not in (-1, 0, 1):
        raise InvalidArgument(
            f"replication factor {request.replicationFactor} exceeds the cluster size: this "
            f"tidelog server is a single broker (use 1, 0 or -1)"
        )
    if not clustered and request.HasField("minIsr") and request.minIsr.value > 1:
        raise InvalidArgument(f"minIsr {request.minIsr.value} exceeds the cluster size of 1")
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


def partition_metadata(
    partition: Partition, broker_id: str, state: PartitionState | None = None
) -> pb.PartitionMetadata:
    """A partition as Liftbridge describes it; ``state``: its replicas in a cluster."""
    stats = partition.stats
    return pb.PartitionMetadata(
        id=partition.number,
        leader=broker_id if state is None else state.leader,
        replicas=[broker_id] if state is None else list(state.replicas),
        isr=[broker_id] if state is None else list(state.isr),
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
    def __init__(
        self,
        broker: Broker,
        advertised: Advertised,
        metrics: Metrics | None = None,
        cluster: ClusterNode | None = None,
    ) -> None:
        self.broker = broker
        self.advertised = advertised
        self.cluster = cluster
        """This broker's node when it is part of a cluster (``tidelog.cluster``)."""
        self._latency = None if metrics is None else metrics.publish_latency.labels("liftbridge")

    def _observe(self, started: float) -> None:
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - started)

    # -- streams ---------------------------------------------------------------------------------

    async def CreateStream(
        self, request: pb.CreateStreamRequest, context: Context
    ) -> pb.CreateStreamResponse:
        async with grpc_errors(context):
            config = stream_config(request, clustered=self.cluster is not None)
            if self.cluster is not None:
                validate_stream_name(request.name)
                min_isr = request.minIsr.value if request.HasField("minIsr") else 1
                await self.cluster.create_stream(
                    request.name, config, request.replicationFactor, min_isr
                )
                return pb.CreateStreamResponse()
            await self.broker.wait_deleted(request.name)  # a delete of that name in progress
            self.broker.create_stream(request.name, config)
        return pb.CreateStreamResponse()

    async def DeleteStream(
        self, request: pb.DeleteStreamRequest, context: Context
    ) -> pb.DeleteStreamResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.delete_stream(request.name)
                return pb.DeleteStreamResponse()
            await self.broker.delete_stream(request.name)
        return pb.DeleteStreamResponse()

    async def PauseStream(
        self, request: pb.PauseStreamRequest, context: Context
    ) -> pb.PauseStreamResponse:
        async with grpc_errors(context):
            self.broker.pause(request.name, list(request.partitions), request.resumeAll)
        return pb.PauseStreamResponse()

    async def SetStreamReadonly(
        self, request: pb.SetStreamReadonlyRequest, context: Context
    ) -> pb.SetStreamReadonlyResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.set_readonly(
                    request.name, list(request.partitions), request.readonly
                )
            else:
                self.broker.set_readonly(request.name, list(request.partitions), request.readonly)
        return pb.SetStreamReadonlyResponse()

    # -- metadata --------------------------------------------------------------------------------

    def _broker_info(self) -> pb.Broker:
        partitions = sum(len(s.partitions) for s in self.broker.list_streams())
        return pb.Broker(
            id=self.advertised.broker_id,
            host=self.advertised.host,
            port=self.advertised.port,
            partitionCount=partitions,
            leaderCount=partitions,
        )

    def _cluster_brokers(self, cluster: ClusterNode) -> list[pb.Broker]:
        view = cluster.view
        counts: dict[str, int] = {}
        for state in view.partitions.values():
            for member in state.replicas:
                counts[member] = counts.get(member, 0) + 1
        leading = view.leading()
        found = []
        for broker_id, address in sorted(view.brokers.items()):
            host, _, port = address.rpartition(":")
            found.append(
                pb.Broker(
                    id=broker_id,
                    host=host,
                    port=int(port or 0),
                    partitionCount=counts.get(broker_id, 0),
                    leaderCount=leading.get(broker_id, 0),
                )
            )
        return found

    def _cluster_stream_metadata(self, cluster: ClusterNode, name: str) -> pb.StreamMetadata:
        view = cluster.view
        record = view.streams.get(name)
        if record is None:
            return pb.StreamMetadata(name=name, error=pb.StreamMetadata.UNKNOWN_STREAM)
        local = self.broker.find_stream(name)
        partitions = {}
        for (stream, number), state in view.partitions.items():
            if stream != name:
                continue
            if (
                local is not None
                and number < len(local.partitions)
                and cluster.broker_id in state.replicas
            ):
                partitions[number] = partition_metadata(local.partitions[number], "", state)
            else:
                partitions[number] = pb.PartitionMetadata(
                    id=number,
                    leader=state.leader,
                    replicas=list(state.replicas),
                    isr=list(state.isr),
                    highWatermark=-1,
                    newestOffset=-1,
                    readonly=(name, number) in view.readonly,
                )
        return pb.StreamMetadata(
            name=name,
            subject=str(record.config.get("subject", "")),
            creationTimestamp=0 if local is None else local.created_ns,
            partitions=partitions,
        )

    def _stream_metadata(self, name: str) -> pb.StreamMetadata:
        if self.cluster is not None:
            return self._cluster_stream_metadata(self.cluster, name)
        stream = self.broker.find_stream(name)
        if stream is None:
            return pb.StreamMetadata(name=name, error=pb.StreamMetadata.UNKNOWN_STREAM)
        broker_id = self.advertised.broker_id
        return pb.StreamMetadata(
            name=name,
            subject=stream.subject,
            creationTimestamp=stream.created_ns,
            partitions={p.number: partition_metadata(p, broker_id) for p in stream.partitions},
        )

    async def _group_metadata(self, group_id: str) -> pb.ConsumerGroupMetadata:
        if self.cluster is not None:
            # Read from etcd: a client asks after a refusal, so the answer must be current.
            record = await self.cluster.groups.refresh(group_id)
            found = None if record is None else (record.coordinator, record.epoch)
        else:
            epoch = self.broker.groups.epoch(group_id)
            found = None if epoch is None else (self.advertised.broker_id, epoch)
        if found is None:
            return pb.ConsumerGroupMetadata(
                groupId=group_id, error=pb.ConsumerGroupMetadata.UNKNOWN_GROUP
            )
        return pb.ConsumerGroupMetadata(groupId=group_id, coordinator=found[0], epoch=found[1])

    async def FetchMetadata(
        self, request: pb.FetchMetadataRequest, context: Context
    ) -> pb.FetchMetadataResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                names = list(request.streams) or sorted(self.cluster.view.streams)
                brokers = self._cluster_brokers(self.cluster)
            else:
                names = list(request.streams) or [s.name for s in self.broker.list_streams()]
                brokers = [self._broker_info()]
            return pb.FetchMetadataResponse(
                brokers=brokers,
                streamMetadata=[self._stream_metadata(n) for n in names],
                groupMetadata=[await self._group_metadata(g) for g in request.groups],
            )
        raise AssertionError("unreachable")

    async def FetchPartitionMetadata(
        self, request: pb.FetchPartitionMetadataRequest, context: Context
    ) -> pb.FetchPartitionMetadataResponse:
        async with grpc_errors(context):
            partition = self.broker.partition(request.stream, request.partition)
            if self.cluster is not None:
                if partition.role is not None:
                    partition.role.check_read(False)  # Liftbridge: the leader answers
                state = self.cluster.view.partitions.get((request.stream, request.partition))
                return pb.FetchPartitionMetadataResponse(
                    metadata=partition_metadata(partition, "", state)
                )
            return pb.FetchPartitionMetadataResponse(
                metadata=partition_metadata(partition, self.advertised.broker_id)
            )
        raise AssertionError("unreachable")

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
        stream = self.broker.find_stream(request.stream)
        if stream is not None and stream.config.optimistic_concurrency:
            partition = stream.partition(request.partition)
            if partition.readonly:
                raise PartitionReadonly(request.stream, request.partition)
            raise InvalidArgument(OCC_NEEDS_ACK_TEXT)

    def _ack(
        self, request: pb.PublishRequest, offset: int, received: int, committed: int
    ) -> pb.Ack:
        subject = self.broker.stream(request.stream).subject
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
        async with grpc_errors(context):
            self._check_publish(request)
            try:
                published = await self.broker.publish(
                    request.stream,
                    request.partition,
                    [_message(request)],
                    expected_offset=(
                        request.expectedOffset if request.expectedOffset >= 0 else None
                    ),
                    durable=request.ackPolicy == pb.ALL,
                )
            except IncorrectOffset as error:
                raise FailedPrecondition(_liftbridge_text(error)) from None
            except NotLeader as error:
                # Liftbridge takes a publish on any broker: hand it to the leader.
                return await self._forward(request, error, context.time_remaining())
            self._observe(started)
            if request.ackPolicy == pb.NONE:
                return pb.PublishResponse()
            stored = published.timestamp
            ack = self._ack(request, published.offsets[0], stored, max(stored, time.time_ns()))
            return pb.PublishResponse(ack=ack, correlationId=request.correlationId)
        raise AssertionError("unreachable")

    async def _forward(
        self, request: pb.PublishRequest, refusal: NotLeader, timeout: float | None
    ) -> pb.PublishResponse:
        """A publish sent to a broker of a cluster that does not lead its partition, published
        on the leader (Liftbridge clients publish on any broker); the refusal if none leads."""
        cluster = self.cluster
        if cluster is None:
            raise refusal
        state = cluster.view.partitions.get((request.stream, request.partition))
        address = "" if state is None else cluster.view.brokers.get(state.leader, "")
        if not address or (state is not None and state.leader == cluster.broker_id):
            raise refusal
        stub = pb_grpc.APIStub(cluster.channel(address))
        try:
            response: pb.PublishResponse = await stub.Publish(
                request, timeout=FORWARD_TIMEOUT_S if timeout is None else timeout
            )
        except grpc.aio.AioRpcError as error:
            raise Forwarded(error.code(), error.details() or "") from None
        return response

    async def _publish_run(self, run: Sequence[pb.PublishRequest]) -> list[pb.PublishResponse]:
        """Append consecutive requests for one partition as one batch; one response each."""
        first = run[0]
        started = time.perf_counter()
        try:
            self._check_publish(first)
            published = await self.broker.publish(
                first.stream,
                first.partition,
                [_message(r) for r in run],
                expected_offset=first.expectedOffset if first.expectedOffset >= 0 else None,
                durable=any(r.ackPolicy == pb.ALL for r in run),
            )
        except Exception as error:
            if isinstance(error, NotLeader) and self.cluster is not None:
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
        found = self.broker.find_stream(stream)
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
        withdraw = self.broker.when_draining(stop_reading)
        try:
            ended = False
            while not ended and not self.broker.draining:
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
                async with grpc_errors(context):
                    for response in await self._publish_group(group):
                        yield response
            if self.broker.draining:
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINED)
            if broken:
                error = broken[0]
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
        async with grpc_errors(context):
            if not request.subject:
                raise InvalidArgument("publish to a subject needs a subject")
            _check_ack_policy(request.ackPolicy)
            targets = self.broker.subject_targets(request.subject)
            if not targets:
                raise SubjectNotFound(request.subject)
            message = _message(request)
            first: tuple[Partition, Published] | None = None
            failures: list[Exception] = []
            for target in targets:
                try:
                    published = await self.broker.publish(
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
        raise AssertionError("unreachable")

    # -- subscribing -----------------------------------------------------------------------------

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: Context
    ) -> AsyncIterator[pb.Message]:
        consumer = request.consumer
        group = None
        if consumer.groupId:
            if not consumer.consumerId:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "a group subscription needs a consumerId"
                )
            group = (consumer.groupId, consumer.consumerId, consumer.groupEpoch)
        async with grpc_errors(context):
            clustered = self.cluster.groups if self.cluster is not None else None
            if group is not None and clustered and not clustered.check_subscriber(*group):
                await clustered.refresh(group[0])  # the mirror may be behind the metadata
            start_offset = request.startOffset
            if request.startPosition == pb.OFFSET:
                # As Liftbridge: a negative start counts as 0 (gufo-liftbridge sends -1 for a
                # cursor never set), and a start beyond the high watermark starts at the next
                # message. tidelog.v1 refuses the first and waits for the offset in the second.
                start_offset = max(start_offset, 0)
                if not request.reverse:
                    partition = self.broker.partition(request.stream, request.partition)
                    start_offset = min(start_offset, partition.high_watermark + 1)
            subscription = self.broker.subscribe(
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
            stream = self.broker.stream(request.stream)
            subject = stream.subject
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
        async with grpc_errors(context):
            store = await self._cursors()
            await store.set(request.cursorId, request.stream, request.partition, request.offset)
        return pb.SetCursorResponse()

    async def _cursors(self) -> CursorStore:
        """Where cursors are kept: this broker's ``__cursors``, in a cluster a replicated stream
        whose partitions' leaders take the calls (others answer not-leader, naming it)."""
        if self.cluster is not None:
            return await self.cluster.cursors()
        return self.broker.cursors

    async def FetchCursor(
        self, request: pb.FetchCursorRequest, context: Context
    ) -> pb.FetchCursorResponse:
        async with grpc_errors(context):
            store = await self._cursors()
            offset = await store.fetch(request.cursorId, request.stream, request.partition)
            return pb.FetchCursorResponse(offset=offset)
        raise AssertionError("unreachable")

    # -- consumer groups -------------------------------------------------------------------------

    async def JoinConsumerGroup(
        self, request: pb.JoinConsumerGroupRequest, context: Context
    ) -> pb.JoinConsumerGroupResponse:
        async with grpc_errors(context):
            groups = self.broker.groups
            streams = list(request.streams)
            if self.cluster is not None:
                record = await self.cluster.groups.join(
                    request.groupId, request.consumerId, streams
                )
                coordinator, epoch = record.coordinator, record.epoch
            else:
                epoch = groups.join(request.groupId, request.consumerId, streams)
                coordinator = self.advertised.broker_id
            return pb.JoinConsumerGroupResponse(
                coordinator=coordinator,
                epoch=epoch,
                consumerTimeout=int(groups.consumer_timeout_s * 1e9),
                coordinatorTimeout=int(groups.coordinator_timeout_s * 1e9),
            )
        raise AssertionError("unreachable")

    async def LeaveConsumerGroup(
        self, request: pb.LeaveConsumerGroupRequest, context: Context
    ) -> pb.LeaveConsumerGroupResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.groups.leave(request.groupId, request.consumerId)
            else:
                self.broker.groups.leave(request.groupId, request.consumerId)
        return pb.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(
        self, request: pb.FetchConsumerGroupAssignmentsRequest, context: Context
    ) -> pb.FetchConsumerGroupAssignmentsResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                epoch, assigned = await self.cluster.groups.fetch_assignments(
                    request.groupId, request.consumerId, request.epoch
                )
            else:
                epoch, assigned = self.broker.groups.fetch_assignments(
                    request.groupId, request.consumerId, request.epoch
                )
            return pb.FetchConsumerGroupAssignmentsResponse(
                epoch=epoch,
                assignments=[
                    pb.PartitionAssignment(stream=stream, partitions=partitions)
                    for stream, partitions in sorted(assigned.items())
                ],
            )
        raise AssertionError("unreachable")

    async def ReportConsumerGroupCoordinator(
        self, request: pb.ReportConsumerGroupCoordinatorRequest, context: Context
    ) -> pb.ReportConsumerGroupCoordinatorResponse:
        async with grpc_errors(context):
            if self.cluster is not None:
                await self.cluster.groups.report_coordinator(
                    request.groupId,
                    request.consumerId,
                    request.coordinator,
                    request.epoch,
                    forwarded=handed_over(context),
                )
            else:
                self.broker.groups.report_coordinator(
                    request.groupId, request.consumerId, request.epoch
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
