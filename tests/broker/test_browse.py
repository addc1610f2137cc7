"""The merged browse (``broker/browse.py``) over real logs: order across partitions and ties,
tokens both ways (their format: ``tests/wire/test_browse_token.py``), filters, the scan budget,
a property against a brute-force sort, and that a newest-first page reads only the newest
segments."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.broker.brokertools import broker_config, running

from tidelog.broker import BrowseFilter, BrowseResult, StreamConfig
from tidelog.broker.browse import BrowseQuery, browse
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.filecache import FileCache
from tidelog.log.segment import Segment
from tidelog.wire.browse_token import BrowsePosition, decode_token

Key = tuple[int, int, int]
"""(timestamp, partition, offset): the merged order."""

Row = tuple[int, int, int, bytes | None, bytes, dict[str, bytes]]
"""A record as written: (timestamp, partition, offset, key, value, headers)."""


def small_logs(root: Path, count: int, segment_bytes: int = 400) -> dict[int, SegmentedLog]:
    config = LogConfig(
        flush_policy=FlushPolicy.NEVER, retention_age_s=None, segment_max_bytes=segment_bytes
    )
    return {n: SegmentedLog(root / str(n), config, file_cache=FileCache(64)) for n in range(count)}


def write(logs: dict[int, SegmentedLog], plan: list[tuple[int, int, int]]) -> list[Row]:
    """Append ``(partition, timestamp, how many)`` batches in order; the rows written. Keys
    ``k<i % 4>``, a header ``h`` of ``i % 3`` and values ``v<i>`` (i: the running count)."""
    rows: list[Row] = []
    counter = itertools.count()
    for partition, stamp, many in plan:
        log = logs[partition]
        batch = []
        for _ in range(many):
            i = next(counter)
            batch.append(NewRecord(f"v{i}".encode(), f"k{i % 4}".encode(), {"h": b"%d" % (i % 3)}))
        stamp = max(stamp, _newest(log))
        offsets = log.append(batch, timestamp=stamp)
        rows += [
            (stamp, partition, o, r.key, r.value, dict(r.headers))
            for o, r in zip(offsets, batch, strict=True)
        ]
    return rows


def _newest(log: SegmentedLog) -> int:
    if log.high_watermark < 0:
        return 0
    return next(iter(log.reverse_reader())).timestamps[0].item()


def walk(
    logs: dict[int, SegmentedLog],
    *,
    newest_first: bool,
    page: int,
    keep: BrowseFilter | None = None,
    max_scan: int = 10**9,
) -> tuple[list[Key], list[BrowseResult]]:
    """Every page from the start until the token runs out (or stops moving at the live end)."""
    position: BrowsePosition | None = None
    keys: list[Key] = []
    results: list[BrowseResult] = []
    while True:
        query = BrowseQuery(
            partitions=tuple(logs),
            newest_first=newest_first,
            limit=page,
            position=position,
            filter=keep or BrowseFilter(),
            max_scan=max_scan,
        )
        result = browse("s", dict(logs), query)  # type: ignore[arg-type]
        results.append(result)
        keys += [(b.record.timestamp, b.partition, b.record.offset) for b in result.records]
        token = result.next_token
        if token is None or (result.scanned == 0 and not newest_first):
            return keys, results
        position = decode_token(token)
        assert position == result.position


def expected(rows: list[Row], keep: BrowseFilter, newest_first: bool) -> list[Key]:
    def passes(row: Row) -> bool:
        stamp, _, _, key, value, headers = row
        return (
            (keep.key is None or key == keep.key)
            and (keep.key_prefix is None or (key or b"").startswith(keep.key_prefix))
            and all(headers.get(n) == v for n, v in keep.headers)
            and (keep.contains is None or keep.contains in value)
            and (keep.since_ns is None or stamp >= keep.since_ns)
            and (keep.until_ns is None or stamp <= keep.until_ns)
        )

    return sorted((r[:3] for r in rows if passes(r)), reverse=newest_first)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[dict[int, SegmentedLog]]:
    opened = small_logs(tmp_path, 3)
    try:
        yield opened
    finally:
        for log in opened.values():
            log.close()


def test_ties_order_by_partition_then_offset(logs: dict[int, SegmentedLog]) -> None:
    rows = write(logs, [(2, 100, 2), (0, 100, 1), (1, 100, 2), (0, 100, 1), (2, 101, 1)])
    old, _ = walk(logs, newest_first=False, page=50)
    assert old == [
        (100, 0, 0),
        (100, 0, 1),
        (100, 1, 0),
        (100, 1, 1),
        (100, 2, 0),
        (100, 2, 1),
        (101, 2, 2),
    ]
    new, _ = walk(logs, newest_first=True, page=50)
    assert new == old[::-1] == expected(rows, BrowseFilter(), True)


@pytest.mark.parametrize("newest_first", [True, False])
@pytest.mark.parametrize("page", [1, 3, 7, 1000])
def test_pages_of_any_size_concatenate_to_the_merged_order(
    logs: dict[int, SegmentedLog], newest_first: bool, page: int
) -> None:
    plan = [(i % 3, 1000 + (i * 7) % 5 + i // 3, 1 + i % 4) for i in range(40)]
    rows = write(logs, plan)
    got, results = walk(logs, newest_first=newest_first, page=page)
    assert got == expected(rows, BrowseFilter(), newest_first)
    assert all(len(r.records) <= page for r in results)


@pytest.mark.parametrize(
    "keep",
    [
        BrowseFilter(key=b"k1"),
        BrowseFilter(key=b""),
        BrowseFilter(key_prefix=b"k"),
        BrowseFilter(key_prefix=b"x"),
        BrowseFilter(headers=(("h", b"2"),)),
        BrowseFilter(headers=(("h", b"2"), ("missing", b""))),
        BrowseFilter(contains=b"1"),
        BrowseFilter(contains=b"v2"),
        BrowseFilter(contains=b"k1"),  # in keys only: no value holds it
        BrowseFilter(key=b"k2", contains=b"6", headers=(("h", b"0"),)),
        BrowseFilter(since_ns=1010, until_ns=1020),
        BrowseFilter(since_ns=1030),
    ],
    ids=str,
)
def test_filters_match_a_brute_force_search(
    logs: dict[int, SegmentedLog], keep: BrowseFilter
) -> None:
    rows = write(logs, [(i % 3, 1000 + i, 1 + i % 3) for i in range(45)])
    for newest_first in (True, False):
        got, _ = walk(logs, newest_first=newest_first, page=4, keep=keep)
        assert got == expected(rows, keep, newest_first)


def test_a_scan_budget_stops_early_and_the_token_goes_on(logs: dict[int, SegmentedLog]) -> None:
    rows = write(logs, [(i % 3, 1000 + i, 2) for i in range(30)])
    keep = BrowseFilter(key=b"k3")
    got, results = walk(logs, newest_first=True, page=100, keep=keep, max_scan=7)
    assert got == expected(rows, keep, True)
    assert [r.scanned for r in results] == [7] * 8 + [4]
    assert [r.budget_exhausted for r in results] == [True] * 8 + [False]
    reached = [r.reached_timestamp for r in results]
    assert reached == sorted(reached, reverse=True)  # each page got further back
    assert results[-1].next_token is None


def test_a_time_budget_stops_between_rounds(logs: dict[int, SegmentedLog]) -> None:
    write(logs, [(i % 3, 1000 + i, 50) for i in range(60)])
    ticks = itertools.count()
    query = BrowseQuery(
        partitions=(0, 1, 2), filter=BrowseFilter(key=b"none"), max_scan_seconds=2.5
    )
    result = browse("s", dict(logs), query, clock=lambda: float(next(ticks)))  # type: ignore[arg-type]
    assert result.budget_exhausted and result.records == []
    assert 0 < result.scanned < 3000
    assert result.next_token is not None


def test_start_time_and_the_live_end(logs: dict[int, SegmentedLog]) -> None:
    rows = write(logs, [(i % 3, 1000 + i, 1) for i in range(12)])
    at = browse("s", dict(logs), BrowseQuery((0, 1, 2), start_ns=1005, limit=3))  # type: ignore[arg-type]
    assert [b.record.timestamp for b in at.records] == [1005, 1004, 1003]
    up = browse("s", dict(logs), BrowseQuery((0, 1, 2), newest_first=False, start_ns=1009))  # type: ignore[arg-type]
    assert [b.record.timestamp for b in up.records] == [1009, 1010, 1011]
    later = browse("s", dict(logs), BrowseQuery((0, 1, 2), newest_first=False, start_ns=5000))  # type: ignore[arg-type]
    assert later.records == [] and later.next_token is not None
    rows += write(logs, [(1, 6000, 1)])
    after = browse(
        "s",
        dict(logs),  # type: ignore[arg-type]
        BrowseQuery((0, 1, 2), newest_first=False, position=later.position),
    )
    assert [(b.partition, b.record.timestamp) for b in after.records] == [(1, 6000)]
    before = browse("s", dict(logs), BrowseQuery((0, 1, 2), start_ns=10))  # type: ignore[arg-type]
    assert before.records == [] and before.next_token is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(1, 5)), min_size=0, max_size=30
    ),
    page=st.integers(1, 12),
    newest_first=st.booleans(),
    key=st.sampled_from([None, b"k0", b"k3"]),
    max_scan=st.integers(1, 50),
)
def test_property_pages_equal_a_sorted_filtered_brute_force(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int]],
    page: int,
    newest_first: bool,
    key: bytes | None,
    max_scan: int,
) -> None:
    """Timestamps rise by small steps (ties within and across partitions), segments are tiny
    (reads cross them), pages and budgets are any size: the pages concatenated are always the
    brute-force sort of the records that pass."""
    root = tmp_path_factory.mktemp("prop")
    opened = small_logs(root, 4, segment_bytes=150)
    try:
        clock, timed = 1000, []
        for partition, step, many in plan:
            clock += step
            timed.append((partition, clock, many))
        rows = write(opened, timed)
        keep = BrowseFilter(key=key)
        got, results = walk(
            opened, newest_first=newest_first, page=page, keep=keep, max_scan=max_scan
        )
        assert got == expected(rows, keep, newest_first)
        assert all(r.scanned <= max_scan for r in results)
    finally:
        for log in opened.values():
            log.close()


def test_newest_50_reads_only_the_newest_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 partitions of many small segments each, the broker reopened (nothing cached): the
    newest 50 across them reads one or two segments per partition, never the older ones."""
    config = broker_config(tmp_path)

    async def fill() -> dict[int, int]:
        async with running(config) as broker:
            stream = broker.create_stream("s", StreamConfig(partitions=8, segment_max_bytes=2000))
            for _ in range(40):
                for partition in stream.partitions:
                    await partition.publish([b"x" * 60 for _ in range(20)])
            return {p.number: len(list((p.directory).glob("*.log"))) for p in stream.partitions}

    segments = asyncio.run(fill())
    assert min(segments.values()) >= 20

    read: list[str] = []
    original = Segment.read

    def counted(self: Segment, position: int, length: int) -> bytes:
        read.append(str(self.log_path))
        return original(self, position, length)

    async def newest() -> tuple[BrowseResult, int]:
        async with running(config) as broker:
            opened_before = broker.files.opened
            monkeypatch.setattr(Segment, "read", counted)
            result = await broker.browse("s", limit=50)
            return result, broker.files.opened - opened_before

    result, opened = asyncio.run(newest())
    assert len(result.records) == 50
    distinct = set(read)
    assert len(distinct) <= 2 * 8, sorted(distinct)
    assert opened <= 2 * 8
    total = sum(segments.values())
    assert len(distinct) < total / 10


def test_a_page_ends_at_its_byte_budget_and_goes_on(logs: dict[int, SegmentedLog]) -> None:
    rows = write(logs, [(i % 3, 1000 + i, 1) for i in range(20)])
    size = next(iter(logs[0].reverse_reader())).sizes[0].item()
    query = BrowseQuery((0, 1, 2), limit=100, page_bytes=5 * size)
    first = browse("s", dict(logs), query)  # type: ignore[arg-type]
    assert 4 <= len(first.records) <= 5
    rest = browse("s", dict(logs), BrowseQuery((0, 1, 2), limit=100, position=first.position))  # type: ignore[arg-type]
    got = [(b.record.timestamp, b.partition, b.record.offset) for b in first.records + rest.records]
    assert got == expected(rows, BrowseFilter(), True)
    one = browse("s", dict(logs), BrowseQuery((0, 1, 2), limit=100, page_bytes=1))  # type: ignore[arg-type]
    assert len(one.records) == 1  # one record always goes whole


def test_a_paused_partition_is_resumed_by_a_browse(tmp_path: Path) -> None:
    async def scenario() -> list[bytes]:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            await broker.publish("s", 0, [b"a"])
            await broker.publish("s", 1, [b"b"])
            broker.pause("s", None, resume_all=False)
            result = await broker.browse("s", limit=10, newest_first=False)
            return [r.record.value for r in result.records]

    assert asyncio.run(scenario()) == [b"a", b"b"]
