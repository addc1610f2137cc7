"""Per-log settings in one frozen value: every default of the commit log lives here.

Where tidelog's defaults live: each value is written once, as a named constant (``DEFAULT_*``,
or a limit such as ``MIN_SEGMENT_BYTES``) in the config module of the lowest layer that needs
it — this one for the commit log, ``tidelog.broker.config`` for the broker, ``tidelog.wire``
for what client and server share. Every config above takes values, and names the constant
where it needs the default again (``BrokerConfig``, ``tidelog.api.settings.ServerSettings``),
so ``ServerSettings``, the object users configure, documents the same values the log uses.
``docs/operations.md`` lists them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB
HOUR_S = 3600.0

# Positions in the index are u32: a segment may never grow past 4 GiB. Keep a whole maximal
# batch of headroom below that so the size check before each append is enough.
MAX_SEGMENT_BYTES = 2**32 - 64 * MiB
# Any positive size, as Liftbridge accepts: a batch larger than the limit gets a segment of its
# own (tiny segments are legitimate in tests and for streams compacted often).
MIN_SEGMENT_BYTES = 1
MAX_MESSAGE_BYTES_LIMIT = 64 * MiB
"""The largest ``max_message_bytes`` any log, stream or server may be configured with."""

DEFAULT_SEGMENT_MAX_BYTES = 256 * MiB
DEFAULT_SEGMENT_MAX_AGE_S = 168 * HOUR_S
DEFAULT_MAX_MESSAGE_BYTES = 256 * KiB
DEFAULT_RETENTION_AGE_S = 168 * HOUR_S
DEFAULT_FLUSH_INTERVAL_S = 1.0


class FlushPolicy(enum.Enum):
    """When appended bytes are forced to stable storage (fdatasync).

    ``ALWAYS``: an append returns only after its bytes are synced; concurrent appenders share one
    sync (group commit). Survives power loss. The high watermark moves after the sync.
    ``INTERVAL``: bytes reach the OS at once and are synced every ``flush_interval_s`` by a
    background flusher. Survives a process crash (kill -9); a power loss can lose the last interval.
    ``NEVER``: the OS decides when to write back; synced only on roll and clean close. Survives a
    process crash; a power loss can lose anything not yet written back.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


DEFAULT_FLUSH_POLICY = FlushPolicy.INTERVAL


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one commit log. ``None`` for a retention limit means unlimited."""

    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    """Roll to a new segment before an append that would take the active one past this size."""
    segment_max_age_s: float = DEFAULT_SEGMENT_MAX_AGE_S
    """Roll once the active segment's first record is this old (checked on append and maintain)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest message accepted: key + value + encoded headers."""
    index_preallocate_bytes: int = 10 * MiB
    """The active index file is preallocated and grown in steps of this size, trimmed on seal."""
    retention_bytes: int | None = None
    """Keep at least this many bytes; older sealed segments beyond it are deleted."""
    retention_messages: int | None = None
    """Keep at least this many messages; older sealed segments beyond it are deleted."""
    retention_age_s: float | None = DEFAULT_RETENTION_AGE_S
    """Delete sealed segments whose newest record is older than this."""
    flush_policy: FlushPolicy = DEFAULT_FLUSH_POLICY
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    """With ``FlushPolicy.INTERVAL``: the longest time appended bytes stay unsynced."""

    def __post_init__(self) -> None:
        if not MIN_SEGMENT_BYTES <= self.segment_max_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(
                f"segment_max_bytes must be between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES}, "
                f"got {self.segment_max_bytes}"
            )
        if self.segment_max_age_s <= 0:
            raise ValueError(f"segment_max_age_s must be positive, got {self.segment_max_age_s}")
        if not 1 <= self.max_message_bytes <= MAX_MESSAGE_BYTES_LIMIT:
            raise ValueError(
                f"max_message_bytes must be between 1 and {MAX_MESSAGE_BYTES_LIMIT}, "
                f"got {self.max_message_bytes}"
            )
        if self.index_preallocate_bytes < 20 * 64:
            raise ValueError(
                f"index_preallocate_bytes must be at least 1280, got {self.index_preallocate_bytes}"
            )
        for name in ("retention_bytes", "retention_messages"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        if self.retention_age_s is not None and self.retention_age_s <= 0:
            raise ValueError(
                f"retention_age_s must be positive or None, got {self.retention_age_s}"
            )
        if self.flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive, got {self.flush_interval_s}")
