"""``Metadata``: the brokers, and each topic's partitions with their leader, replicas and ISR.

A topic is a stream. Streams whose names start with ``__`` (cursors, routing queues) are tidelog's
own: listed as internal, as Kafka lists ``__consumer_offsets``, and only to callers whose grants
name them. A listing of all topics shows what the caller may describe; a named topic the caller
may not describe answers ``TOPIC_AUTHORIZATION_FAILED``, so a name's existence is not revealed to
those who may not see it.

A topic a producer asks for that does not exist is created when the listener allows it
(``auto_create_topics``, and the request's ``allow_auto_topic_creation``) and the caller may
``create`` it, with ``default_partitions`` partitions, as Kafka's ``auto.create.topics.enable``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import StreamConfig, validate_stream_name
from tidelog.control import PartitionInfo, StreamInfo
from tidelog.errors import InvalidArgument, StreamExists, TidelogError
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session, node_id
from tidelog.kafka.status import code_of

INTERNAL_PREFIX = "__"
NO_TOPIC_ID = uuid.UUID(int=0)


def brokers(session: Session, request: Request) -> tuple[Any, ...]:
    """Every broker, with the address Kafka clients reach it at."""
    here = session.control.broker_id
    out = []
    for info in session.control.brokers():
        if info.broker_id == here:
            host, port = session.advertised
        else:
            address = session.broker_address(info.broker_id)
            if address is None:
                continue  # no Kafka listener known for it
            host, port = address
        out.append(
            nested(
                request,
                "MetadataResponseBroker",
                node_id=node_id(info.broker_id),
                host=host,
                port=port,
                rack=None,
            )
        )
    return tuple(out)


def partition_entry(request: Request, info: PartitionInfo) -> Any:
    leader = node_id(info.leader) if info.leader else -1
    replicas = tuple(node_id(r) for r in info.replicas if r)
    return nested(
        request,
        "MetadataResponsePartition",
        error_code=ErrorCode.none if info.leader else ErrorCode.leader_not_available,
        partition_index=info.number,
        leader_id=leader,
        leader_epoch=-1,
        replica_nodes=replicas,
        isr_nodes=tuple(node_id(r) for r in info.isr if r),
        offline_replicas=(),
    )


def topic_entry(request: Request, name: str, info: StreamInfo | None, error: ErrorCode) -> Any:
    partitions = (
        ()
        if info is None
        else tuple(partition_entry(request, p) for _, p in sorted(info.partitions.items()))
    )
    return nested(
        request,
        "MetadataResponseTopic",
        error_code=error,
        name=name,
        topic_id=NO_TOPIC_ID,
        is_internal=name.startswith(INTERNAL_PREFIX),
        partitions=partitions,
        topic_authorized_operations=-(2**31),
    )


async def _auto_create(session: Session, name: str) -> ErrorCode:
    """Create ``name`` for a producer's Metadata; the code to answer with."""
    try:
        validate_stream_name(name)
    except InvalidArgument:
        return ErrorCode.invalid_topic_exception
    if name.startswith(INTERNAL_PREFIX):
        return ErrorCode.invalid_topic_exception
    if not session.allowed(Operation.CREATE, Kind.STREAM, name):
        return ErrorCode.topic_authorization_failed
    try:
        await session.control.create_stream(
            name, StreamConfig(partitions=session.config.default_partitions), 0, 0
        )
    except StreamExists:
        pass
    except TidelogError as error:
        return code_of(error)[0]
    return ErrorCode.none


async def handle(session: Session, request: Request) -> Any:
    body = request.body
    control = session.control
    topics = []
    if body.topics is None or (request.version == 0 and not body.topics):
        for name in control.stream_names():
            if session.may_see(Kind.STREAM, name):
                topics.append(
                    topic_entry(request, name, control.describe_stream(name), ErrorCode.none)
                )
    else:
        auto = session.config.auto_create_topics and getattr(
            body, "allow_auto_topic_creation", True
        )
        for wanted in body.topics:
            name = wanted.name
            if name is None:
                continue  # a topic by id (v10+): tidelog names topics only
            if not session.may_see(Kind.STREAM, name):
                topics.append(
                    topic_entry(request, name, None, ErrorCode.topic_authorization_failed)
                )
                continue
            info = control.describe_stream(name)
            if info is None and auto:
                error = await _auto_create(session, name)
                if error is not ErrorCode.none:
                    topics.append(topic_entry(request, name, None, error))
                    continue
                info = control.describe_stream(name)
            if info is None:
                topics.append(
                    topic_entry(request, name, None, ErrorCode.unknown_topic_or_partition)
                )
                continue
            topics.append(topic_entry(request, name, info, ErrorCode.none))
    return answer(
        request,
        throttle_time=timedelta(0),
        brokers=brokers(session, request),
        cluster_id=session.config.cluster_id,
        controller_id=node_id(control.broker_id),
        topics=tuple(topics),
        cluster_authorized_operations=-(2**31),
    )
