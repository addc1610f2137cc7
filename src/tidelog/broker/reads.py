"""Reads handed over: Subscribe, SubscribeBatches and Consume get a :class:`Subscription`, and
Browse a page, once their arguments are resolved and checked here.

Invariant: every error of a read's arguments (an unknown stream or partition, a role that refuses
the read, a start position out of range, a browse limit or token that does not fit) is raised by
these methods, before anything is sent to the caller; what they return only delivers. A read that
opens a paused partition resumes it (a resuming subscribe, a browse); a Consume never does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tidelog.broker.browse import BrowseAnchor, BrowseQuery, BrowseResult
from tidelog.broker.browse import browse as read_page
from tidelog.broker.browse_filter import BrowseFilter
from tidelog.broker.config import (
    DEFAULT_BROWSE_LIMIT,
    DEFAULT_BROWSE_MAX_SCAN,
    DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    MAX_BROWSE_LIMIT,
    MAX_BROWSE_MAX_SCAN_SECONDS,
)
from tidelog.broker.core import BrokerCore
from tidelog.broker.positions import SubscribeRequest, resolve
from tidelog.broker.subscription import Subscription
from tidelog.errors import InvalidArgument
from tidelog.wire.browse_token import check_token, decode_token


class Reads(BrokerCore):
    """Subscribe, Consume and Browse: one part of :class:`~tidelog.broker.broker.Broker`."""

    def subscribe(
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
        """Resolve the request and return the subscription; every error is raised here, before
        anything is sent to the subscriber. Batch limits default to the broker's settings.
        ``read_replica``: a follower of a cluster may serve it (up to the high watermark).
        ``principal``: the caller, for a group subscription (``groups.py``, "Owners")."""
        target = self.partition(stream, partition)
        if target.role is not None:
            target.role.check_read(read_replica)
        if target.paused and resume:
            self.resume(target)
        bounds = resolve(target.log, request)
        subscription = Subscription(
            target,
            bounds,
            max_messages=max_messages or self.config.subscriber_batch_messages,
            max_bytes=max_bytes or self.config.subscriber_batch_bytes,
            buffer_bytes=self.config.subscriber_buffer_bytes,
        )
        if group is not None:  # (group id, consumer id, group epoch)
            group_id, consumer_id, epoch = group
            subscription.on_close = self.groups.admit(
                group_id,
                consumer_id,
                epoch,
                stream,
                partition,
                subscription.fence,
                principal=principal,
            )
        return subscription

    def consume(
        self, stream: str, partition: int, request: SubscribeRequest, *, max_messages: int
    ) -> Subscription:
        """A seekable subscription (``Consume``): it reads only what the subscriber grants and
        moves on :meth:`Subscription.seek`. It has no stop bound; every error of the start
        position is raised here."""
        target = self.partition(stream, partition)
        if target.role is not None:
            target.role.check_read(False)
        return Subscription(
            target,
            resolve(target.log, request),
            max_messages=max_messages,
            max_bytes=self.config.subscriber_batch_bytes,
            buffer_bytes=self.config.subscriber_buffer_bytes,
            seekable=True,
        )

    async def browse(
        self,
        stream: str,
        *,
        partitions: Sequence[int] = (),
        newest_first: bool = True,
        limit: int = DEFAULT_BROWSE_LIMIT,
        start_ns: int | None = None,
        anchor: BrowseAnchor | None = None,
        token: str | None = None,
        keep: BrowseFilter | None = None,
        max_scan: int = DEFAULT_BROWSE_MAX_SCAN,
        max_scan_seconds: float = DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    ) -> BrowseResult:
        """One page of ``stream`` merged across ``partitions`` (all when empty) in timestamp
        order (``browse.py``), from ``start_ns``, from ``anchor`` (a point of the merged order; it
        overrides ``start_ns``), or from a previous page's ``token`` (which overrides both); only
        records passing ``keep``. Paused partitions are resumed (a read opens them, as a resuming
        subscribe does). Every argument is checked here."""
        target = self.stream(stream)
        if not 1 <= limit <= MAX_BROWSE_LIMIT:
            raise InvalidArgument(f"browse limit must be 1..{MAX_BROWSE_LIMIT}, got {limit}")
        if max_scan < 1:
            raise InvalidArgument(f"max_scan must be at least 1 message, got {max_scan}")
        if not 0 < max_scan_seconds <= MAX_BROWSE_MAX_SCAN_SECONDS:
            raise InvalidArgument(
                f"max_scan_seconds must be above 0 and at most {MAX_BROWSE_MAX_SCAN_SECONDS:g}, "
                f"got {max_scan_seconds}"
            )
        numbers = sorted(set(partitions))
        for number in numbers:
            target.partition(number)  # PartitionNotFound for a number the stream lacks
        position = None
        if token:
            position = decode_token(token)
            check_token(
                position,
                stream=stream,
                newest_first=newest_first,
                partition_count=len(target.partitions),
                partitions=numbers,
            )
            numbers = list(position.partitions)
        chosen = target.select(numbers)
        for partition in chosen:
            if partition.paused:
                self.resume(partition)
            partition.check_serving()
        query = BrowseQuery(
            partitions=tuple(p.number for p in chosen),
            newest_first=newest_first,
            limit=limit,
            start_ns=start_ns,
            anchor=anchor,
            position=position,
            filter=keep or BrowseFilter(),
            max_scan=max_scan,
            max_scan_seconds=max_scan_seconds,
        )
        logs = {p.number: p.log for p in chosen}
        return await asyncio.to_thread(read_page, stream, logs, query)
