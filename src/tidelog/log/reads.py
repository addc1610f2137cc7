"""The log's two read primitives and its time lookups, over a :class:`LocalLog`.

Invariant: only committed records are ever returned (offsets at or below the high watermark the
caller passes), each batch comes from one segment, and every record in it passed its CRC check.
The index lookup and the one ``pread`` per batch happen under the log's lock (``*_locked``); the
CRC work happens after it is released (:func:`verified`), on bytes already in hand.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tidelog.log.batch import MessageBatch
from tidelog.log.index import IndexArray
from tidelog.log.local import LocalLog
from tidelog.log.record import verify_records
from tidelog.log.segment import Segment


class Slice(NamedTuple):
    """Bytes read from one segment and the index entries that describe them."""

    segment: Segment
    data: bytes
    entries: IndexArray
    first_position: int


def check_limits(max_messages: int, max_bytes: int) -> None:
    if max_messages < 1 or max_bytes < 1:
        raise ValueError("max_messages and max_bytes must be positive")


def forward_locked(
    local: LocalLog, start: int, last: int, max_messages: int, max_bytes: int
) -> Slice | None:
    """Records with offsets in ``[start, last]`` (``last`` at most the high watermark),
    ascending, from the first segment holding one."""
    if start > last:
        return None
    k = max(bisect.bisect_right(local.bases, start) - 1, 0)
    segments = local.segments
    while k < len(segments):
        segment = local.checked(segments[k])
        slot = segment.slot_at_or_after(start)
        if slot < segment.count:
            break
        k += 1
    else:
        return None
    end = min(segment.slot_at_or_before(last) + 1, slot + max_messages)
    if end <= slot:
        return None
    # A read ahead asks for many records and a byte limit: the entries of records that start
    # past the limit are not copied (bisected in place), only the few that may fit.
    end = segment.slot_past_bytes(slot, end, max_bytes)
    entries = segment.entries(slot, end)
    positions = entries["position"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    first_position = int(positions[0])
    ends = positions + sizes - first_position
    keep = max(int(np.searchsorted(ends, max_bytes, side="right")), 1)
    data = segment.read(first_position, int(ends[keep - 1]))
    return Slice(segment, data, entries[:keep], first_position)


def backward_locked(
    local: LocalLog, top: int, lowest: int, max_messages: int, max_bytes: int
) -> Slice | None:
    """Records with offsets in ``[lowest, top]`` (``top`` at most the high watermark), the
    newest first, from the newest segment holding one (the slice itself is ascending)."""
    if top < lowest:
        return None
    k = bisect.bisect_right(local.bases, top) - 1
    while k >= 0:
        segment = local.checked(local.segments[k])
        slot = segment.slot_at_or_before(top)
        if slot >= 0:
            break
        k -= 1
    else:
        return None
    first = max(segment.slot_at_or_after(lowest), slot - max_messages + 1)
    if first > slot:
        return None
    entries = segment.entries(first, slot + 1)
    sizes = entries["size"].astype(np.int64)
    keep = max(int(np.searchsorted(np.cumsum(sizes[::-1]), max_bytes, side="right")), 1)
    entries, sizes = entries[-keep:], sizes[-keep:]
    positions = entries["position"].astype(np.int64)
    first_position = int(positions[0])
    data = segment.read(first_position, int(positions[-1] + sizes[-1]) - first_position)
    return Slice(segment, data, entries, first_position)


def verified(piece: Slice | None) -> MessageBatch:
    """The records of ``piece``, checked against their CRCs and index entries (no lock needed:
    all in hand)."""
    if piece is None:
        return MessageBatch.empty()
    segment, data, entries, first_position = piece
    positions = entries["position"].astype(np.int64) - first_position
    sizes = entries["size"].astype(np.int64)
    offsets = segment.offsets_of(entries)
    timestamps = entries["timestamp"].astype(np.int64)
    header = verify_records(
        data, positions, sizes, offsets, timestamps, segment.name, first_position
    )
    # Verified: the headers' offsets and timestamps are these (no second pass over the headers).
    return MessageBatch(data, positions, sizes, header, offsets, timestamps)


VERIFY_RECORDS = 1000
VERIFY_BYTES = 1 << 20
"""What :func:`verify_all` reads at a time."""


def verify_all(local: LocalLog, high_watermark: Callable[[], int]) -> int:
    """Read every record up to the high watermark through the files, CRC-checked; how many
    (``CorruptRecord`` at the first damaged one). The lock is held for each read only."""
    count, start = 0, 0
    while True:
        with local.lock:
            local.check_open()
            piece = forward_locked(local, start, high_watermark(), VERIFY_RECORDS, VERIFY_BYTES)
        batch = verified(piece)
        if not batch:
            return count
        count += len(batch)
        start = batch.last_offset + 1


def offset_at_or_after_timestamp_locked(
    local: LocalLog, timestamp: int, high_watermark: int
) -> int | None:
    for segment in local.segments:
        newest = segment.newest_timestamp
        if newest is not None and newest >= timestamp:
            segment = local.checked(segment)
            offset = segment.offset_at(segment.slot_at_or_after_timestamp(timestamp))
            return offset if offset <= high_watermark else None
    return None


def offset_at_or_before_timestamp_locked(
    local: LocalLog, timestamp: int, high_watermark: int
) -> int | None:
    for segment in reversed(local.segments):
        oldest = segment.oldest_timestamp
        if oldest is not None and oldest <= timestamp:
            segment = local.checked(segment)
            offset = segment.offset_at(segment.slot_at_or_before_timestamp(timestamp))
            # Past the high watermark, the newest committed record is older still.
            offset = min(offset, high_watermark)
            return offset if offset >= 0 else None
    return None
