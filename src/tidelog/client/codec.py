"""Client values to ``tidelog.v1`` messages and back: start and stop positions, packed messages
to publish, and the columnar batches a subscription or a consumer receives.

Pure conversions without I/O: ``aio`` (the client), ``consumer`` and ``sync`` import them, and
this module imports none of those, so the client's modules form no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client.batches import ReceivedBatch, decode_frame
from tidelog.client.errors import InvalidArgument
from tidelog.client.models import BrowsePage, Message, ReceivedMessage, Start, Stop
from tidelog.wire import columns

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(moment: datetime) -> int:
    """ns since the Unix epoch, exactly (a float timestamp would be off by up to ~100 ns);
    a naive datetime is local time, as for ``datetime.timestamp``."""
    aware = moment if moment.tzinfo is not None else moment.astimezone()
    return (aware - _EPOCH) // timedelta(microseconds=1) * 1000


def start_fields(start: Start) -> dict[str, Any]:
    """``SubscribeBatchesRequest`` fields for a start position."""
    if isinstance(start, datetime):
        return {"start_position": v1.START_TIMESTAMP, "start_timestamp": _ns(start)}
    if isinstance(start, bool) or not isinstance(start, int | str):
        raise InvalidArgument(
            f"start must be 'earliest', 'latest', 'new', an offset or a time, not {start!r}"
        )
    if isinstance(start, int):
        return {"start_position": v1.START_OFFSET, "start_offset": start}
    named = {"earliest": v1.START_EARLIEST, "latest": v1.START_LATEST, "new": v1.START_NEW_ONLY}
    if start not in named:
        raise InvalidArgument(
            f"start must be 'earliest', 'latest', 'new', an offset or a time, not {start!r}"
        )
    return {"start_position": named[start]}


def stop_fields(stop: Stop) -> dict[str, Any]:
    if stop is None:
        return {"stop_position": v1.STOP_ON_CANCEL}
    if isinstance(stop, datetime):
        return {"stop_position": v1.STOP_TIMESTAMP, "stop_timestamp": _ns(stop)}
    if stop == "latest":
        return {"stop_position": v1.STOP_LATEST}
    if isinstance(stop, int) and not isinstance(stop, bool):
        return {"stop_position": v1.STOP_OFFSET, "stop_offset": stop}
    raise InvalidArgument(f"stop must be None, 'latest', an offset or a time, not {stop!r}")


def pack_messages(messages: Sequence[bytes | Message]) -> v1.Messages:
    """The columns of ``messages`` to publish (bare values take the fast path)."""
    if all(type(m) is bytes for m in messages):
        return columns.pack(messages)  # type: ignore[arg-type]
    msgs = [m if isinstance(m, Message) else Message(m) for m in messages]
    return columns.pack(
        [m.value for m in msgs], [m.key for m in msgs], [dict(m.headers) for m in msgs]
    )


def decode(
    batch: v1.RecordBatch | ReceivedBatch, stream: str, partition: int
) -> list[ReceivedMessage]:
    """The messages of one batch, in delivery order: a raw frame, or what ``subscribe_batches``
    hands out (whose own ``messages()`` this is; iterating it gives the same)."""
    if isinstance(batch, ReceivedBatch):
        return batch.messages()
    return decode_frame(batch, stream, partition)


def _raw(text: bytes | str) -> bytes:
    return text.encode() if isinstance(text, str) else bytes(text)


def browse_request(
    stream: str,
    *,
    limit: int,
    newest_first: bool,
    start: datetime | None,
    token: str | None,
    partitions: Sequence[int] | None,
    anchor: tuple[int, int, int] | None = None,
    include_anchor: bool = False,
    key: bytes | str | None,
    key_prefix: bytes | str | None,
    headers: Mapping[str, bytes | str] | None,
    contains: bytes | str | None,
    since: datetime | None,
    until: datetime | None,
    max_scan: int | None,
    max_scan_seconds: float | None,
) -> v1.BrowseRequest:
    """The ``Browse`` request for ``AsyncClient.browse``'s arguments (text is sent as UTF-8)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument(f"limit must be a positive number of messages, got {limit!r}")
    if max_scan is not None and max_scan < 1:
        raise InvalidArgument(f"max_scan must be at least 1 message, got {max_scan}")
    if max_scan_seconds is not None and not max_scan_seconds > 0:
        raise InvalidArgument(f"max_scan_seconds must be above 0, got {max_scan_seconds}")
    keep = v1.BrowseFilter(
        headers=[v1.Header(name=n, value=_raw(v)) for n, v in (headers or {}).items()]
    )
    if key is not None:
        keep.key = _raw(key)
    if key_prefix is not None:
        keep.key_prefix = _raw(key_prefix)
    if contains is not None:
        keep.value_contains = _raw(contains)
    if since is not None:
        keep.since_ns = _ns(since)
    if until is not None:
        keep.until_ns = _ns(until)
    request = v1.BrowseRequest(
        stream=stream,
        limit=limit,
        oldest_first=not newest_first,
        token=token or "",
        partitions=list(partitions or ()),
        filter=keep,
        max_scan=max_scan or 0,
        max_scan_seconds=max_scan_seconds or 0.0,
    )
    if start is not None and not token:
        request.start_ns = _ns(start)
    if anchor is not None and not token:
        timestamp_ns, partition, offset = anchor
        request.anchor.CopyFrom(
            v1.BrowseAnchor(
                timestamp_ns=timestamp_ns,
                partition=partition,
                offset=offset,
                include=include_anchor,
            )
        )
    return request


def browse_page(response: v1.BrowseResponse, stream: str) -> BrowsePage:
    """The client's page for a ``Browse`` response: its messages are a :class:`ReceivedBatch`
    (columns, with each message's partition; messages built when first read)."""
    if len(response.partitions) % 4:
        raise ValueError("malformed page: partitions is not a whole number of int32 entries")
    partitions = response.partitions
    first = int.from_bytes(partitions[:4], "little", signed=True) if partitions else -1
    batch = ReceivedBatch(response.batch, stream, first, partitions=partitions)
    return BrowsePage(
        batch,
        response.next_token or None,
        int(response.scanned),
        response.budget_exhausted,
        response.reached_timestamp if response.HasField("reached_timestamp") else None,
        batch,
    )
