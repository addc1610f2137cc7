"""``ListOffsets``: a partition's earliest and latest offsets, and the offset for a time.

Kafka's offsets are tidelog's. Kafka's "latest" is the next offset to be written that readers may
see, the high watermark plus one in tidelog's terms (tidelog's high watermark names the newest
committed record); "earliest" is the oldest retained offset.

By time (a timestamp >= 0, ms): the first offset whose *broker* timestamp is at or after it, found
by the time index's binary search. Kafka searches its records' own timestamps, which are the
producers' CreateTime by default; tidelog's index holds the time each record was stored, which
never goes backwards along offsets (``docs/kafka.md`` says where the two differ: a producer that
stamps records far from the time it sends them).

A partition named twice in one request is answered ``INVALID_REQUEST`` for each repeat, as
Kafka's broker does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import Partition
from tidelog.errors import TidelogError
from tidelog.kafka.bounds import Seen, turn
from tidelog.kafka.convert import NS_PER_MS
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session
from tidelog.kafka.status import code_of

EARLIEST: Final = -2
LATEST: Final = -1
MAX_TIMESTAMP: Final = -3


def latest(partition: Partition) -> int:
    """Kafka's high watermark: the offset after the newest committed record."""
    return partition.high_watermark + 1


def earliest(partition: Partition) -> int:
    return partition.log.oldest_offset


def lookup(partition: Partition, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp ms) answering a ListOffsets query; (-1, -1) when nothing matches."""
    if timestamp == EARLIEST:
        return earliest(partition), -1
    if timestamp == LATEST:
        return latest(partition), -1
    log = partition.log
    if timestamp == MAX_TIMESTAMP:
        offset = partition.high_watermark
    elif timestamp < 0:
        return -1, -1
    else:
        found = log.offset_at_or_after_timestamp(timestamp * NS_PER_MS)
        if found is None:
            return -1, -1
        offset = found
    if offset < 0:
        return -1, -1
    batch = log.forward_reader(offset).read(1, 1)
    if not batch:
        return -1, -1
    return int(batch.offsets[0]), int(batch.timestamps[0]) // NS_PER_MS


async def list_offsets(session: Session, request: Request) -> Any:
    topics = []
    seen = Seen()
    count = 0
    for topic in request.body.topics:
        name = topic.name
        allowed = session.allowed(Operation.SUBSCRIBE, Kind.STREAM, name)
        partitions = []
        for wanted in topic.partitions:
            count += 1
            await turn(count)
            error, offset, timestamp = ErrorCode.none, -1, -1
            if not seen.first((name, wanted.partition_index)):
                error = ErrorCode.invalid_request
            elif not allowed:
                error = ErrorCode.topic_authorization_failed
            else:
                try:
                    partition = session.control.readable(name, wanted.partition_index)
                    offset, timestamp = lookup(partition, wanted.timestamp)
                except TidelogError as failure:
                    error = code_of(failure)[0]
            partitions.append(
                nested(
                    request,
                    "ListOffsetsPartitionResponse",
                    partition_index=wanted.partition_index,
                    error_code=error,
                    old_style_offsets=() if error is not ErrorCode.none else (offset,),
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=-1,
                )
            )
        topics.append(
            nested(request, "ListOffsetsTopicResponse", name=name, partitions=tuple(partitions))
        )
    return answer(request, throttle_time=timedelta(0), topics=tuple(topics))
