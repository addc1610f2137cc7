"""``DescribeStream`` and ``ListGroups``: what the console shows beyond the Liftbridge metadata.

Both read the broker's state as it is at the call, on its event loop, without I/O: a partition's
oldest offset and bytes held come from its open log (a paused partition's files are closed, so
its size is reported as -1 and its offsets are those at pause time), the settings are the
stream's effective ones (its own where it set them, the server's defaults otherwise), and groups
are the coordinator's members and assignments, with how long each member has been silent.
"""

from __future__ import annotations

import time

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.access import Kind, caller
from tidelog.broker import Partition, Stream
from tidelog.control import Control

Context = grpc.aio.ServicerContext[object, object]


def describe_partition(partition: Partition) -> v1.PartitionDescription:
    log = partition.current_log
    if log is None:
        oldest, size = -1, -1
    else:
        size = log.size_bytes
        oldest = log.oldest_offset if partition.newest_offset >= 0 else -1
    return v1.PartitionDescription(
        partition=partition.number,
        oldest_offset=oldest,
        newest_offset=partition.newest_offset,
        size_bytes=size,
        messages_in=partition.stats.messages_in,
        bytes_in=partition.stats.bytes_in,
        paused=partition.paused,
        readonly=partition.readonly,
        subscribers=partition.subscribers,
    )


def settings_of(stream: Stream) -> v1.StreamSettings:
    log = stream.partitions[0].log_config
    config = stream.config
    return v1.StreamSettings(
        retention_bytes=log.retention_bytes or 0,
        retention_messages=log.retention_messages or 0,
        retention_age_s=log.retention_age_s or 0.0,
        compact=config.compact,
        segment_max_bytes=log.segment_max_bytes,
        segment_max_age_s=log.segment_max_age_s,
        max_message_bytes=log.max_message_bytes,
        auto_pause_s=config.auto_pause_s or 0.0,
        optimistic_concurrency=config.optimistic_concurrency,
        group=config.group,
    )


class DescribeService(v1_grpc.TidelogServicer):
    """Mixed into :class:`tidelog.api.v1.TidelogService`."""

    control: Control

    async def DescribeStream(
        self, request: v1.DescribeStreamRequest, context: Context
    ) -> v1.DescribeStreamResponse:
        stream = self.control.stream(request.stream)
        return v1.DescribeStreamResponse(
            stream=stream.name,
            partitions=[describe_partition(p) for p in stream.partitions],
            settings=settings_of(stream),
        )

    async def ListGroups(
        self, request: v1.ListGroupsRequest, context: Context
    ) -> v1.ListGroupsResponse:
        now = time.monotonic()  # the coordinator's clock
        groups = []
        known = self.control.local_groups()
        who = caller()
        for group_id in sorted(g for g in known if who.may_see(Kind.GROUP, g)):
            group = known[group_id]
            groups.append(
                v1.GroupDescription(
                    group_id=group_id,
                    epoch=group.epoch,
                    # Only the streams the caller may see: a group it may see does not show
                    # it the names (or partitions) of streams it may not.
                    members=[
                        v1.GroupMember(
                            consumer_id=m.consumer_id,
                            streams=[s for s in m.streams if who.may_see(Kind.STREAM, s)],
                            idle_s=max(now - m.last_seen, 0.0),
                        )
                        for m in sorted(group.members.values(), key=lambda m: m.consumer_id)
                    ],
                    assignments=[
                        v1.GroupAssignment(consumer_id=c, stream=s, partitions=parts)
                        for c, by_stream in sorted(group.assignments.items())
                        for s, parts in sorted(by_stream.items())
                        if who.may_see(Kind.STREAM, s)
                    ],
                )
            )
        return v1.ListGroupsResponse(groups=groups)
