"""``Produce``: record batches appended to partitions, with Kafka's idempotence.

Each partition's ``records`` is parsed and checked whole (CRC, codec, sizes: ``records.py``)
before anything is appended, so a bad batch leaves nothing half-written; the records of all its
batches become tidelog records (``convert.py``) and are appended as one atomic batch, so a
refusal of any of them (a record above the stream's ``max_message_bytes``, say) writes none.
An idempotent producer's batches each carry their own sequence, so a partition holding more than
one batch with a producer id is refused whole (``INVALID_REQUEST``; Kafka's clients send one
batch per partition and request). A partition named twice in one request is served once: each
repeat is answered ``INVALID_REQUEST`` (appending it beside the first would race it).

``acks`` 1 answers once the leader holds the batch, ``acks`` -1 (all) once it is durable: on
disk, and in a cluster held by the in-sync replicas (tidelog's ack ALL); ``acks`` 0 gets no
answer at all, as in Kafka.

In a cluster only a partition's leader appends: any other broker answers
``NOT_LEADER_OR_FOLLOWER`` (the client refreshes its metadata), checked before anything else
of the batch. An ack ALL that the in-sync replicas did not give in time (or a leadership that
moved between the append and their copy) is ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``: the batch may
be stored, so the client sends it again, and its producer id and sequence keep it from being
stored twice.

Idempotence. A batch with a producer id (>= 0) is appended through the partition's producer table
(``tidelog.broker.producers``) under the tidelog producer id ``kafka:<id>``, bound to the caller's
principal, with the tidelog sequence ``epoch << 31 | base sequence``: a retry of the batch stored
last is answered with its offsets, an older epoch's batch is fenced. Kafka also requires each batch
to follow the previous one exactly (its base sequence is the previous batch's last plus one) so a
retried batch that failed while a later one succeeded is refused rather than taken as a duplicate
and lost; this front checks that before appending (:func:`sequence_error`), as Kafka's
``ProducerStateManager`` does, after the owner check: a producer id another principal owns is
refused (``ProducerIdTaken``, ``TOPIC_AUTHORIZATION_FAILED``) before its sequence is looked at,
so the codes tell nobody else anything of its epoch or sequence:

=========================================  ==========================================
the batch, against the producer's latest    answer
=========================================  ==========================================
unknown producer, base sequence 0           appended
unknown producer, base sequence > 0         UNKNOWN_PRODUCER_ID (state lost to retention)
older epoch                                 INVALID_PRODUCER_EPOCH
newer epoch, base sequence 0                appended
newer epoch, base sequence > 0              OUT_OF_ORDER_SEQUENCE_NUMBER
same epoch, the latest batch's sequence     its offsets (a retry)
same epoch, below it                        DUPLICATE_SEQUENCE_NUMBER
same epoch, the next sequence               appended
same epoch, past the next                   OUT_OF_ORDER_SEQUENCE_NUMBER
=========================================  ==========================================

Requests of one connection are served in order (``serving.py``), so a producer's pipelined
batches to a partition reach this check in the order it sent them.

Timestamps. A stream created with ``message.timestamp.type=LogAppendTime``
(``StreamConfig.log_append_time``) answers each partition with ``log_append_time``: the time its
first batch was stored (a duplicate's: its first copy's, as Kafka answers); -1 for the rest.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import Partition, ProducerIdTaken
from tidelog.errors import NotEnoughReplicas, TidelogError
from tidelog.kafka.bounds import Seen
from tidelog.kafka.convert import NS_PER_MS, joined, to_tidelog
from tidelog.kafka.errors import KafkaError, Refused
from tidelog.kafka.offsets import earliest
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.records import KafkaBatch, parse_batches
from tidelog.kafka.session import Session
from tidelog.kafka.status import code_of

EPOCH_SHIFT: Final = 31
SEQUENCE_MASK: Final = (1 << EPOCH_SHIFT) - 1
ACKS_NONE: Final = 0
ACKS_ALL: Final = -1


def producer_name(producer_id: int) -> str:
    return f"kafka:{producer_id}"


def sequence_error(
    stored: tuple[int, int] | None, epoch: int, base_sequence: int
) -> ErrorCode | None:
    """The refusal of a batch (module docstring's table), or None to append it (or answer it as
    the retry of the latest). ``stored``: the producer's latest (tidelog sequence, count)."""
    if stored is None:
        return None if base_sequence == 0 else ErrorCode.unknown_producer_id
    sequence, count = stored
    stored_epoch, stored_base = sequence >> EPOCH_SHIFT, sequence & SEQUENCE_MASK
    if epoch < stored_epoch:
        return ErrorCode.invalid_producer_epoch
    if epoch > stored_epoch:
        return None if base_sequence == 0 else ErrorCode.out_of_order_sequence_number
    if base_sequence == stored_base or base_sequence == stored_base + count:
        return None
    if base_sequence < stored_base:
        return ErrorCode.duplicate_sequence_number
    return ErrorCode.out_of_order_sequence_number


def _check(batches: list[KafkaBatch]) -> None:
    """Refuse a partition's batches that cannot be appended together (module docstring)."""
    if any(batch.is_transactional or batch.is_control for batch in batches):
        raise Refused(
            ErrorCode.invalid_request,
            "transactional producing is not supported by tidelog's Kafka front (docs/kafka.md)",
        )
    if len(batches) > 1 and any(batch.producer_id >= 0 for batch in batches):
        raise Refused(
            ErrorCode.invalid_request,
            f"{len(batches)} record batches for one partition from an idempotent producer "
            f"(one per partition and request)",
        )


async def _append(
    session: Session, topic: str, index: int, batches: list[KafkaBatch], acks: int
) -> tuple[int, int]:
    """Append a partition's Kafka batches as one; (the first offset, the time its records were
    stored, ns). The first offset is -1 for a duplicate older than the latest; the time is 0
    for a duplicate."""
    _check(batches)
    control = session.control
    durable = acks == ACKS_ALL
    batch = batches[0]
    if batch.producer_id < 0:
        records = joined([to_tidelog(b) for b in batches])
        published = await control.publish(topic, index, records, durable=durable)
        return published.offsets.start, published.timestamp
    name = producer_name(batch.producer_id)
    if not 0 <= batch.producer_epoch <= 0x7FFF or batch.base_sequence < 0:
        raise Refused(ErrorCode.invalid_record, "a negative producer epoch or sequence")
    partition = control.partition(topic, index)
    if partition.role is not None:
        # Not the leader: say so before reading the producer table, which on a follower may
        # trail the leader's (an out-of-order answer there would be fatal to the producer).
        partition.role.check_publish()
    table = partition.producers
    latest = table.get(name) if table is not None else None
    if latest is not None and latest.owner and latest.owner != session.identity:
        # the owner first: the sequence rules' codes would tell another principal the
        # producer's epoch and sequence
        raise Refused(*code_of(ProducerIdTaken(name)))
    stored = None if latest is None else (latest.sequence, latest.count)
    refusal = sequence_error(stored, batch.producer_epoch, batch.base_sequence)
    if refusal is not None:
        raise Refused(
            refusal,
            f"producer {batch.producer_id} epoch {batch.producer_epoch}: batch sequence "
            f"{batch.base_sequence} does not follow the stored one",
        )
    published = await control.publish_idempotent(
        topic,
        index,
        to_tidelog(batch),
        name,
        batch.producer_epoch << EPOCH_SHIFT | batch.base_sequence,
        durable=durable,
        owner=session.identity,
    )
    return (published.offsets.start if published.offsets else -1), published.timestamp


def append_time(partition: Partition, offset: int, stamp_ns: int) -> datetime | None:
    """Kafka's ``log_append_time`` of a batch stored at ``offset`` with the time ``stamp_ns``:
    a duplicate (``stamp_ns`` 0) is answered with the time its first copy was stored, as Kafka
    does; None when that record is gone (retention)."""
    if stamp_ns == 0:
        batch = partition.log.forward_reader(offset).read(1, 1)
        if not batch or int(batch.offsets[0]) != offset:
            return None
        stamp_ns = int(batch.timestamps[0])
    return datetime.fromtimestamp(stamp_ns // NS_PER_MS / 1000, tz=UTC)


async def _partition(
    session: Session,
    topic: str,
    allowed: bool,
    data: Any,
    acks: int,
    request: Request,
    log_append_time: bool,
    repeated: bool = False,
) -> Any:
    error, message, base_offset, start = ErrorCode.none, None, -1, -1
    appended: datetime | None = None
    try:
        if repeated:
            raise Refused(
                ErrorCode.invalid_request, f"partition {data.index} of {topic} named twice"
            )
        if not allowed:
            raise Refused(ErrorCode.topic_authorization_failed, f"no publish grant on {topic}")
        records = data.records or b""
        if len(records) > session.config.message_max_bytes:
            raise Refused(
                ErrorCode.message_too_large,
                f"a record batch of {len(records)} bytes (message.max.bytes is "
                f"{session.config.message_max_bytes}: --kafka-message-max-bytes)",
            )
        batches = parse_batches(records, max_bytes=session.config.message_max_bytes)
        if not batches:
            raise Refused(ErrorCode.invalid_record, "no record batch in the request")
        base_offset, stamp = await _append(session, topic, data.index, batches, acks)
        partition = session.control.partition(topic, data.index)
        start = earliest(partition)
        if log_append_time and base_offset >= 0:
            appended = append_time(partition, base_offset, stamp)
    except KafkaError as refused:  # a Refused raised above, or the record layer's errors
        error, message = refused.code, str(refused)
    except NotEnoughReplicas as short:
        # Raised only after the append (the ISR did not copy it in time, or the leadership
        # moved first): the batch may be stored, which is Kafka's "after append" code.
        error, message = ErrorCode.not_enough_replicas_after_append, str(short)
    except TidelogError as failure:
        error, message = code_of(failure)
    return nested(
        request,
        "PartitionProduceResponse",
        index=data.index,
        error_code=error,
        base_offset=base_offset,
        log_append_time=appended,
        log_start_offset=start,
        record_errors=(),
        error_message=message,
    )


async def handle(session: Session, request: Request) -> Any:
    body = request.body
    acks = body.acks
    topics = []
    seen = Seen()
    for topic in body.topic_data:
        allowed = session.allowed(Operation.PUBLISH, Kind.STREAM, topic.name)
        stream = session.control.find_stream(topic.name)
        stamped = stream is not None and stream.config.log_append_time
        answers = await asyncio.gather(
            *(
                _partition(
                    session,
                    topic.name,
                    allowed,
                    data,
                    acks,
                    request,
                    stamped,
                    repeated=not seen.first((topic.name, data.index)),
                )
                for data in topic.partition_data
            )
        )
        topics.append(
            nested(
                request, "TopicProduceResponse", name=topic.name, partition_responses=tuple(answers)
            )
        )
    if acks == ACKS_NONE:
        return None
    return answer(request, responses=tuple(topics), throttle_time=timedelta(0))
