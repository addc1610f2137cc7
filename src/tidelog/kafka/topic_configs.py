"""Kafka's topic and broker configs as tidelog's stream settings, and back: pure functions.

A Kafka topic's configs are name/value strings; a tidelog stream's settings are one frozen
:class:`~tidelog.broker.StreamConfig`. :func:`topic_settings` reads the configs a ``CreateTopics``
names into settings (refusing, with :class:`InvalidConfig` naming the key, any key a stream cannot
take and any value out of range), and :func:`topic_entries` / :func:`broker_entries` describe
settings as the config entries ``DescribeConfigs`` and ``CreateTopics`` v5+ answer with.

The mapping (``docs/kafka.md`` has it as a table):

========================  =====================================================================
Kafka key                 tidelog setting
========================  =====================================================================
cleanup.policy            ``compact`` (``compact``, ``compact,delete``); ``delete``: not compact
retention.ms              ``retention_age_s`` (ms / 1000); -1: :data:`FOREVER_S`
retention.bytes           ``retention_bytes`` (per partition, as in Kafka); -1: :data:`UNLIMITED`
segment.bytes             ``segment_max_bytes``
segment.ms                ``segment_max_age_s``
max.message.bytes         ``max_message_bytes`` (a record's key + value + headers in tidelog;
                          Kafka's is a whole batch, which the listener's ``message.max.bytes``
                          caps)
message.timestamp.type    ``log_append_time`` (``LogAppendTime``; ``CreateTime``: False)
min.insync.replicas       the stream's ``min_isr`` (a create argument, not a setting)
========================  =====================================================================

Invariants. A described value reads back to the same setting (``-1`` for an unlimited one), so a
topic created from another's described configs has the same settings. ``retention.ms=-1`` and
``retention.bytes=-1`` mean *unlimited* in Kafka, which a stream cannot say by leaving the setting
unset (unset means the server's default, seven days of age by default): they are stored as the
largest limit, which nothing reaches, and described as -1 again. A topic that is ``compact``
alone keeps everything in Kafka until compaction removes it; in tidelog retention applies to
every stream, so ``cleanup.policy=compact`` without a retention config sets both to unlimited.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from tidelog.broker import LogConfig, StreamConfig
from tidelog.errors import InvalidArgument
from tidelog.kafka.session import KafkaConfig

UNLIMITED: Final = 2**63 - 1
"""Kafka's ``Long.MAX_VALUE``: the stored form of an unlimited ``retention.bytes``."""
FOREVER_S: Final = UNLIMITED / 1000
"""The stored form of an unlimited ``retention.ms``, in seconds."""
MS_PER_S: Final = 1000


class Source(IntEnum):
    """Where a described value comes from (Kafka's ``ConfigSource``)."""

    TOPIC = 1
    """Set on the topic (``DYNAMIC_TOPIC_CONFIG``)."""
    BROKER = 4
    """The server's settings, the topic setting none (``STATIC_BROKER_CONFIG``)."""
    DEFAULT = 5
    """Fixed by tidelog (``DEFAULT_CONFIG``)."""


class Type(IntEnum):
    """A config's value type (Kafka's ``ConfigType``, DescribeConfigs v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


class InvalidConfig(Exception):
    """A topic config a stream cannot take: Kafka's ``INVALID_CONFIG``, its message naming the
    key."""


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described config. Every entry is read-only: tidelog serves no ``AlterConfigs``."""

    name: str
    value: str | None
    source: Source
    type: Type
    documentation: str


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """What a ``CreateTopics`` entry's configs ask for."""

    config: StreamConfig
    min_isr: int
    """0: the server's default."""


_CLEANUP_POLICIES: Final = frozenset({"compact", "delete"})
_TIMESTAMP_TYPES: Final = {"CreateTime": False, "LogAppendTime": True}

_DOCS: Final = {
    "cleanup.policy": "delete: segments leave by retention only; compact: also keep only the "
    "latest record per key (tidelog's compact)",
    "retention.ms": "age after which sealed segments are deleted (-1: never)",
    "retention.bytes": "size per partition beyond which the oldest sealed segments are deleted "
    "(-1: no limit)",
    "segment.bytes": "size at which a new segment is rolled",
    "segment.ms": "age at which a new segment is rolled",
    "max.message.bytes": "largest record: key + value + headers (tidelog's max_message_bytes)",
    "message.timestamp.type": "CreateTime: the producer's timestamps; LogAppendTime: the time "
    "the broker stored the records",
    "min.insync.replicas": "replicas that hold a record before an acks=all produce is answered",
    "message.max.bytes": "largest record batch a produce may carry (--kafka-message-max-bytes)",
    "auto.create.topics.enable": "create a topic a producer's Metadata names "
    "(--kafka-auto-create-topics)",
    "num.partitions": "partitions of a topic created with -1 or by itself "
    "(--kafka-default-partitions)",
    "default.replication.factor": "replicas of a topic created with -1",
    "log.retention.ms": "retention.ms of topics that set none (--retention-age-s)",
    "log.retention.bytes": "retention.bytes of topics that set none (--retention-bytes)",
    "log.segment.bytes": "segment.bytes of topics that set none (--segment-max-bytes)",
    "log.roll.ms": "segment.ms of topics that set none (--segment-max-age-s)",
    "socket.request.max.bytes": "largest request frame (--kafka-request-max-bytes)",
    "broker.id": "this broker's node id",
}

TOPIC_KEYS: Final = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "segment.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.insync.replicas",
)


def _integer(key: str, value: str, low: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise InvalidConfig(f"{key}={value!r}: not an integer") from None
    if number < low:
        raise InvalidConfig(f"{key}={number}: must be at least {low}")
    return number


def _checked(key: str, value: str, **setting: object) -> None:
    """Check one setting alone against :class:`StreamConfig`'s bounds (each is checked on its own
    there), so a refusal names the Kafka key that caused it."""
    try:
        StreamConfig(**setting)  # type: ignore[arg-type]
    except InvalidArgument as error:
        raise InvalidConfig(f"{key}={value}: {error}") from None


def topic_settings(partitions: int, configs: Iterable[tuple[str, str | None]]) -> TopicSettings:
    """The settings a topic of ``partitions`` partitions with ``configs`` is created with;
    :class:`InvalidConfig` for an unknown key, a repeated key or a value out of range."""
    fields: dict[str, object] = {"partitions": partitions}
    seen: set[str] = set()
    min_isr = 0
    compact_only = False
    for key, raw in configs:
        if key in seen:
            raise InvalidConfig(f"{key}: given twice")
        seen.add(key)
        if key not in TOPIC_KEYS:
            raise InvalidConfig(
                f"{key}: not a config tidelog's streams take (they take {', '.join(TOPIC_KEYS)})"
            )
        if raw is None:
            raise InvalidConfig(f"{key}: no value")
        if key == "cleanup.policy":
            policies = {p.strip() for p in raw.split(",") if p.strip()}
            if not policies or not policies <= _CLEANUP_POLICIES:
                raise InvalidConfig(f"{key}={raw!r}: use delete, compact or compact,delete")
            fields["compact"] = "compact" in policies
            compact_only = policies == {"compact"}
        elif key == "retention.ms":
            ms = _integer(key, raw, -1)
            if ms == 0:
                raise InvalidConfig(f"{key}=0: use a positive age, or -1 for no limit")
            fields["retention_age_s"] = FOREVER_S if ms == -1 else ms / MS_PER_S
        elif key == "retention.bytes":
            size = _integer(key, raw, -1)
            fields["retention_bytes"] = UNLIMITED if size == -1 else size
        elif key == "segment.bytes":
            fields["segment_max_bytes"] = _integer(key, raw, 1)
        elif key == "segment.ms":
            fields["segment_max_age_s"] = _integer(key, raw, 1) / MS_PER_S
        elif key == "max.message.bytes":
            fields["max_message_bytes"] = _integer(key, raw, 1)
        elif key == "message.timestamp.type":
            if raw not in _TIMESTAMP_TYPES:
                raise InvalidConfig(f"{key}={raw!r}: use CreateTime or LogAppendTime")
            fields["log_append_time"] = _TIMESTAMP_TYPES[raw]
        else:  # min.insync.replicas
            min_isr = _integer(key, raw, 1)
    if compact_only:
        fields.setdefault("retention_age_s", FOREVER_S)
        fields.setdefault("retention_bytes", UNLIMITED)
    for key, name in (
        ("segment.bytes", "segment_max_bytes"),
        ("max.message.bytes", "max_message_bytes"),
    ):
        if name in fields:
            _checked(key, str(fields[name]), **{name: fields[name]})
    try:
        config = StreamConfig(**fields)  # type: ignore[arg-type]
    except InvalidArgument as error:
        raise InvalidConfig(str(error)) from None
    return TopicSettings(config, min_isr)


def _ms(seconds: float | None) -> str:
    if seconds is None or seconds >= FOREVER_S:
        return "-1"
    return str(math.floor(seconds * MS_PER_S + 0.5))


def _bytes(size: int | None) -> str:
    return "-1" if size is None or size >= UNLIMITED else str(size)


def _source(own: object) -> Source:
    return Source.BROKER if own is None else Source.TOPIC


def topic_entries(config: StreamConfig, defaults: LogConfig, min_isr: int) -> list[ConfigEntry]:
    """A stream's settings as Kafka topic configs: its own where set, the server's defaults
    (``defaults``) elsewhere."""
    log = config.log_config(defaults)
    unlimited = log.retention_age_s is None or log.retention_age_s >= FOREVER_S
    unlimited = unlimited and (log.retention_bytes is None or log.retention_bytes >= UNLIMITED)
    if not config.compact:
        policy = "delete"
    elif unlimited:
        policy = "compact"
    else:
        policy = "compact,delete"

    def entry(name: str, value: str, source: Source, kind: Type) -> ConfigEntry:
        return ConfigEntry(name, value, source, kind, _DOCS[name])

    flagged = Source.TOPIC
    return [
        entry("cleanup.policy", policy, flagged if config.compact else Source.DEFAULT, Type.LIST),
        entry("retention.ms", _ms(log.retention_age_s), _source(config.retention_age_s), Type.LONG),
        entry(
            "retention.bytes",
            _bytes(log.retention_bytes),
            _source(config.retention_bytes),
            Type.LONG,
        ),
        entry(
            "segment.bytes",
            str(log.segment_max_bytes),
            _source(config.segment_max_bytes),
            Type.INT,
        ),
        entry(
            "segment.ms",
            _ms(log.segment_max_age_s),
            _source(config.segment_max_age_s),
            Type.LONG,
        ),
        entry(
            "max.message.bytes",
            str(log.max_message_bytes),
            _source(config.max_message_bytes),
            Type.INT,
        ),
        entry(
            "message.timestamp.type",
            "LogAppendTime" if config.log_append_time else "CreateTime",
            flagged if config.log_append_time else Source.DEFAULT,
            Type.STRING,
        ),
        entry(
            "min.insync.replicas",
            str(min_isr),
            flagged if min_isr > 1 else Source.DEFAULT,
            Type.INT,
        ),
    ]


def broker_entries(kafka: KafkaConfig, defaults: LogConfig, node: int) -> list[ConfigEntry]:
    """The broker configs clients read, from the listener's and the server's settings."""

    def entry(name: str, value: str, kind: Type, source: Source = Source.BROKER) -> ConfigEntry:
        return ConfigEntry(name, value, source, kind, _DOCS[name])

    return [
        entry("broker.id", str(node), Type.INT),
        entry("message.max.bytes", str(kafka.message_max_bytes), Type.INT),
        entry("auto.create.topics.enable", str(kafka.auto_create_topics).lower(), Type.BOOLEAN),
        entry("num.partitions", str(kafka.default_partitions), Type.INT),
        entry("default.replication.factor", "1", Type.INT, Source.DEFAULT),
        entry("log.retention.ms", _ms(defaults.retention_age_s), Type.LONG),
        entry("log.retention.bytes", _bytes(defaults.retention_bytes), Type.LONG),
        entry("log.segment.bytes", str(defaults.segment_max_bytes), Type.INT),
        entry("log.roll.ms", _ms(defaults.segment_max_age_s), Type.LONG),
        entry("socket.request.max.bytes", str(kafka.request_max_bytes), Type.INT),
    ]


def selected(entries: Sequence[ConfigEntry], keys: Sequence[str] | None) -> list[ConfigEntry]:
    """The entries named in ``keys`` (None or empty: all), in ``entries``' order."""
    if not keys:
        return list(entries)
    wanted = set(keys)
    return [e for e in entries if e.name in wanted]
