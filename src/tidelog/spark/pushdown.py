"""Filter pushdown for batch reads: Spark's filters on ``partition``, ``offset``, ``timestamp``
(and ``stream``) become bounds the planner applies before any record is read.

Spark (4.1+) offers filters to ``DataSourceReader.pushFilters`` only with
``spark.sql.python.filterPushdown.enabled=true``; the filters a reader returns are the ones it
did not handle, and Spark applies those itself after the read. So a bound may be wider than its
filter (returned: Spark still filters) but never narrower. Filters handled exactly:
comparisons and ``IN`` on ``partition``, comparisons on ``offset``, comparisons on ``timestamp``
with a time-zone-aware value (offsets are found by timestamp on the broker, exactly, since a
partition's timestamps never decrease), ``stream = s``, and ``IS NOT NULL`` on columns that are
never null. ``OR`` is never offered by Spark; ``NOT`` and the rest are left to Spark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NEVER_NULL = frozenset({"value", "stream", "partition", "offset", "timestamp", "headers"})


@dataclass(slots=True)
class PushedFilters:
    """What the pushed filters allow: partitions (a set, ``None`` for any, and a half-open
    range), a half-open offset range ``[offset_start, offset_stop)`` and an inclusive ns
    timestamp range; ``None`` leaves that end open."""

    partitions: set[int] | None = None
    partition_low: int = 0
    partition_stop: int | None = None
    offset_start: int | None = None
    offset_stop: int | None = None
    ts_min_ns: int | None = None
    ts_max_ns: int | None = None
    empty: bool = False
    """A filter no record can pass (another stream, an empty IN)."""
    handled: list[Filter] = field(default_factory=list)

    def allows_partition(self, partition: int) -> bool:
        return (
            not self.empty
            and (self.partitions is None or partition in self.partitions)
            and partition >= self.partition_low
            and (self.partition_stop is None or partition < self.partition_stop)
        )

    def restrict_partitions(self, allowed: set[int]) -> None:
        self.partitions = allowed if self.partitions is None else self.partitions & allowed

    def _raise_start(self, offset: int) -> None:
        self.offset_start = offset if self.offset_start is None else max(self.offset_start, offset)

    def _lower_stop(self, offset: int) -> None:
        self.offset_stop = offset if self.offset_stop is None else min(self.offset_stop, offset)


def push(stream: str, filters: Iterable[Filter], bounds: PushedFilters) -> Iterable[Filter]:
    """Narrow ``bounds`` by ``filters``; yields the filters Spark must still apply."""
    for candidate in filters:
        if _apply(stream, candidate, bounds):
            bounds.handled.append(candidate)
        else:
            yield candidate


def _apply(stream: str, f: Filter, bounds: PushedFilters) -> bool:
    """Narrow ``bounds`` by one filter; True if the bound is exactly the filter."""
    path: tuple[str, ...] = getattr(f, "attribute", ())  # every concrete Filter has one
    column = path[0] if len(path) == 1 else None
    if isinstance(f, IsNotNull):
        return column in _NEVER_NULL
    if column == "stream" and isinstance(f, EqualTo):
        bounds.empty |= f.value != stream
        return True
    if column == "partition":
        return _partition(f, bounds)
    if column == "offset":
        return _offset(f, bounds)
    if column == "timestamp":
        return _timestamp(f, bounds)
    return False


def _partition(f: Filter, bounds: PushedFilters) -> bool:
    if isinstance(f, In):
        numbers = [v for v in f.value if isinstance(v, int) and not isinstance(v, bool)]
        if len(numbers) != len(f.value):
            return False
        bounds.restrict_partitions(set(numbers))
        return True
    found = _int_range(f)
    if found is None:
        return False
    low, high = found
    if low is not None:
        bounds.partition_low = max(bounds.partition_low, low)
    if high is not None:
        bounds.partition_stop = (
            high if bounds.partition_stop is None else min(bounds.partition_stop, high)
        )
    return True


def _int_range(f: Filter) -> tuple[int | None, int | None] | None:
    """``[low, high)`` for a comparison with an integer, else None."""
    value = getattr(f, "value", None)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if isinstance(f, GreaterThan):
        return value + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return value, None
    if isinstance(f, LessThan):
        return None, value
    if isinstance(f, LessThanOrEqual):
        return None, value + 1
    if isinstance(f, EqualTo):
        return value, value + 1
    return None


def _offset(f: Filter, bounds: PushedFilters) -> bool:
    if isinstance(f, In):
        numbers = [v for v in f.value if isinstance(v, int) and not isinstance(v, bool)]
        if len(numbers) != len(f.value):
            return False
        if not numbers:
            bounds.empty = True
            return True
        bounds._raise_start(min(numbers))
        bounds._lower_stop(max(numbers) + 1)
        return False  # the range is wider than the set: Spark keeps the filter
    found = _int_range(f)
    if found is None:
        return False
    low, high = found
    if low is not None:
        bounds._raise_start(low)
    if high is not None:
        bounds._lower_stop(high)
    return True


def _timestamp(f: Filter, bounds: PushedFilters) -> bool:
    value = getattr(f, "value", None)
    if not isinstance(value, datetime) or value.tzinfo is None:
        return False  # a zone-less value: leave it to Spark
    micros = (value - _EPOCH) // timedelta(microseconds=1)
    # A record's Spark timestamp is its ns timestamp floored to the µs.
    if isinstance(f, GreaterThan):
        low, high = (micros + 1) * 1000, None
    elif isinstance(f, GreaterThanOrEqual):
        low, high = micros * 1000, None
    elif isinstance(f, LessThan):
        low, high = None, micros * 1000 - 1
    elif isinstance(f, LessThanOrEqual):
        low, high = None, (micros + 1) * 1000 - 1
    elif isinstance(f, EqualTo):
        low, high = micros * 1000, (micros + 1) * 1000 - 1
    else:
        return False
    if low is not None:
        bounds.ts_min_ns = low if bounds.ts_min_ns is None else max(bounds.ts_min_ns, low)
    if high is not None:
        bounds.ts_max_ns = high if bounds.ts_max_ns is None else min(bounds.ts_max_ns, high)
    return True
