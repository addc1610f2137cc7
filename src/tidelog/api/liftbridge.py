"""The Liftbridge-compatible ``proto.API`` service on top of the broker.

Behaviour follows Liftbridge where it is sound; where tidelog chooses differently it says so in
``docs/api.md`` ("Differences from Liftbridge"). In short: every Publish is acknowledged (no
fire-and-forget without a deadline), a reverse subscription ends with OK after the oldest message
instead of UNKNOWN "EOF", no ``subject``/``reply`` headers are injected into stored messages,
``PublishToSubject`` is routed by the broker over the streams' subjects (no NATS), and every
failed PublishAsync request is answered whatever its ack policy.

The publishing calls are in ``liftbridge_publish.py`` (mixed in); the streams, metadata,
subscribe, cursor and group calls here. Both only translate onto the control.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.access import ANY, Kind, Operation, caller, on
from tidelog.api.framed import Framed, takes_framed
from tidelog.api.inflight import InFlight
from tidelog.api.liftbridge_frames import framed_messages
from tidelog.api.liftbridge_frames import liftbridge_messages as _messages
from tidelog.api.liftbridge_publish import PublishService
from tidelog.api.metrics import Metrics
from tidelog.api.status import (
    handed_over,
)
from tidelog.broker import (
    StartPosition,
    StopPosition,
    StreamConfig,
    delivery_gate,
)
from tidelog.broker import SubscribeRequest as BrokerSubscribe
from tidelog.control import BrokerInfo, Control, PartitionInfo, StreamInfo
from tidelog.errors import (
    InvalidArgument,
)
from tidelog.wire import CURSOR_UNSET_KEY

Context = grpc.aio.ServicerContext[object, object]

_log = logging.getLogger(__name__)


def acting_as() -> str | None:
    """The principal a group call acts as (``tidelog.broker.groups``, "Owners"): the caller's,
    or None (for any member) when the caller may make the cluster's inter-broker calls: a broker
    passing a member's call on, which could do far more than that already."""
    who = caller()
    if who.may(Operation.CLUSTER, Kind.CLUSTER, ANY):
        return None
    return who.identity


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
        log_append_time=request.logAppendTime,
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


class LiftbridgeService(PublishService):
    """Liftbridge's calls translated onto the control (module docstring); every call reaches
    it through the guard, which maps errors to statuses."""

    def __init__(
        self, control: Control, metrics: Metrics | None = None, inflight: InFlight | None = None
    ) -> None:
        self.control = control
        self._latency = None if metrics is None else metrics.publish_latency.labels("liftbridge")
        self._inflight = inflight or InFlight()

    # -- streams ---------------------------------------------------------------------------------

    async def CreateStream(
        self, request: pb.CreateStreamRequest, context: Context
    ) -> pb.CreateStreamResponse:
        min_isr = request.minIsr.value if request.HasField("minIsr") else 1
        # A stream receives what is published to its subject (its name when none is given): when
        # streams already listen there, joining them is reading their traffic, a grant of its own
        # (the guard asked it already for a subject named apart from the stream).
        subject = request.subject or request.name
        if self.control.subject_shared(subject):
            caller().check(on(Operation.SUBSCRIBE, Kind.SUBJECT, subject))
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
        names = list(request.streams)  # each checked by the guard
        if not names:  # every stream: those the caller may see (internal ones included)
            who = caller()
            names = [n for n in control.stream_names() if who.may_see(Kind.STREAM, n)]
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

    # -- subscribing -----------------------------------------------------------------------------

    async def Subscribe(  # type: ignore[override]  # Framed, for a transport that takes them
        self, request: pb.SubscribeRequest, context: Context
    ) -> AsyncIterator[pb.Message | Framed]:
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
            principal=None if group is None else acting_as(),
        )
        subject = self.control.stream(request.stream).subject
        name, number = request.stream, request.partition
        yield pb.Message()  # the handshake: the subscription exists
        gate = delivery_gate()
        # A transport that writes Framed as they are gets each batch laid out at once
        # (liftbridge_frames.py), a block of messages per write; grpcio one message per write.
        framed = takes_framed(context)
        async for batch in subscription.batches():
            # Take a turn for the batch (broker/delivery.py); each completed write is progress.
            turn = await gate.turn()
            try:
                if framed:
                    for block in framed_messages(batch, name, number, subject):
                        yield block
                        turn.progress()
                else:
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
        offset = await store.stored(request.cursorId, request.stream, request.partition)
        if offset is None:  # Liftbridge's -1, told apart from a stored -1 for other brokers
            context.set_trailing_metadata(((CURSOR_UNSET_KEY, "1"),))
            return pb.FetchCursorResponse(offset=-1)
        return pb.FetchCursorResponse(offset=offset)

    # -- consumer groups -------------------------------------------------------------------------

    async def JoinConsumerGroup(
        self, request: pb.JoinConsumerGroupRequest, context: Context
    ) -> pb.JoinConsumerGroupResponse:
        coordinator, epoch = await self.control.join_group(
            request.groupId, request.consumerId, list(request.streams), principal=acting_as()
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
        await self.control.leave_group(request.groupId, request.consumerId, principal=acting_as())
        return pb.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(
        self, request: pb.FetchConsumerGroupAssignmentsRequest, context: Context
    ) -> pb.FetchConsumerGroupAssignmentsResponse:
        epoch, assigned = await self.control.fetch_assignments(
            request.groupId, request.consumerId, request.epoch, principal=acting_as()
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
            principal=acting_as(),
        )
        return pb.ReportConsumerGroupCoordinatorResponse()
