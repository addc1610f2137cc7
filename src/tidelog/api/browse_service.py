"""The ``Browse`` RPC of ``tidelog.v1``: a page of a stream merged across its partitions.

The request's fields become the broker's arguments (``Broker.browse`` checks them all), and the
page goes back as one columnar batch with a partition column; the token stays opaque here.
"""

from __future__ import annotations

import math

import grpc
import numpy as np

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.broker import (
    DEFAULT_BROWSE_LIMIT,
    DEFAULT_BROWSE_MAX_SCAN,
    DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    BrowseAnchor,
    BrowseFilter,
    BrowseResult,
)
from tidelog.control import Control
from tidelog.errors import InvalidArgument
from tidelog.wire import columns

Context = grpc.aio.ServicerContext[object, object]


def filter_of(message: v1.BrowseFilter) -> BrowseFilter:
    return BrowseFilter(
        key=message.key if message.HasField("key") else None,
        key_prefix=message.key_prefix if message.HasField("key_prefix") else None,
        headers=tuple((h.name, h.value) for h in message.headers),
        contains=message.value_contains if message.HasField("value_contains") else None,
        since_ns=message.since_ns if message.HasField("since_ns") else None,
        until_ns=message.until_ns if message.HasField("until_ns") else None,
    )


def anchor_of(request: v1.BrowseRequest) -> BrowseAnchor | None:
    if not request.HasField("anchor"):
        return None
    anchor = request.anchor
    if anchor.partition < 0 or anchor.offset < 0:
        raise InvalidArgument(
            "a browse anchor names a message: its partition and offset are >= 0, got "
            f"partition {anchor.partition}, offset {anchor.offset}"
        )
    return BrowseAnchor(anchor.timestamp_ns, anchor.partition, anchor.offset, anchor.include)


def page_of(result: BrowseResult) -> v1.BrowseResponse:
    records = [r.record for r in result.records]
    response = v1.BrowseResponse(
        batch=v1.RecordBatch(
            offsets=columns.pack_int64(np.array([r.offset for r in records], dtype=np.int64)),
            timestamps=columns.pack_int64(np.array([r.timestamp for r in records], dtype=np.int64)),
            messages=columns.pack(
                [r.value for r in records],
                [r.key for r in records],
                [r.headers for r in records],
            ),
        ),
        partitions=np.array([r.partition for r in result.records], dtype="<i4").tobytes(),
        next_token=result.next_token or "",
        scanned=result.scanned,
        budget_exhausted=result.budget_exhausted,
    )
    if result.reached_timestamp is not None:
        response.reached_timestamp = result.reached_timestamp
    return response


class BrowseService(v1_grpc.TidelogServicer):
    """Answers ``Browse``; mixed into :class:`tidelog.api.v1.TidelogService`."""

    control: Control

    async def Browse(self, request: v1.BrowseRequest, context: Context) -> v1.BrowseResponse:
        if not request.stream:
            raise InvalidArgument("browse needs a stream name")
        seconds = request.max_scan_seconds
        if math.isnan(seconds) or seconds < 0:
            raise InvalidArgument(
                f"max_scan_seconds must be a positive number of seconds, got {seconds}"
            )
        if any(p < 0 for p in request.partitions):
            raise InvalidArgument("partition numbers are >= 0")
        result = await self.control.browse(
            request.stream,
            partitions=list(request.partitions),
            newest_first=not request.oldest_first,
            limit=request.limit or DEFAULT_BROWSE_LIMIT,
            start_ns=request.start_ns if request.HasField("start_ns") else None,
            anchor=anchor_of(request),
            token=request.token or None,
            keep=filter_of(request.filter),
            max_scan=request.max_scan or DEFAULT_BROWSE_MAX_SCAN,
            max_scan_seconds=seconds or DEFAULT_BROWSE_MAX_SCAN_SECONDS,
        )
        return page_of(result)
