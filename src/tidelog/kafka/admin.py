"""The Kafka admin apis: topics created, deleted and described, and the cluster described.

A topic is a stream (``docs/kafka.md``). Each api answers per topic or resource, never
failing the whole request for one entry's sake, and checks access per entry through the session
(the guard of this moment), as the gRPC front does per call:

=================  ======================================  ====================================
api                what it needs                           refused with
=================  ======================================  ====================================
CreateTopics       ``create`` on the stream                TOPIC_AUTHORIZATION_FAILED
DeleteTopics       ``delete`` on the stream                TOPIC_AUTHORIZATION_FAILED
DescribeConfigs    ``describe`` on the stream (topic);     TOPIC_AUTHORIZATION_FAILED /
                   ``describe`` on the cluster (broker)    CLUSTER_AUTHORIZATION_FAILED
DescribeCluster    nothing (Metadata lists brokers too)
=================  ======================================  ====================================

CreateTopics checks an entry in Kafka's order: a name given twice in one request
(INVALID_REQUEST, every copy), access, the name (INVALID_TOPIC_EXCEPTION: tidelog's names, which
start with a letter or digit; ``__`` is tidelog's own), existence (TOPIC_ALREADY_EXISTS), the
partition count (INVALID_PARTITIONS), the replication factor (INVALID_REPLICATION_FACTOR: at
most the brokers there are, so 1 on a single broker; -1 is the server's default), a manual
assignment (INVALID_REPLICA_ASSIGNMENT: placement is tidelog's), then the configs
(INVALID_CONFIG naming the key: ``topic_configs.py``). ``validate_only`` runs every check and
creates nothing; the limits on streams a server holds (``max_streams``) are checked only by a
real create (POLICY_VIOLATION).

CreatePartitions is not served: a stream's partition count is fixed when it is created
(``Stream.reconfigure`` refuses another, and a cluster's stream record and every broker's copy
are made for that count), so a client asking for more learns at ApiVersions that the api is not
there rather than from a request that cannot succeed.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.access import ANY, Kind, Operation
from tidelog.broker import MAX_PARTITIONS, validate_stream_name
from tidelog.control import StreamInfo
from tidelog.errors import InvalidArgument, TidelogError
from tidelog.kafka import producer_ids
from tidelog.kafka.errors import Refused
from tidelog.kafka.metadata import INTERNAL_PREFIX, NO_TOPIC_ID
from tidelog.kafka.protocol import Request, answer, nested, response_module
from tidelog.kafka.session import Session, node_id
from tidelog.kafka.status import code_of
from tidelog.kafka.topic_configs import (
    ConfigEntry,
    InvalidConfig,
    TopicSettings,
    broker_entries,
    selected,
    topic_entries,
    topic_settings,
)

TOPIC_RESOURCE: Final = 2
BROKER_RESOURCE: Final = 4
BROKERS_ENDPOINT: Final = 1
DEFAULT: Final = -1
NO_OPERATIONS: Final = -(2**31)


def _config_entries(
    request: Request, cls: str, entries: list[ConfigEntry], documented: bool
) -> tuple[Any, ...]:
    if not hasattr(response_module(request), cls):  # CreateTopics below v5 sends none
        return ()
    return tuple(
        nested(
            request,
            cls,
            name=e.name,
            value=e.value,
            read_only=True,
            config_source=int(e.source),
            is_sensitive=False,
            synonyms=(),
            config_type=int(e.type),
            documentation=e.documentation if documented else None,
        )
        for e in entries
    )


def _described(session: Session, info: StreamInfo) -> list[ConfigEntry]:
    assert info.config is not None
    return topic_entries(info.config, session.control.log_defaults, info.min_isr)


# -- CreateTopics ---------------------------------------------------------------------------------


def _settings(session: Session, topic: Any) -> tuple[TopicSettings, int]:
    """The checked settings and replication factor of one CreateTopics entry (its name is
    checked already); ``Refused`` with the entry's error otherwise."""
    partitions = topic.num_partitions
    if partitions == DEFAULT:
        partitions = session.config.default_partitions
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise Refused(
            ErrorCode.invalid_partitions,
            f"{topic.num_partitions} partitions: use 1 to {MAX_PARTITIONS}, or -1 for the "
            f"server's default ({session.config.default_partitions})",
        )
    brokers = len(session.control.brokers())
    factor = topic.replication_factor
    if factor != DEFAULT and not 1 <= factor <= brokers:
        raise Refused(
            ErrorCode.invalid_replication_factor,
            f"replication factor {factor}: use 1 to {brokers} (the brokers there are), or -1",
        )
    if topic.assignments:
        raise Refused(
            ErrorCode.invalid_replica_assignment,
            "tidelog places replicas itself: give num_partitions and replication_factor instead "
            "of an assignment",
        )
    try:
        settings = topic_settings(partitions, ((c.name, c.value) for c in topic.configs))
    except InvalidConfig as bad:
        raise Refused(ErrorCode.invalid_config, str(bad)) from None
    replicas = 1 if factor == DEFAULT else factor
    if settings.min_isr > replicas:
        raise Refused(
            ErrorCode.invalid_config,
            f"min.insync.replicas={settings.min_isr} is more than the topic's {replicas} replicas",
        )
    return settings, (0 if factor == DEFAULT else factor)


async def _create(
    session: Session, topic: Any, validate_only: bool
) -> tuple[int, int, list[ConfigEntry]]:
    """(partitions, replication factor, configs) of a created (or validated) topic;
    ``Refused`` with its error otherwise."""
    name = topic.name
    if not session.allowed(Operation.CREATE, Kind.STREAM, name):
        raise Refused(ErrorCode.topic_authorization_failed, f"no create grant on {name}")
    try:
        if name.startswith(INTERNAL_PREFIX):
            raise InvalidArgument(f"{name}: names starting with '__' are tidelog's own")
        validate_stream_name(name)
    except InvalidArgument as bad:
        raise Refused(ErrorCode.invalid_topic_exception, str(bad)) from None
    control = session.control
    if control.describe_stream(name) is not None:
        raise Refused(ErrorCode.topic_already_exists, f"topic {name} already exists")
    settings, factor = _settings(session, topic)
    if validate_only:
        entries = topic_entries(settings.config, control.log_defaults, max(settings.min_isr, 1))
        return settings.config.partitions, max(factor, 1), entries
    try:
        await control.create_stream(name, settings.config, factor, settings.min_isr)
    except TidelogError as failure:
        code, message = code_of(failure)
        if isinstance(failure, InvalidArgument):
            code = ErrorCode.invalid_config
        raise Refused(code, message) from None
    info = control.describe_stream(name)
    if info is None or info.config is None:  # deleted again at once
        raise Refused(ErrorCode.unknown_topic_or_partition, f"topic {name} is gone already")
    return info.config.partitions, info.replication_factor, _described(session, info)


async def create_topics(session: Session, request: Request) -> Any:
    body = request.body
    counts = Counter(t.name for t in body.topics)
    results = []
    for topic in body.topics:
        error, message = ErrorCode.none, None
        partitions, factor = -1, -1
        entries: list[ConfigEntry] = []
        try:
            if counts[topic.name] > 1:
                raise Refused(
                    ErrorCode.invalid_request, f"topic {topic.name} is named more than once"
                )
            partitions, factor, entries = await _create(session, topic, body.validate_only)
        except Refused as refused:
            error, message = refused.code, str(refused)
        results.append(
            nested(
                request,
                "CreatableTopicResult",
                name=topic.name,
                topic_id=NO_TOPIC_ID,
                error_code=error,
                error_message=message,
                num_partitions=partitions,
                replication_factor=factor,
                configs=_config_entries(request, "CreatableTopicConfigs", entries, False),
            )
        )
    return answer(request, throttle_time=timedelta(0), topics=tuple(results))


# -- DeleteTopics ---------------------------------------------------------------------------------


async def _delete(session: Session, name: str | None, repeated: bool) -> tuple[ErrorCode, str]:
    if name is None:
        return ErrorCode.unknown_topic_id, "tidelog names topics only: delete by name"
    if repeated:
        return ErrorCode.invalid_request, f"topic {name} is named more than once"
    if not session.allowed(Operation.DELETE, Kind.STREAM, name):
        return ErrorCode.topic_authorization_failed, f"no delete grant on {name}"
    if session.control.describe_stream(name) is None:
        return ErrorCode.unknown_topic_or_partition, f"no topic {name}"
    try:
        await session.control.delete_stream(name)
    except TidelogError as failure:
        return code_of(failure)
    return ErrorCode.none, ""


async def delete_topics(session: Session, request: Request) -> Any:
    body = request.body
    if hasattr(body, "topics"):  # v6: by name or by id
        wanted = [(t.name, t.topic_id) for t in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    counts = Counter(name for name, _ in wanted if name is not None)
    results = []
    for name, topic_id in wanted:
        error, message = await _delete(session, name, counts[name] > 1 if name else False)
        results.append(
            nested(
                request,
                "DeletableTopicResult",
                name=name,
                topic_id=topic_id if topic_id is not None else NO_TOPIC_ID,
                error_code=error,
                error_message=message or None,
            )
        )
    return answer(request, throttle_time=timedelta(0), responses=tuple(results))


# -- DescribeConfigs ------------------------------------------------------------------------------


def _resource_configs(session: Session, resource: Any) -> list[ConfigEntry]:
    kind, name = resource.resource_type, resource.resource_name
    if kind == TOPIC_RESOURCE:
        if not session.may_see(Kind.STREAM, name):
            raise Refused(ErrorCode.topic_authorization_failed, f"no describe grant on {name}")
        info = session.control.describe_stream(name)
        if info is None or info.config is None:
            raise Refused(ErrorCode.unknown_topic_or_partition, f"no topic {name}")
        return _described(session, info)
    if kind == BROKER_RESOURCE:
        here = node_id(session.control.broker_id)
        if name not in ("", str(here)):
            raise Refused(
                ErrorCode.invalid_request,
                f"broker {name}: this is broker {here}; ask each broker for its own configs",
            )
        if not session.allowed(Operation.DESCRIBE, Kind.CLUSTER, ANY):
            raise Refused(ErrorCode.cluster_authorization_failed, "no describe grant on cluster")
        return broker_entries(session.config, session.control.log_defaults, here)
    raise Refused(
        ErrorCode.invalid_request,
        f"resource type {kind}: tidelog describes topics (2) and brokers (4)",
    )


async def describe_configs(session: Session, request: Request) -> Any:
    results = []
    for resource in request.body.resources:
        error, message = ErrorCode.none, None
        entries: list[ConfigEntry] = []
        try:
            entries = selected(_resource_configs(session, resource), resource.configuration_keys)
        except Refused as refused:
            error, message = refused.code, str(refused)
        results.append(
            nested(
                request,
                "DescribeConfigsResult",
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=_config_entries(
                    request,
                    "DescribeConfigsResourceResult",
                    entries,
                    getattr(request.body, "include_documentation", False),
                ),
            )
        )
    return answer(request, throttle_time=timedelta(0), results=tuple(results))


# -- DescribeCluster ------------------------------------------------------------------------------


async def describe_cluster(session: Session, request: Request) -> Any:
    control = session.control
    endpoint = getattr(request.body, "endpoint_type", BROKERS_ENDPOINT)
    brokers = []
    for info in control.brokers():
        if info.broker_id == control.broker_id:
            address: tuple[str, int] | None = session.advertised
        else:
            address = session.broker_address(info.broker_id)
        if address is None:
            continue  # no Kafka listener known for it
        brokers.append(
            nested(
                request,
                "DescribeClusterBroker",
                broker_id=node_id(info.broker_id),
                host=address[0],
                port=address[1],
                rack=None,
                is_fenced=False,
            )
        )
    error, message = ErrorCode.none, None
    if endpoint != BROKERS_ENDPOINT:
        error, message, brokers = (
            ErrorCode.unsupported_endpoint_type,
            "tidelog has brokers only: ask for endpoint type 1",
            [],
        )
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=error,
        error_message=message,
        endpoint_type=endpoint,
        cluster_id=session.config.cluster_id,
        controller_id=node_id(control.broker_id),
        brokers=tuple(brokers),
        cluster_authorized_operations=NO_OPERATIONS,
    )


SERVED: Final = (
    (19, "CreateTopics", 2, 7, create_topics),
    (20, "DeleteTopics", 1, 6, delete_topics),
    (32, "DescribeConfigs", 1, 4, describe_configs),
    (60, "DescribeCluster", 0, 2, describe_cluster),
    *producer_ids.SERVED,
)
