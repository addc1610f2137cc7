"""Values the client hands out and takes in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Start = Literal["earliest", "latest", "new"] | int | datetime
"""Where a subscription starts: a keyword, an offset, or a time (first message at or after it)."""

Stop = Literal["latest"] | int | datetime | None
"""Where it stops (inclusive): never (None), the newest offset at subscribe time, an offset, a
time (last message at or before it)."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message to publish."""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as delivered to a subscriber."""

    offset: int
    timestamp: int
    """Broker timestamp, ns since the Unix epoch."""
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes]
    partition: int
    stream: str

    @property
    def time(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp / 1e9).astimezone()


@dataclass(frozen=True, slots=True)
class Ack:
    """Where a published message was stored."""

    stream: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    high_watermark: int
    newest_offset: int
    paused: bool
    readonly: bool
    leader: str


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    subject: str
    created: int
    partitions: tuple[PartitionInfo, ...]
