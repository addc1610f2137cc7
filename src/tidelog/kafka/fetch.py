"""``Fetch``: committed records from each partition asked for, waiting up to ``max_wait_ms``
until at least ``min_bytes`` are there.

Records are read from the partition's log (committed records only: below the high watermark,
which in a cluster the in-sync replicas hold) and sent as uncompressed RecordBatches, one per
read of the log (at most ``READ_RECORDS`` records and ``READ_BYTES`` stored bytes), built from the
stored records (``convert.py``); offsets are the log's, so a compacted or trimmed log's gaps show
as gaps in the batch's offset deltas. The batches go to the socket as they were built: the
response is written as a list of buffers (``protocol.encode_response_parts``), never joined.

Theory of the wait. Before reading, the fetch takes each partition's commit signal (a future the
next commit resolves); if what it read is below ``min_bytes`` and time remains, it awaits any of
them, then reads again. A commit between the read and the wait resolves a future already held, so
no wake-up is lost, and an idle fetch costs nothing until data arrives or its time is up.

Budgets: each partition gives at most ``partition_max_bytes`` and the response at most
``max_bytes``, both lowered to the listener's ``fetch_max_bytes`` (Kafka's ``fetch.max.bytes``:
a client cannot make the broker hold more), except that the first record of the first partition
with data is sent whole even when larger (KIP-74), so a consumer is never stuck behind one large
record. A partition named twice in one request is read once: each repeat is answered
``INVALID_REQUEST`` without records (``bounds.py``).

Fetch sessions (KIP-227) are not kept: every answer says ``session_id`` 0, which tells a client
that asked for one that none was made, so its next fetch names every partition again.
``isolation_level`` read-committed reads the same records (tidelog has no transactions).

A stream with ``StreamConfig.log_append_time`` sends batches of timestamp type LogAppendTime,
whose records carry the time the broker stored them (``convert.to_kafka``).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import Partition
from tidelog.errors import TidelogError
from tidelog.kafka.bounds import Seen, turn
from tidelog.kafka.convert import to_kafka
from tidelog.kafka.offsets import earliest, latest
from tidelog.kafka.protocol import RecordChunks, Request, answer, nested
from tidelog.kafka.session import Session
from tidelog.kafka.status import code_of

READ_RECORDS: Final = 8192
READ_BYTES: Final = 1 << 20
"""One read of the log, and so one record batch of the answer, holds at most this many records
and stored bytes: reads this size keep the conversion's arrays in cache (bigger ones cost more
per record), as the subscriptions' reads do (``DEFAULT_SUBSCRIBER_BATCH_BYTES``)."""


class _Wanted:
    """One partition of the request, and what has been read of it so far."""

    __slots__ = (
        "allowed",
        "append_time",
        "error",
        "index",
        "max_bytes",
        "offset",
        "partition",
        "records",
        "size",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        index: int,
        offset: int,
        max_bytes: int,
        allowed: bool,
        append_time: bool = False,
    ):
        self.topic = topic
        self.append_time = append_time
        """The stream stamps records with LogAppendTime (``StreamConfig.log_append_time``)."""
        self.index = index
        self.offset = offset
        self.max_bytes = max_bytes
        self.allowed = allowed
        self.error = ErrorCode.none if allowed else ErrorCode.topic_authorization_failed
        self.partition: Partition | None = None
        self.records: list[bytes] = []
        """The record batches read, one per read of the log, sent as they are (not joined)."""
        self.size = 0


def _open(session: Session, wanted: _Wanted) -> None:
    if wanted.error is not ErrorCode.none or wanted.partition is not None:
        return
    try:
        partition = session.control.readable(wanted.topic, wanted.index)
        if not earliest(partition) <= wanted.offset <= latest(partition):
            wanted.error = ErrorCode.offset_out_of_range
            return
        wanted.partition = partition
    except TidelogError as failure:
        wanted.error = code_of(failure)[0]


def _read(wanted: _Wanted, budget: int, whole_first: bool) -> int:
    """Read what the partition holds from the wanted offset, within ``budget`` bytes; the
    bytes read."""
    partition = wanted.partition
    if partition is None or wanted.records or wanted.offset > partition.high_watermark:
        return 0
    limit = min(wanted.max_bytes, budget)
    if limit <= 0 and not whole_first:
        return 0
    try:
        reader = partition.log.forward_reader(wanted.offset)
        parts: list[bytes] = []
        got = 0
        while got < limit or (not parts and whole_first):
            batch = reader.read(READ_RECORDS, max(min(limit - got, READ_BYTES), 1))
            if not batch:
                break
            parts.append(to_kafka(batch, log_append_time=wanted.append_time))
            got += batch.byte_size
    except TidelogError as failure:
        wanted.error = code_of(failure)[0]
        return 0
    wanted.records = parts
    wanted.size = sum(map(len, parts))
    return wanted.size


async def handle(session: Session, request: Request) -> Any:
    body = request.body
    cap = session.config.fetch_max_bytes
    wanted: list[_Wanted] = []
    seen = Seen()
    for topic in body.topics:
        allowed = session.allowed(Operation.SUBSCRIBE, Kind.STREAM, topic.topic)
        stream = session.control.find_stream(topic.topic)
        stamped = stream is not None and stream.config.log_append_time
        for p in topic.partitions:
            entry = _Wanted(
                topic.topic,
                p.partition,
                p.fetch_offset,
                min(p.partition_max_bytes, cap),
                allowed,
                stamped,
            )
            if not seen.first((topic.topic, p.partition)):
                entry.error = ErrorCode.invalid_request
            wanted.append(entry)
    max_bytes = min(getattr(body, "max_bytes", cap), cap)
    wait_s = min(max(body.max_wait.total_seconds(), 0.0), session.config.fetch_max_wait_s)
    deadline = time.monotonic() + wait_s
    total = 0
    while True:
        for i, w in enumerate(wanted):
            await turn(i)
            _open(session, w)
        signals = [w.partition.signal.current() for w in wanted if w.partition is not None]
        for i, w in enumerate(wanted):
            await turn(i)
            total += _read(w, max_bytes - total, whole_first=total == 0)
        remaining = deadline - time.monotonic()
        if total >= body.min_bytes or remaining <= 0 or not signals or session.control.draining:
            break
        if any(w.error is not ErrorCode.none for w in wanted):
            break
        await asyncio.wait(signals, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
    return await _answer(request, wanted)


def _records_field(parts: list[bytes]) -> bytes | RecordChunks:
    """One partition's batches as its ``records`` field: several stay separate buffers."""
    if len(parts) > 1:
        return RecordChunks(parts)
    return parts[0] if parts else b""


async def _answer(request: Request, wanted: list[_Wanted]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for i, w in enumerate(wanted):
        await turn(i)
        partition = w.partition
        high = latest(partition) if partition is not None else -1
        start = -1
        if partition is not None:
            try:
                start = earliest(partition)
            except TidelogError:
                start = -1
        by_topic.setdefault(w.topic, []).append(
            nested(
                request,
                "PartitionData",
                partition_index=w.index,
                error_code=w.error,
                high_watermark=high,
                last_stable_offset=high,
                log_start_offset=start,
                aborted_transactions=None,
                preferred_read_replica=-1,
                records=_records_field(w.records),
            )
        )
    topics = tuple(
        nested(request, "FetchableTopicResponse", topic=name, partitions=tuple(parts))
        for name, parts in by_topic.items()
    )
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=topics,
    )
