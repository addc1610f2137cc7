"""Stream settings (one frozen value per stream, persisted with it) and broker-wide defaults.

Every default of the broker is a ``DEFAULT_*`` constant here, written once; the commit log's come
from ``tidelog.log.config`` (the rule is in its docstring). ``BrokerConfig`` takes values from
``tidelog.api.settings.ServerSettings``, whose defaults name these constants.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Final

from tidelog.errors import InvalidArgument, echo
from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.config import MAX_MESSAGE_BYTES_LIMIT, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES
from tidelog.log.filecache import DEFAULT_MAX_DESCRIPTORS
from tidelog.wire import INTERNAL_PREFIX

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,248}")
_INTERNAL_NAME: Final = re.compile(r"__[A-Za-z0-9][A-Za-z0-9._\-]{0,246}")
MAX_PARTITIONS: Final = 1024
DEFAULT_OPEN_FILES_MAX: Final = DEFAULT_MAX_DESCRIPTORS
"""Descriptors the open segment files of a broker may hold together (``open_files_max``)."""
DEFAULT_MAX_STREAMS: Final = 10_000
"""Client streams one broker holds (``max_streams``; internal streams are not counted)."""
DEFAULT_MAX_PARTITIONS_PER_STREAM: Final = MAX_PARTITIONS
"""Partitions one stream may have (``max_partitions_per_stream``; never above
``MAX_PARTITIONS``)."""
DEFAULT_MAX_GROUPS: Final = 10_000
"""Consumer groups one broker coordinates (``max_groups``)."""
DEFAULT_MAX_VIEWS: Final = 64
"""Materialised views of every stream together (``max_views``)."""
DEFAULT_MAX_CURSORS_PER_STREAM: Final = 10_000
"""Cursor ids one stream may have (``max_cursors_per_stream``)."""
MAX_CURSOR_ID_BYTES: Final = 1024
"""The longest cursor id (UTF-8 bytes): every update stores it again in ``__cursors``."""
DEFAULT_SUBSCRIBER_BUFFER_BYTES: Final = 256 << 10
"""Per-subscription byte budget: the most record bytes one subscription holds in hand."""
DEFAULT_DATA_DIR: Final = "./tidelog-data"
DEFAULT_MAINTENANCE_INTERVAL_S: Final = 30.0
"""How often maintenance runs (``BrokerConfig.maintenance_interval_s``)."""
DEFAULT_CURSOR_PARTITIONS: Final = 1
"""Partitions of ``__cursors`` when it is first created."""
DEFAULT_SUBSCRIBER_BATCH_MESSAGES: Final = 5000
"""The most records in one batch of a subscription (Liftbridge ``Subscribe``,
``tidelog.v1/SubscribeBatches``) whose subscriber asked for no limit. Large, because a catch-up
costs per frame (commit d279fe9 measured it): not the same thing as a Consume batch."""
DEFAULT_CONSUME_BATCH_MESSAGES: Final = 1000
"""The most records in one ``tidelog.v1/Consume`` batch when ``ConsumeStart.max_messages`` is 0.
A Consume batch is also bounded by the permits the consumer granted, so it is sized to what one
consumer holds in hand, not to a catch-up frame like ``DEFAULT_SUBSCRIBER_BATCH_MESSAGES``."""
DEFAULT_SUBSCRIBER_BATCH_BYTES: Final = 1 << 20
"""The most record bytes in one batch to any subscriber (Subscribe, SubscribeBatches, Consume)
that asked for no byte limit; ``subscriber_buffer_bytes`` caps it further."""

DEFAULT_BROWSE_LIMIT: Final = 50
"""Messages in a browse page when the caller names no limit."""
MAX_BROWSE_LIMIT: Final = 10_000
"""The most messages one browse page may ask for."""
BROWSE_PAGE_BYTES: Final = 16 << 20
"""A browse page ends early (with a token) once its messages hold this many bytes."""
DEFAULT_BROWSE_MAX_SCAN: Final = 1_000_000
"""Messages a browse examines (filters included) before it stops and says how far it got."""
DEFAULT_BROWSE_MAX_SCAN_SECONDS: Final = 5.0
"""Seconds a browse scans before it stops and says how far it got."""
MAX_BROWSE_MAX_SCAN_SECONDS: Final = 60.0
"""The longest scan a caller may ask for."""


def validate_stream_name(name: str, *, internal: bool = False) -> str:
    """Return ``name`` if it is a valid stream name, else raise :class:`InvalidArgument`.

    Names are 1-249 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a
    letter or digit; the ``__`` prefix is reserved for tidelog's internal streams.
    """
    if internal:
        if _INTERNAL_NAME.fullmatch(name):
            return name
    elif name.startswith(INTERNAL_PREFIX):
        raise InvalidArgument(
            f"stream name {echo(name)}: the '__' prefix is reserved for internal streams"
        )
    elif _NAME.fullmatch(name):
        return name
    raise InvalidArgument(
        f"invalid stream name {echo(name)}: use 1-249 letters, digits, '.', '_' or '-', "
        f"starting with a letter or digit"
    )


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One stream's settings. ``None`` means "the broker default"."""

    partitions: int = 1
    subject: str = ""
    group: str = ""
    retention_bytes: int | None = None
    retention_messages: int | None = None
    retention_age_s: float | None = None
    segment_max_bytes: int | None = None
    segment_max_age_s: float | None = None
    max_message_bytes: int | None = None
    optimistic_concurrency: bool = False
    auto_pause_s: float | None = None
    compact: bool = False
    """Keep only the latest record per key in sealed segments (maintenance compacts them)."""
    log_append_time: bool = False
    """Records are stamped with the time the broker stored them, whatever time a producer gave
    (Kafka's ``message.timestamp.type=LogAppendTime``); False: the producer's time where the
    front keeps one (Kafka's ``CreateTime``). tidelog's own index is always the broker's time;
    the flag says which time a front reports. A stream saved before the flag existed reads as
    False (``from_json``)."""

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidArgument(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {self.partitions}"
            )
        for name in ("retention_bytes", "retention_messages"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidArgument(f"{name} must be >= 0, got {value}")
        for name in ("retention_age_s", "segment_max_age_s", "auto_pause_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidArgument(f"{name} must be positive, got {value}")
        if self.segment_max_bytes is not None and not (
            MIN_SEGMENT_BYTES <= self.segment_max_bytes <= MAX_SEGMENT_BYTES
        ):
            raise InvalidArgument(
                f"segment_max_bytes must be between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES}, "
                f"got {self.segment_max_bytes}"
            )
        if self.max_message_bytes is not None and not (
            1 <= self.max_message_bytes <= MAX_MESSAGE_BYTES_LIMIT
        ):
            raise InvalidArgument(
                f"max_message_bytes must be between 1 and {MAX_MESSAGE_BYTES_LIMIT}, "
                f"got {self.max_message_bytes}"
            )

    def log_config(self, defaults: LogConfig) -> LogConfig:
        """The commit-log settings of one partition: these values over the broker's defaults."""
        return dataclasses.replace(
            defaults,
            segment_max_bytes=self.segment_max_bytes or defaults.segment_max_bytes,
            segment_max_age_s=self.segment_max_age_s or defaults.segment_max_age_s,
            max_message_bytes=self.max_message_bytes or defaults.max_message_bytes,
            retention_bytes=(
                defaults.retention_bytes if self.retention_bytes is None else self.retention_bytes
            ),
            retention_messages=(
                defaults.retention_messages
                if self.retention_messages is None
                else self.retention_messages
            ),
            retention_age_s=(
                defaults.retention_age_s if self.retention_age_s is None else self.retention_age_s
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Broker-wide settings the server passes in (see ``tidelog.api.settings`` for the sources)."""

    data_dir: str = DEFAULT_DATA_DIR
    broker_id: str = ""
    """Stable id reported in metadata; empty: generated once, kept in ``<data_dir>/broker-id``."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Defaults for every partition's commit log."""
    maintenance_interval_s: float = DEFAULT_MAINTENANCE_INTERVAL_S
    """How often retention, compaction, age rolls, auto-pause, group expiry and cursor-index
    snapshots run."""
    cursor_partitions: int = DEFAULT_CURSOR_PARTITIONS
    subscriber_batch_messages: int = DEFAULT_SUBSCRIBER_BATCH_MESSAGES
    """Records per subscription batch when the subscriber names no limit."""
    subscriber_batch_bytes: int = DEFAULT_SUBSCRIBER_BATCH_BYTES
    """Bytes per subscription batch when the subscriber names no limit."""
    subscriber_buffer_bytes: int = DEFAULT_SUBSCRIBER_BUFFER_BYTES
    """Per-subscription byte budget: the most record bytes a subscription holds in hand (it reads
    from the log again once its client has taken them; see ``broker/subscription.py``)."""
    open_files_max: int = DEFAULT_OPEN_FILES_MAX
    """Descriptors the open segment files of all partitions may hold together; the least
    recently used segments' files are closed beyond it (``tidelog.log.filecache``)."""
    max_streams: int = DEFAULT_MAX_STREAMS
    """Client streams this broker holds; a create beyond it is refused (``LimitReached``)."""
    max_partitions_per_stream: int = DEFAULT_MAX_PARTITIONS_PER_STREAM
    """Partitions a client stream may be created with."""
    max_groups: int = DEFAULT_MAX_GROUPS
    """Consumer groups this broker coordinates; a join creating one more is refused."""
    max_views: int = DEFAULT_MAX_VIEWS
    """Views of all streams together; a declare beyond it is refused."""
    max_cursors_per_stream: int = DEFAULT_MAX_CURSORS_PER_STREAM
    """Cursor ids one stream may have; a new id beyond it is refused."""
    group_consumer_timeout_s: float = 15.0
    """A consumer-group member silent this long is removed."""
    group_coordinator_timeout_s: float = 15.0
    """How long members' reports of an unreachable coordinator count (clusters)."""
    clustered: bool = False
    """A broker of a cluster: every partition's log opens with its readers held at the high
    watermark the replica last knew (``Partition``'s ``held``), before the cluster gives the
    partition its role."""

    @property
    def flush_policy(self) -> FlushPolicy:
        return self.log.flush_policy
