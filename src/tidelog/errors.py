"""Every failure tidelog reports, one exception type each.

All layers raise these types; ``tidelog.api.errors`` (a later layer) maps them to gRPC status
codes in one place. Each message says what happened and what the caller can do about it.
"""

from __future__ import annotations


class TidelogError(Exception):
    """Base class of every error tidelog raises on purpose."""


class TidelogWarning(UserWarning):
    """Warnings tidelog emits (swapped bounds, data skipped during recovery, ...)."""


class LogError(TidelogError):
    """A commit-log failure."""


class MessageTooLarge(LogError):
    """A message exceeds the log's ``max_message_bytes``; nothing of its batch was written."""

    def __init__(self, size: int, limit: int, index: int = 0) -> None:
        self.size = size
        self.limit = limit
        self.index = index
        super().__init__(
            f"message {index} of the batch is {size} bytes (key + value + headers), over the log's "
            f"limit of {limit} bytes; nothing in the batch was written. Split the payload or raise "
            f"max_message_bytes."
        )


class CorruptRecord(LogError):
    """Stored bytes fail their CRC-32C or framing check; the damaged bytes are never returned."""

    def __init__(self, segment: str, position: int, detail: str) -> None:
        self.segment = segment
        self.position = position
        self.detail = detail
        super().__init__(f"corrupt record in {segment} at byte {position}: {detail}")


class OffsetOutOfRange(LogError):
    """An offset argument that can never be valid (negative, or below an explicit bound)."""


class LogClosed(LogError):
    """The log was closed (or deleted) while the call was in progress or before it started."""


class LogLocked(LogError):
    """Another process (or another open log object) holds the log directory."""
