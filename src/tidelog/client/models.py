"""Values the client hands out and takes in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, NamedTuple, overload

if TYPE_CHECKING:
    from tidelog.client.batches import ReceivedBatch

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


class ReceivedMessage(NamedTuple):
    """A message as delivered to a subscriber (a named tuple: subscribers receive many, and a
    tuple is built several times faster than a dataclass)."""

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

    @property
    def merge_key(self) -> tuple[int, int, int]:
        """(timestamp, partition, offset): where ``browse`` sorts it; an ``anchor`` to browse
        from."""
        return (self.timestamp, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class BrowsePage:
    """A page of a stream's messages merged across partitions (``browse``), in page order."""

    messages: Sequence[ReceivedMessage]
    """The messages (from ``browse``: the page's :attr:`batch`, whose messages are built when
    first read)."""
    next_token: str | None
    """Pass it as ``token`` (same direction and filters) for the next page; None when there is
    nothing more in this direction. An oldest-first page at the live end still has one: the
    next page holds what arrived since (empty when nothing did)."""
    scanned: int
    """Messages the server examined for this page, passing the filters or not."""
    budget_exhausted: bool
    """The scan stopped at its budget before the page was full: continue with ``next_token``."""
    reached_timestamp: int | None
    """Timestamp (ns) of the last message examined: how far the scan got (None: none was)."""
    batch: ReceivedBatch | None = None
    """The page as columns, with each message's partition (``tidelog.client.batches``): what
    ``browse`` returns has it; a page made by hand may not."""


@dataclass(frozen=True, slots=True)
class Ack:
    """Where a published message was stored."""

    stream: str
    partition: int
    offset: int


class Acks(Sequence[Ack]):
    """The acks of a published batch: consecutive offsets of one partition, built on access.

    ``duplicate`` (idempotent publishing only): the partition held this producer's batch
    already and nothing was appended; the acks are the stored batch's, or none when the
    sequence was below the producer's latest.
    """

    __slots__ = ("duplicate", "offsets", "partition", "stream")

    def __init__(
        self, stream: str, partition: int, offsets: range, *, duplicate: bool = False
    ) -> None:
        self.stream = stream
        self.partition = partition
        self.offsets = offsets
        self.duplicate = duplicate

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> Ack: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Ack]: ...
    def __getitem__(self, index: int | slice) -> Ack | Sequence[Ack]:
        if isinstance(index, slice):
            return Acks(self.stream, self.partition, self.offsets[index])
        return Ack(self.stream, self.partition, self.offsets[index])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Acks):
            return (self.stream, self.partition, self.offsets) == (
                other.stream,
                other.partition,
                other.offsets,
            )
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.stream, self.partition, self.offsets))

    def __repr__(self) -> str:
        duplicate = ", duplicate=True" if self.duplicate else ""
        return (
            f"Acks({self.stream!r}, partition={self.partition}, offsets={self.offsets}{duplicate})"
        )


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
