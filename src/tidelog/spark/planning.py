"""Offset arithmetic of the Spark data source, without I/O: ranges, splits, admission control,
and the offsets Spark keeps in its checkpoint.

Bounds, everywhere in this module: a partition holds the offsets ``[oldest, next)`` (``next``
is the high watermark + 1, so an empty partition has ``oldest == next``); an
:class:`OffsetRange` is ``[start, stop)``, start inclusive, stop exclusive, and an empty range
(``start == stop``) reads nothing. Offsets count records, but compaction may leave gaps, so a
range of n offsets holds at most n records.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import ceil
from typing import Any

from tidelog.errors import InvalidOption, UnknownPartition
from tidelog.spark.options import EARLIEST, LATEST


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """The committed offsets of one partition: ``[oldest, next)``."""

    partition: int
    oldest: int
    next: int


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, stop)`` of one partition."""

    partition: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return max(0, self.stop - self.start)


def offset_of(position: int, bounds: PartitionBounds) -> int:
    """An offset for a position: ``EARLIEST`` → oldest, ``LATEST`` → next, else itself."""
    if position == EARLIEST:
        return bounds.oldest
    if position == LATEST:
        return bounds.next
    return position


def split(
    ranges: Sequence[OffsetRange],
    max_offsets: int,
    min_pieces: int | None = None,
    *,
    newest_first: bool = False,
) -> list[OffsetRange]:
    """Cut each range into nearly equal pieces of at most ``max_offsets`` offsets; with
    ``min_pieces``, cut further (in proportion to size, as Spark's Kafka source does) until
    there are at least that many. Empty ranges are dropped. ``newest_first`` orders each
    partition's pieces from its highest offsets down (for reverse reads)."""
    ranges = [r for r in ranges if r.size]
    counts = [ceil(r.size / max_offsets) for r in ranges]
    total = sum(r.size for r in ranges)
    if min_pieces is not None and total and sum(counts) < min_pieces:
        counts = [
            min(r.size, max(c, ceil(r.size / total * min_pieces)))
            for r, c in zip(ranges, counts, strict=True)
        ]
    pieces: list[OffsetRange] = []
    for r, count in zip(ranges, counts, strict=True):
        cuts = [r.start + r.size * i // count for i in range(count + 1)]
        own = [OffsetRange(r.partition, a, b) for a, b in itertools.pairwise(cuts)]
        pieces += reversed(own) if newest_first else own
    return pieces


def pack(pieces: Sequence[OffsetRange], max_offsets: int) -> list[tuple[OffsetRange, ...]]:
    """Group consecutive ``pieces`` into tasks of at most ``max_offsets`` offsets in all, in
    order (a piece is never cut, and never moves before another): a read of many small
    partitions then runs as a few Spark tasks, not one task per partition, each of which costs
    the job a Python worker round trip (docs/spark.md, "Reading fast")."""
    tasks: list[tuple[OffsetRange, ...]] = []
    current: list[OffsetRange] = []
    total = 0
    for piece in pieces:
        if current and total + piece.size > max_offsets:
            tasks.append(tuple(current))
            current, total = [], 0
        current.append(piece)
        total += piece.size
    if current:
        tasks.append(tuple(current))
    return tasks


def admit(start: Mapping[int, int], end: Mapping[int, int], max_offsets: int) -> dict[int, int]:
    """Admission control: the end offsets of a micro-batch that reads at most ``max_offsets``
    offsets in all, shared among partitions in proportion to how far each is behind (the
    largest remainders get the leftover offsets). Partitions absent from ``start`` start at 0.
    Always makes progress when there is anything to read."""
    lags = {p: max(0, e - start.get(p, 0)) for p, e in end.items()}
    total = sum(lags.values())
    if total <= max_offsets:
        return dict(end)
    shares = {p: max_offsets * lag // total for p, lag in lags.items()}
    leftover = max_offsets - sum(shares.values())
    by_remainder = sorted(lags, key=lambda p: (-(max_offsets * lags[p] % total), p))
    for p in by_remainder[:leftover]:
        shares[p] += 1
    return {p: start.get(p, 0) + shares[p] for p in end}


def encode_offsets(stream: str, offsets: Mapping[int, int]) -> dict[str, Any]:
    """The checkpoint form: ``{"<stream>": {"<partition>": next offset to read}}`` (string
    keys: Spark stores offsets as JSON)."""
    return {stream: {str(p): int(o) for p, o in sorted(offsets.items())}}


def decode_offsets(stream: str, stored: Mapping[str, Any]) -> dict[int, int]:
    """The per-partition offsets of a checkpoint written by :func:`encode_offsets`."""
    if set(stored) != {stream}:
        raise InvalidOption(
            f"the checkpoint holds offsets of stream(s) {sorted(stored)}, not of {stream!r}: "
            f"use a new checkpointLocation for another stream"
        )
    per_partition = stored[stream]
    if not isinstance(per_partition, Mapping):
        raise InvalidOption(f"malformed offsets in the checkpoint: {dict(stored)!r}")
    return {int(p): int(o) for p, o in per_partition.items()}


def partitions_in(stream: str, available: Iterable[int], wanted: Sequence[int] | None) -> list[int]:
    """The partitions to read: ``wanted`` (all must exist) or every available one."""
    have = sorted(available)
    if wanted is None:
        return have
    missing = sorted(set(wanted) - set(have))
    if missing:
        raise UnknownPartition(
            f"option 'partitions' names partition(s) {missing} but stream {stream!r} has "
            f"partitions {have[0]}..{have[-1]}"
            if have
            else f"stream {stream!r} has no partitions"
        )
    return list(wanted)
