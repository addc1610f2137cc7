"""``Metadata``: the brokers, and each topic's partitions with their leader, replicas and ISR.

A topic is a stream. Streams whose names start with ``__`` (cursors, routing queues) are tidelog's
own: listed as internal, as Kafka lists ``__consumer_offsets``, and only to callers whose grants
name them. A listing of all topics shows what the caller may describe; a named topic the caller
may not describe answers ``TOPIC_AUTHORIZATION_FAILED``, so a name's existence is not revealed to
those who may not see it.

In a cluster the brokers listed are the live ones that run a Kafka listener (each registers its
Kafka address beside its gRPC one: ``docs/kafka.md``), read from the control at each
request, so the list follows membership. A partition whose leader is not among them (down and
not yet replaced, or without a Kafka listener) answers ``LEADER_NOT_AVAILABLE`` with leader -1:
the client asks again. Every broker names itself the controller: any of them takes what Kafka
sends to its controller (tidelog's own controller decides inside the cluster).

A topic a producer asks for that does not exist is created when the listener allows it
(``auto_create_topics``, and the request's ``allow_auto_topic_creation``) and the caller may
``create`` it, with ``default_partitions`` partitions, as Kafka's ``auto.create.topics.enable``.

A name asked for twice is answered once (Kafka's broker keeps a set of them too), and the loop
over the names lets other connections run every ``bounds.TURN_EVERY`` of them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.broker import StreamConfig, validate_stream_name
from tidelog.control import PartitionInfo, StreamInfo
from tidelog.errors import InvalidArgument, StreamExists, TidelogError
from tidelog.kafka.bounds import turn
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session, node_id
from tidelog.kafka.status import code_of

INTERNAL_PREFIX = "__"
NO_TOPIC_ID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class Brokers:
    """The brokers as one Metadata answer sees them (read once per request)."""

    live: frozenset[str]
    """Every live broker's id."""
    kafka: dict[str, tuple[str, int]]
    """The live brokers Kafka clients can reach (those with a Kafka listener), by id: the ones
    the answer lists."""

    @classmethod
    def of(cls, session: Session) -> Brokers:
        live = frozenset(info.broker_id for info in session.control.brokers())
        kafka = {}
        for broker_id in sorted(live):
            address = session.broker_address(broker_id)
            if address is not None:
                kafka[broker_id] = address
        return cls(live, kafka)


def brokers(session: Session, request: Request, known: Brokers | None = None) -> tuple[Any, ...]:
    """Every live broker with a Kafka listener, with the address Kafka clients reach it at."""
    known = Brokers.of(session) if known is None else known
    return tuple(
        nested(
            request,
            "MetadataResponseBroker",
            node_id=node_id(broker_id),
            host=host,
            port=port,
            rack=None,
        )
        for broker_id, (host, port) in known.kafka.items()
    )


def partition_entry(request: Request, info: PartitionInfo, known: Brokers | None = None) -> Any:
    """One partition: its leader (-1 and ``LEADER_NOT_AVAILABLE`` while it has none, or its
    leader is not among the brokers listed: down, or without a Kafka listener, so the client
    asks again), leader epoch, replicas, ISR and the replicas on brokers that are down."""
    reachable = bool(info.leader) and (known is None or info.leader in known.kafka)
    replicas = tuple(r for r in info.replicas if r)
    return nested(
        request,
        "MetadataResponsePartition",
        error_code=ErrorCode.none if reachable else ErrorCode.leader_not_available,
        partition_index=info.number,
        leader_id=node_id(info.leader) if reachable else -1,
        leader_epoch=info.leader_epoch,
        replica_nodes=tuple(node_id(r) for r in replicas),
        isr_nodes=tuple(node_id(r) for r in info.isr if r),
        offline_replicas=(
            () if known is None else tuple(node_id(r) for r in replicas if r not in known.live)
        ),
    )


def topic_entry(
    request: Request,
    name: str,
    info: StreamInfo | None,
    error: ErrorCode,
    known: Brokers | None = None,
) -> Any:
    partitions = (
        ()
        if info is None
        else tuple(partition_entry(request, p, known) for _, p in sorted(info.partitions.items()))
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
    known = Brokers.of(session)
    topics = []
    if body.topics is None or (request.version == 0 and not body.topics):
        for i, name in enumerate(control.stream_names()):
            await turn(i)
            if session.may_see(Kind.STREAM, name):
                info = control.describe_stream(name)
                topics.append(topic_entry(request, name, info, ErrorCode.none, known))
    else:
        auto = session.config.auto_create_topics and getattr(
            body, "allow_auto_topic_creation", True
        )
        names = dict.fromkeys(wanted.name for wanted in body.topics)
        for i, name in enumerate(names):
            await turn(i)
            if name is None:
                continue  # a topic by id (v10+): tidelog names topics only
            if not session.may_see(Kind.STREAM, name):
                topics.append(
                    topic_entry(request, name, None, ErrorCode.topic_authorization_failed)
                )
                continue
            info = control.describe_stream(name)
            missing = ErrorCode.unknown_topic_or_partition
            if info is None and auto:
                error = await _auto_create(session, name)
                if error is not ErrorCode.none:
                    topics.append(topic_entry(request, name, None, error))
                    continue
                info = control.describe_stream(name)
                # Created, but not in this broker's view of the cluster yet: a moment.
                missing = ErrorCode.leader_not_available
            if info is None:
                topics.append(topic_entry(request, name, None, missing))
                continue
            topics.append(topic_entry(request, name, info, ErrorCode.none, known))
    return answer(
        request,
        throttle_time=timedelta(0),
        brokers=brokers(session, request, known),
        cluster_id=session.config.cluster_id,
        controller_id=node_id(control.broker_id),
        topics=tuple(topics),
        cluster_authorized_operations=-(2**31),
    )
