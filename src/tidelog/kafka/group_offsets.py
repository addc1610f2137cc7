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
(``INVALID_REQUEST``), each once (a repeat is ``INVALID_REQUEST``, and not written). The
cursor is written by the server itself: the caller's checks were made here.

In a cluster, the cursor of each (topic, partition) lives on the ``__cursors`` partition its key
hashes to, as every cursor does (tidelog's groups and Liftbridge clients rely on that placement),
which the group's coordinator leads only for some keys: the coordinator stores and reads each
through ``Control.set_cursor`` and ``Control.fetch_cursor``, which run it on that partition's
leader, as this broker, once the caller's rights were checked here. So one coordinator answers
for all of a group's offsets, as Kafka's does with one ``__consumer_offsets`` partition. A
leader that cannot be reached now (a failover under way) is ``COORDINATOR_NOT_AVAILABLE`` for
that partition (the client retries); the coordinator's own refusal (it no longer leads the
group's partition) is ``NOT_COORDINATOR``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import Any, Final

import grpc
from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.control import Forwarded
from tidelog.errors import BrokerClosed, NotEnoughReplicas, NotLeader, TidelogError
from tidelog.kafka.bounds import Seen
from tidelog.kafka.group_coordinator import coordinator_of, cursor_id, refusal
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session
from tidelog.kafka.status import code_of

LOG = logging.getLogger("tidelog.kafka")
NO_OFFSET = -1


def stored_value(committed: int) -> int:
    """The cursor's value for Kafka's committed offset (module docstring)."""
    return committed - 1


def committed_offset(stored: int | None) -> int:
    """Kafka's committed offset for a cursor's value (None: never set)."""
    return NO_OFFSET if stored is None else stored + 1


_UNREACHED: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""A cursor call handed to another broker that did not get there or back: try again."""

_FORWARDED: Final[dict[grpc.StatusCode, ErrorCode]] = {
    grpc.StatusCode.NOT_FOUND: ErrorCode.unknown_topic_or_partition,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.invalid_request,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.policy_violation,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCode.policy_violation,
}
"""The leader's refusal of a cursor call handed to it, by its status (``tidelog.api.status``
maps the store's refusals there: a stream deleted meanwhile, a stream with all the cursor ids it
may have). Any other is logged (a broker refused by another's ACL: ``super_users``)."""


def _failure(error: BaseException) -> ErrorCode:
    """A cursor call's failure as the partition's code (module docstring)."""
    if isinstance(error, NotLeader):
        # this broker was named the cursor partition's leader and is not (any more): the
        # group's coordinator may have moved too (find it again)
        return ErrorCode.not_coordinator
    if isinstance(error, NotEnoughReplicas | BrokerClosed) or (
        isinstance(error, Forwarded) and (error.moved or error.code in _UNREACHED)
    ):
        return ErrorCode.coordinator_not_available  # a failover under way: retriable
    if isinstance(error, Forwarded):
        code = _FORWARDED.get(error.code)
        if code is None:
            LOG.warning("kafka group offsets: a cursor's leader refused: %s", error)
            return ErrorCode.unknown_server_error
        return code
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
    control = session.control
    seen = Seen()
    for t, topic in enumerate(body.topics):
        readable = session.allowed(Operation.SUBSCRIBE, Kind.STREAM, topic.name)
        for p, partition in enumerate(topic.partitions):
            if not seen.first((topic.name, partition.partition_index)):
                codes[(t, p)] = ErrorCode.invalid_request
            elif code is not ErrorCode.none:
                codes[(t, p)] = code
            elif not readable:
                codes[(t, p)] = ErrorCode.topic_authorization_failed
            elif partition.committed_offset < 0:
                codes[(t, p)] = ErrorCode.invalid_request
            else:
                value = stored_value(partition.committed_offset)
                where = (topic.name, partition.partition_index)
                writes.append(((t, p), control.set_cursor(cursor_id(group_id), *where, value)))
    # Each set is a durable append (here or on its partition's leader); together they share
    # the logs' syncs.
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
    if wanted is None:
        if code is not ErrorCode.none:
            return code, ()
        return code, await _every_offset(session, request, group_id)
    topics = []
    for topic in wanted:
        numbers = list(topic.partition_indexes)
        found: list[tuple[int | None, ErrorCode]]
        if code is not ErrorCode.none:
            found = [(None, code)] * len(numbers)
        elif not session.may_see(Kind.STREAM, topic.name):
            found = [(None, ErrorCode.topic_authorization_failed)] * len(numbers)
        else:
            found = await _committed(session, group_id, topic.name, numbers)
        partitions = [
            _partition(request, number, committed_offset(stored), error)
            for number, (stored, error) in zip(numbers, found, strict=True)
        ]
        topics.append(_topic(request, topic.name, partitions))
    return code, tuple(topics)


async def _every_offset(session: Session, request: Request, group_id: str) -> tuple[Any, ...]:
    """Every partition the caller may see with an offset committed by ``group_id``."""
    topics = []
    for name in session.control.stream_names():
        info = session.control.describe_stream(name)
        if info is None or not session.may_see(Kind.STREAM, name):
            continue
        numbers = sorted(info.partitions)
        found = await _committed(session, group_id, name, numbers)
        partitions = [
            _partition(request, number, committed_offset(stored), error)
            for number, (stored, error) in zip(numbers, found, strict=True)
            if stored is not None or error is not ErrorCode.none
        ]
        if partitions:
            topics.append(_topic(request, name, partitions))
    return tuple(topics)


async def _committed(
    session: Session, group_id: str, stream: str, numbers: Sequence[int]
) -> list[tuple[int | None, ErrorCode]]:
    """(the cursor's value, None: never set; the partition's error) per partition of
    ``stream``, read at once (in a cluster, each from its cursor partition's leader)."""

    async def one(number: int) -> tuple[int | None, ErrorCode]:
        try:
            stored = await session.control.fetch_cursor(cursor_id(group_id), stream, number)
        except TidelogError as failure:
            return None, _failure(failure)
        return stored, ErrorCode.none

    return list(await asyncio.gather(*(one(n) for n in numbers)))


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
