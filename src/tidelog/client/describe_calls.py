"""A stream's details and the consumer groups, as the console shows them (``DescribeStream``,
``ListGroups``): read-only calls, retried while the server is unreachable.

:class:`DescribeCalls` is mixed into :class:`~tidelog.client.AsyncClient` and
:class:`SyncDescribeCalls` into the blocking :class:`~tidelog.client.Client`.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.retry import Attempt

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionDetails:
    partition: int
    oldest_offset: int
    """-1 when the partition holds nothing (or is paused)"""
    newest_offset: int
    size_bytes: int
    """bytes held; -1 while paused (its files are closed)"""
    messages_in: int
    """appended since the server started"""
    bytes_in: int
    paused: bool
    readonly: bool
    subscribers: int

    @property
    def messages(self) -> int:
        """Messages held (offsets from oldest to newest; compaction may have removed some)."""
        if self.oldest_offset < 0 or self.newest_offset < 0:
            return 0
        return self.newest_offset - self.oldest_offset + 1


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Effective settings: the stream's own, or the server's defaults. None: no limit."""

    retention_bytes: int | None
    retention_messages: int | None
    retention_age_s: float | None
    compact: bool
    segment_max_bytes: int
    segment_max_age_s: float
    max_message_bytes: int
    auto_pause_s: float | None
    optimistic_concurrency: bool
    group: str


@dataclass(frozen=True, slots=True)
class StreamDetails:
    stream: str
    partitions: tuple[PartitionDetails, ...]
    settings: StreamSettings

    @classmethod
    def from_wire(cls, r: v1.DescribeStreamResponse) -> StreamDetails:
        s = r.settings
        return cls(
            r.stream,
            tuple(
                PartitionDetails(
                    p.partition,
                    p.oldest_offset,
                    p.newest_offset,
                    p.size_bytes,
                    p.messages_in,
                    p.bytes_in,
                    p.paused,
                    p.readonly,
                    p.subscribers,
                )
                for p in r.partitions
            ),
            StreamSettings(
                s.retention_bytes or None,
                s.retention_messages or None,
                s.retention_age_s or None,
                s.compact,
                s.segment_max_bytes,
                s.segment_max_age_s,
                s.max_message_bytes,
                s.auto_pause_s or None,
                s.optimistic_concurrency,
                s.group,
            ),
        )


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    consumer_id: str
    streams: tuple[str, ...]
    idle_s: float
    """seconds since the member last called the coordinator"""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group_id: str
    epoch: int
    members: tuple[GroupMemberInfo, ...]
    assignments: dict[str, dict[str, tuple[int, ...]]]
    """consumer id -> stream -> partitions"""

    @classmethod
    def from_wire(cls, g: v1.GroupDescription) -> GroupInfo:
        assignments: dict[str, dict[str, tuple[int, ...]]] = {}
        for a in g.assignments:
            assignments.setdefault(a.consumer_id, {})[a.stream] = tuple(a.partitions)
        return cls(
            g.group_id,
            g.epoch,
            tuple(GroupMemberInfo(m.consumer_id, tuple(m.streams), m.idle_s) for m in g.members),
            assignments,
        )


class DescribeCalls:
    """The describe calls of :class:`~tidelog.client.AsyncClient`."""

    _v1: v1_grpc.TidelogAsyncStub

    async def _retrying(self, attempt: Attempt[T], timeout: float | None = None) -> T:
        raise NotImplementedError  # provided by AsyncClient

    async def describe_stream(self, stream: str) -> StreamDetails:
        """Per partition: oldest and newest offset, bytes held, counters, paused/read-only; and
        the stream's effective retention, compaction and limits. Unknown stream: NotFound."""
        request = v1.DescribeStreamRequest(stream=stream)

        async def attempt(timeout: float | None, number: int) -> v1.DescribeStreamResponse:
            return await self._v1.DescribeStream(request, timeout=timeout)

        return StreamDetails.from_wire(await self._retrying(attempt))

    async def list_groups(self) -> list[GroupInfo]:
        """Every consumer group, with its members and their assignments, by group id."""

        async def attempt(timeout: float | None, number: int) -> v1.ListGroupsResponse:
            return await self._v1.ListGroups(v1.ListGroupsRequest(), timeout=timeout)

        return [GroupInfo.from_wire(g) for g in (await self._retrying(attempt)).groups]


class SyncDescribeCalls:
    """The blocking forms of :class:`DescribeCalls`, mixed into :class:`~tidelog.client.Client`."""

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # provided by Client

    def _describe_calls(self) -> DescribeCalls:
        raise NotImplementedError  # provided by Client

    def describe_stream(self, stream: str) -> StreamDetails:
        return self._run(self._describe_calls().describe_stream(stream))

    def list_groups(self) -> list[GroupInfo]:
        return self._run(self._describe_calls().list_groups())
