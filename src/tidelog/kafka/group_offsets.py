"""``OffsetCommit`` and ``OffsetFetch``: a Kafka group's committed offsets, kept as cursors.

A group's offsets are the cursor ``__group:<group id>`` (one value per topic and partition) in
the cursor stream, durable and replicated as every cursor is, so ``tidelog cursor get`` and the
console show them and their lag, and they survive restarts (membership does not).

The value stored is Kafka's committed offset minus one. Kafka commits "the next offset to read";
a tidelog cursor holds the last offset processed (what tidelog's clients store, and what the
console's lag, the partition's newest offset minus the cursor, counts from). So a group that
committed 0 (nothing read yet) stores -1, and its lag is the whole partition, as Kafka's
``kafka-consumer-groups`` would show. OffsetFetch adds the one back; a cursor never set answers
-1, which clients read as "no committed offset" (they apply ``auto.offset.reset``).

Not kept: the commit's metadata string (a cursor holds an offset only; OffsetFetch answers it
empty), its leader epoch (answered -1) and the retention time (cursors are kept until deleted).

Checks, per request: ``group`` on the group and the group's own rules
(``Coordinator.check_commit``: a member of the current generation, or no generation while the
group has no members), whose refusal every partition carries; then per topic ``subscribe`` for a
commit (Kafka's READ) or ``describe`` for a fetch (``TOPIC_AUTHORIZATION_FAILED``). A commit
names partitions that exist (``UNKNOWN_TOPIC_OR_PARTITION``), with an offset >= 0
(``INVALID_REQUEST``). The cursor is written by the server itself: the caller's checks were made
here.

In a cluster, the cursor of each (topic, partition) lives on the ``__cursors`` partition its key
hashes to, which the group's coordinator may not lead: such a partition is answered
``NOT_COORDINATOR`` (the cursor store refuses a write or read there; ``docs/kafka-groups.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import CursorStore
from tidelog.errors import NotLeader, TidelogError
from tidelog.kafka.group_coordinator import coordinator_of, cursor_id, refusal
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session
from tidelog.kafka.status import code_of

NO_OFFSET = -1


def stored_value(committed: int) -> int:
    """The cursor's value for Kafka's committed offset (module docstring)."""
    return committed - 1


def committed_offset(stored: int | None) -> int:
    """Kafka's committed offset for a cursor's value (None: never set)."""
    return NO_OFFSET if stored is None else stored + 1


def _failure(error: BaseException) -> ErrorCode:
    if isinstance(error, NotLeader):
        # the cursor's partition has another leader: so has the group (find it again)
        return ErrorCode.not_coordinator
    return code_of(error)[0]


# -- OffsetCommit ---------------------------------------------------------------------------------


async def offset_commit(session: Session, request: Request) -> Any:
    body = request.body
    group_id = body.group_id
    code = await refusal(session, group_id)
    if code is None:
        code = coordinator_of(session.control).check_commit(
            group_id,
            body.member_id,
            getattr(body, "group_instance_id", None),
            session.identity,
            body.generation_id_or_member_epoch,
        )
    codes: dict[tuple[int, int], ErrorCode] = {}
    writes: list[tuple[tuple[int, int], Coroutine[Any, Any, None]]] = []
    store = await session.control.cursors() if code is ErrorCode.none else None
    for t, topic in enumerate(body.topics):
        readable = session.allowed(Operation.SUBSCRIBE, Kind.STREAM, topic.name)
        for p, partition in enumerate(topic.partitions):
            if store is None:
                codes[(t, p)] = code
            elif not readable:
                codes[(t, p)] = ErrorCode.topic_authorization_failed
            elif partition.committed_offset < 0:
                codes[(t, p)] = ErrorCode.invalid_request
            else:
                value = stored_value(partition.committed_offset)
                write = store.set(cursor_id(group_id), topic.name, partition.partition_index, value)
                writes.append(((t, p), write))
    # Each set is a durable append; together they share the log's syncs.
    results = await asyncio.gather(*(w for _, w in writes), return_exceptions=True)
    for (where, _), result in zip(writes, results, strict=True):
        if isinstance(result, TidelogError):
            codes[where] = _failure(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            codes[where] = ErrorCode.none
    topics = tuple(
        nested(
            request,
            "OffsetCommitResponseTopic",
            name=topic.name,
            partitions=tuple(
                nested(
                    request,
                    "OffsetCommitResponsePartition",
                    partition_index=partition.partition_index,
                    error_code=codes[(t, p)],
                )
                for p, partition in enumerate(topic.partitions)
            ),
        )
        for t, topic in enumerate(body.topics)
    )
    return answer(request, throttle_time=timedelta(0), topics=topics)


# -- OffsetFetch ----------------------------------------------------------------------------------


async def offset_fetch(session: Session, request: Request) -> Any:
    body = request.body
    if request.version < 8:
        code, topics = await _fetch_group(session, request, body.group_id, body.topics)
        if request.version < 2:  # no group error: each partition carries it
            return answer(request, topics=topics)
        return answer(
            request,
            throttle_time=timedelta(0),
            error_code=code,
            topics=() if code is not ErrorCode.none else topics,
        )
    groups = []
    for group in body.groups:
        code, topics = await _fetch_group(session, request, group.group_id, group.topics)
        groups.append(
            nested(
                request,
                "OffsetFetchResponseGroup",
                group_id=group.group_id,
                error_code=code,
                topics=() if code is not ErrorCode.none else topics,
            )
        )
    return answer(request, throttle_time=timedelta(0), groups=tuple(groups))


async def _fetch_group(
    session: Session, request: Request, group_id: str, wanted: Sequence[Any] | None
) -> tuple[ErrorCode, tuple[Any, ...]]:
    """(the group's error, its topics' entries) for one group of an OffsetFetch; ``wanted``:
    the topics and partitions asked for (None: every one with a committed offset)."""
    code = await refusal(session, group_id) or ErrorCode.none  # (ErrorCode.none is falsy)
    store = await session.control.cursors() if code is ErrorCode.none else None
    if wanted is None:
        if store is None:
            return code, ()
        return code, await _every_offset(session, request, store, group_id)
    topics = []
    for topic in wanted:
        visible = session.may_see(Kind.STREAM, topic.name)
        partitions = []
        for number in topic.partition_indexes:
            offset, error = NO_OFFSET, code
            if store is not None and not visible:
                error = ErrorCode.topic_authorization_failed
            elif store is not None:
                try:
                    offset = committed_offset(
                        await store.stored(cursor_id(group_id), topic.name, number)
                    )
                except TidelogError as failure:
                    error = _failure(failure)
            partitions.append(_partition(request, number, offset, error))
        topics.append(_topic(request, topic.name, partitions))
    return code, tuple(topics)


async def _every_offset(
    session: Session, request: Request, store: CursorStore, group_id: str
) -> tuple[Any, ...]:
    """Every partition the caller may see with an offset committed by ``group_id``."""
    topics = []
    for name in session.control.stream_names():
        info = session.control.describe_stream(name)
        if info is None or not session.may_see(Kind.STREAM, name):
            continue
        partitions = []
        for number in sorted(info.partitions):
            try:
                stored = await store.stored(cursor_id(group_id), name, number)
            except TidelogError as failure:
                partitions.append(_partition(request, number, NO_OFFSET, _failure(failure)))
                continue
            if stored is not None:
                partitions.append(
                    _partition(request, number, committed_offset(stored), ErrorCode.none)
                )
        if partitions:
            topics.append(_topic(request, name, partitions))
    return tuple(topics)


def _partition(request: Request, number: int, offset: int, error: ErrorCode) -> Any:
    return nested(
        request,
        "OffsetFetchResponsePartitions" if request.version >= 8 else "OffsetFetchResponsePartition",
        partition_index=number,
        committed_offset=offset,
        committed_leader_epoch=-1,
        metadata="",
        error_code=error,
    )


def _topic(request: Request, name: str, partitions: list[Any]) -> Any:
    return nested(
        request,
        "OffsetFetchResponseTopics" if request.version >= 8 else "OffsetFetchResponseTopic",
        name=name,
        partitions=tuple(partitions),
    )
