"""What both controls serve from this broker alone: its partitions' appends and reads.

Invariant: nothing here consults a cluster. A partition's replica role (set by the cluster on a
clustered broker) refuses what this broker may not serve, inside the broker, so the same calls
are right in both modes; the two controls differ only in what the cluster decides together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import grpc

from tidelog.broker import (
    Broker,
    BrowseAnchor,
    BrowseFilter,
    BrowseResult,
    Group,
    LogConfig,
    NewRecord,
    PackedValues,
    Partition,
    Published,
    Stream,
    StreamViews,
    SubscribeRequest,
    Subscription,
)
from tidelog.control.site_host import SiteHost
from tidelog.errors import TidelogError
from tidelog.wire import NOT_LEADER_KEY


class Forwarded(TidelogError):
    """Another broker's failed answer to a call handed to it (a publish sent to a broker that
    does not lead the partition): its status, passed on as is. ``moved``: that broker said it
    does not lead the partition either (the machine-readable not-leader detail)."""

    def __init__(self, code: grpc.StatusCode, details: str, *, moved: bool = False) -> None:
        super().__init__(details)
        self.code = code
        self.moved = moved


def forwarded(error: grpc.aio.AioRpcError) -> Forwarded:
    """A failed call to another broker as the error this broker answers with."""
    trailing = error.trailing_metadata() or ()
    moved = any(key == NOT_LEADER_KEY for key, _ in trailing)
    return Forwarded(error.code(), error.details() or "", moved=moved)


class LocalControl:
    """The calls both modes serve from this broker's partitions (module docstring)."""

    def __init__(self, broker: Broker, sites: SiteHost | None = None) -> None:
        self.broker = broker
        self._sites = sites

    @property
    def broker_id(self) -> str:
        return self.broker.broker_id

    @property
    def sites(self) -> SiteHost | None:
        return self._sites

    @property
    def log_defaults(self) -> LogConfig:
        return self.broker.config.log

    def pause(self, name: str, partitions: list[int], resume_all: bool) -> None:
        self.broker.pause(name, partitions, resume_all)

    def find_stream(self, name: str) -> Stream | None:
        return self.broker.find_stream(name)

    def stream(self, name: str) -> Stream:
        return self.broker.stream(name)

    def partition(self, stream: str, number: int) -> Partition:
        return self.broker.partition(stream, number)

    def readable(self, stream: str, number: int) -> Partition:
        partition = self.broker.partition(stream, number)
        if partition.role is not None:
            partition.role.check_read(False)
        if partition.paused:
            self.broker.resume(partition)
        return partition

    def subject_targets(self, subject: str) -> list[Partition]:
        return self.broker.subject_targets(subject)

    def subject_shared(self, subject: str) -> bool:
        return self.broker.subject_shared(subject)

    async def publish(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord] | PackedValues,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
    ) -> Published:
        return await self.broker.publish(
            stream, partition, messages, expected_offset=expected_offset, durable=durable
        )

    async def publish_idempotent(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord] | PackedValues,
        producer_id: str,
        sequence: int,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
        owner: str = "",
    ) -> Published:
        return await self.broker.publish_idempotent(
            stream,
            partition,
            messages,
            producer_id,
            sequence,
            expected_offset=expected_offset,
            durable=durable,
            owner=owner,
        )

    async def _admit_group(self, group: tuple[str, str, int]) -> None:
        """Before a group member's subscription is checked against its assignment: make sure
        this broker's view of the group is current (nothing to do on a single broker)."""

    async def subscribe(
        self,
        stream: str,
        partition: int,
        request: SubscribeRequest,
        *,
        resume: bool = False,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        group: tuple[str, str, int] | None = None,
        read_replica: bool = False,
        principal: str | None = None,
    ) -> Subscription:
        if group is not None:
            await self._admit_group(group)
        return self.broker.subscribe(
            stream,
            partition,
            request,
            resume=resume,
            max_messages=max_messages,
            max_bytes=max_bytes,
            group=group,
            read_replica=read_replica,
            principal=principal,
        )

    def consume(
        self, stream: str, partition: int, request: SubscribeRequest, *, max_messages: int
    ) -> Subscription:
        return self.broker.consume(stream, partition, request, max_messages=max_messages)

    async def browse(
        self,
        stream: str,
        *,
        partitions: Sequence[int],
        newest_first: bool,
        limit: int,
        start_ns: int | None,
        anchor: BrowseAnchor | None,
        token: str | None,
        keep: BrowseFilter | None,
        max_scan: int,
        max_scan_seconds: float,
    ) -> BrowseResult:
        return await self.broker.browse(
            stream,
            partitions=partitions,
            newest_first=newest_first,
            limit=limit,
            start_ns=start_ns,
            anchor=anchor,
            token=token,
            keep=keep,
            max_scan=max_scan,
            max_scan_seconds=max_scan_seconds,
        )

    @property
    def draining(self) -> bool:
        return self.broker.draining

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.broker.when_draining(callback)

    @property
    def group_timeouts(self) -> tuple[float, float]:
        groups = self.broker.groups
        return groups.consumer_timeout_s, groups.coordinator_timeout_s

    def local_groups(self) -> Mapping[str, Group]:
        return self.broker.groups.groups

    def views(self, stream: str) -> StreamViews:
        return self.broker.views(stream)
