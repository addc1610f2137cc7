"""Which sealed segments retention deletes: a pure decision over segment summaries and a clock.

Rules (whole sealed segments only, oldest first, never the active segment):
- age: a segment whose newest record is older than ``retention_age_s`` goes;
- bytes / messages: a segment goes while the log would still hold at least ``retention_bytes``
  bytes / ``retention_messages`` messages without it (the limits are floors: the newest N are always
  kept, and the log may hold up to one segment more);
- an empty sealed segment holds nothing worth keeping and goes with the others before it.
Deletion stops at the first segment no rule wants, so the log stays contiguous.

A release (:func:`released_prefix`) is the other way a prefix goes: its owner says it no longer
needs any record below an offset, and the sealed segments wholly below it go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    size_bytes: int
    message_count: int
    newest_timestamp: int | None
    """ns; None for an empty segment"""


def expired_prefix(
    sealed: Sequence[SegmentSummary],
    active: SegmentSummary,
    *,
    retention_bytes: int | None,
    retention_messages: int | None,
    retention_age_s: float | None,
    now_ns: int,
) -> int:
    """How many of the oldest ``sealed`` segments (given oldest first) retention deletes now."""
    total_bytes = active.size_bytes + sum(s.size_bytes for s in sealed)
    total_messages = active.message_count + sum(s.message_count for s in sealed)
    cutoff = None if retention_age_s is None else now_ns - int(retention_age_s * 1e9)
    deleted = 0
    for segment in sealed:
        expired = (
            segment.message_count == 0
            or (
                cutoff is not None
                and segment.newest_timestamp is not None
                and segment.newest_timestamp < cutoff
            )
            or (retention_bytes is not None and total_bytes - segment.size_bytes >= retention_bytes)
            or (
                retention_messages is not None
                and total_messages - segment.message_count >= retention_messages
            )
        )
        if not expired:
            break
        deleted += 1
        total_bytes -= segment.size_bytes
        total_messages -= segment.message_count
    return deleted


def released_prefix(bases: Sequence[int], below: int) -> int:
    """How many of the oldest segments hold only offsets below ``below`` and are sealed, given
    every segment's base offset oldest first (the last one is the active segment, never
    released). A segment's records all lie below the next segment's base."""
    released = 0
    for following in bases[1:]:
        if following > below:
            break
        released += 1
    return released
