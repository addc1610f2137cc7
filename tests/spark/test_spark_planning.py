"""Offset ranges, splits, admission control, checkpoint offsets and pushed filters, no JVM."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from tidelog.errors import InvalidOption, UnknownPartition
from tidelog.spark.options import EARLIEST, LATEST
from tidelog.spark.planning import (
    OffsetRange,
    PartitionBounds,
    admit,
    decode_offsets,
    encode_offsets,
    offset_of,
    pack,
    partitions_in,
    split,
)
from tidelog.spark.pushdown import PushedFilters, push


def test_resolve() -> None:
    bounds = PartitionBounds(0, oldest=5, next=9)
    assert [offset_of(p, bounds) for p in (EARLIEST, LATEST, 7)] == [5, 9, 7]


def test_split_cuts_large_ranges_evenly_and_drops_empty_ones() -> None:
    ranges = [OffsetRange(0, 0, 10), OffsetRange(1, 4, 4), OffsetRange(2, 3, 5)]
    assert split(ranges, 4) == [
        OffsetRange(0, 0, 3),
        OffsetRange(0, 3, 6),
        OffsetRange(0, 6, 10),
        OffsetRange(2, 3, 5),
    ]


def test_split_newest_first_for_reverse_reads() -> None:
    assert split([OffsetRange(0, 0, 4)], 2, newest_first=True) == [
        OffsetRange(0, 2, 4),
        OffsetRange(0, 0, 2),
    ]


def test_min_pieces_splits_in_proportion() -> None:
    pieces = split([OffsetRange(0, 0, 300), OffsetRange(1, 0, 100)], 1000, 4)
    assert [(p.partition, p.size) for p in pieces] == [(0, 100), (0, 100), (0, 100), (1, 100)]


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 500)), max_size=6),
    st.integers(1, 200),
    st.none() | st.integers(1, 20),
)
def test_split_covers_every_offset_once(
    spans: list[tuple[int, int]], most: int, least: int | None
) -> None:
    ranges = [OffsetRange(p, a, a + n) for p, (a, n) in enumerate(spans)]
    pieces = split(ranges, most, least)
    for r in ranges:
        own = [p for p in pieces if p.partition == r.partition]
        assert [o for p in own for o in range(p.start, p.stop)] == list(range(r.start, r.stop))
    assert all(0 < p.size <= most for p in pieces)
    total = sum(r.size for r in ranges)
    if least is not None and total:
        assert len(pieces) >= min(least, total)


def test_pack_groups_small_ranges_in_order() -> None:
    pieces = [OffsetRange(0, 0, 40), OffsetRange(1, 0, 50), OffsetRange(2, 5, 15)]
    assert pack(pieces, 100) == [(pieces[0], pieces[1], pieces[2])]
    assert pack(pieces, 90) == [(pieces[0], pieces[1]), (pieces[2],)]
    assert pack(pieces, 10) == [(p,) for p in pieces]  # a larger piece travels alone
    assert pack([], 10) == []


@given(st.lists(st.integers(1, 300), max_size=12), st.integers(1, 400))
def test_pack_keeps_every_piece_once_in_order_within_the_limit(sizes: list[int], most: int) -> None:
    pieces = [OffsetRange(i % 3, i * 1000, i * 1000 + n) for i, n in enumerate(sizes)]
    tasks = pack(pieces, most)
    assert [p for task in tasks for p in task] == pieces
    assert all(task for task in tasks)
    assert all(len(task) == 1 or sum(p.size for p in task) <= most for task in tasks)
    # Greedy: a task closes only when the next piece would take it over the limit.
    for task, following in itertools.pairwise(tasks):
        assert sum(p.size for p in task) + following[0].size > most


def test_admit_shares_in_proportion_to_lag() -> None:
    assert admit({0: 0, 1: 0}, {0: 300, 1: 100}, 100) == {0: 75, 1: 25}
    assert admit({0: 10, 1: 0}, {0: 20, 1: 5}, 100) == {0: 20, 1: 5}  # all fits


@given(
    st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 100), st.integers(0, 100))),
    st.integers(1, 150),
)
def test_admit_reads_exactly_the_limit_and_never_past_the_end(
    spans: dict[int, tuple[int, int]], limit: int
) -> None:
    start = {p: a for p, (a, _) in spans.items()}
    end = {p: a + n for p, (a, n) in spans.items()}
    admitted = admit(start, end, limit)
    read = sum(admitted[p] - start[p] for p in spans)
    assert read == min(limit, sum(n for _, n in spans.values()))
    assert all(start[p] <= admitted[p] <= end[p] for p in spans)


def test_admit_new_partitions_start_at_zero() -> None:
    assert admit({0: 10}, {0: 10, 1: 8}, 5) == {0: 10, 1: 5}


def test_checkpoint_offsets_round_trip() -> None:
    stored = encode_offsets("s", {1: 5, 0: 3})
    assert stored == {"s": {"0": 3, "1": 5}}
    assert decode_offsets("s", stored) == {0: 3, 1: 5}
    with pytest.raises(InvalidOption, match="use a new checkpointLocation"):
        decode_offsets("other", stored)


def test_partitions_in() -> None:
    assert partitions_in("s", [2, 0, 1], None) == [0, 1, 2]
    assert partitions_in("s", [2, 0, 1], (0, 2)) == [0, 2]
    with pytest.raises(UnknownPartition, match=r"partition\(s\) \[5\]"):
        partitions_in("s", [0, 1], (0, 5))


# -- pushdown ----------------------------------------------------------------------------------


def pushed(*filters: object) -> tuple[PushedFilters, list[object]]:
    bounds = PushedFilters()
    left = list(push("s", filters, bounds))  # type: ignore[arg-type]
    return bounds, left


def test_partition_filters() -> None:
    bounds, left = pushed(In(("partition",), (1, 3, 5)), GreaterThan(("partition",), 1))
    assert left == []
    assert [p for p in range(7) if bounds.allows_partition(p)] == [3, 5]
    bounds, _ = pushed(EqualTo(("partition",), 2), LessThanOrEqual(("partition",), 4))
    assert [p for p in range(7) if bounds.allows_partition(p)] == [2]


def test_offset_filters() -> None:
    bounds, left = pushed(
        GreaterThanOrEqual(("offset",), 10), LessThan(("offset",), 20), LessThan(("offset",), 30)
    )
    assert (bounds.offset_start, bounds.offset_stop, left) == (10, 20, [])
    bounds, left = pushed(EqualTo(("offset",), 7))
    assert (bounds.offset_start, bounds.offset_stop) == (7, 8)
    # IN narrows to its span but is no exact bound: Spark keeps it.
    in_filter = In(("offset",), (4, 9))
    bounds, left = pushed(in_filter)
    assert (bounds.offset_start, bounds.offset_stop, left) == (4, 10, [in_filter])


def test_timestamp_filters_floor_nanoseconds_to_microseconds() -> None:
    moment = datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=UTC)  # 5 µs past
    micros = int(moment.timestamp()) * 1_000_000 + 5
    bounds, left = pushed(GreaterThan(("timestamp",), moment))
    assert bounds.ts_min_ns == (micros + 1) * 1000 and left == []
    bounds, _ = pushed(GreaterThanOrEqual(("timestamp",), moment))
    assert bounds.ts_min_ns == micros * 1000
    bounds, _ = pushed(LessThan(("timestamp",), moment))
    assert bounds.ts_max_ns == micros * 1000 - 1
    bounds, _ = pushed(LessThanOrEqual(("timestamp",), moment))
    assert bounds.ts_max_ns == (micros + 1) * 1000 - 1


def test_naive_timestamps_and_other_filters_stay_with_spark() -> None:
    naive = GreaterThan(("timestamp",), datetime(2024, 1, 1))
    others = [
        naive,
        IsNull(("key",)),
        IsNotNull(("key",)),
        Not(EqualTo(("offset",), 3)),
        EqualTo(("value",), b"x"),
        EqualTo(("headers", "key"), "h"),
    ]
    bounds, left = pushed(*others)
    assert left == others
    assert bounds == PushedFilters()


def test_never_null_columns_and_the_stream() -> None:
    bounds, left = pushed(IsNotNull(("offset",)), EqualTo(("stream",), "s"))
    assert left == [] and not bounds.empty
    bounds, _ = pushed(EqualTo(("stream",), "other"))
    assert bounds.empty and not bounds.allows_partition(0)
