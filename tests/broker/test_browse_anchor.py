"""Browsing from an anchor, a point of the merged order (``broker/browse.py``,
``anchored_offset``): over partitions whose records share timestamps (as a ``publish_batch``
gives them), in both directions, including the anchor or not, with segments small enough that
every start lands in a different segment. The rule: a page from anchor A holds exactly the
records sorting after A (oldest first) or before it (newest first), A itself with ``include``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.broker.test_browse import Key, expected, small_logs, write

from tidelog.broker import BrowseFilter
from tidelog.broker.browse import LAST_TIMESTAMP, BrowseAnchor, BrowseQuery, browse
from tidelog.log import NewRecord, SegmentedLog
from tidelog.wire.browse_token import decode_token

PLANS = {
    # (partition, timestamp, how many): whole batches sharing one timestamp, across partitions
    "one batch per partition, one time": [(0, 100, 7), (1, 100, 5), (2, 100, 6)],
    "interleaved batches": [(1, 100, 4), (0, 100, 3), (2, 101, 5), (0, 101, 2), (1, 102, 6)],
    "lone records between batches": [(2, 50, 1), (0, 60, 9), (1, 60, 1), (2, 60, 8), (0, 70, 1)],
    "an empty partition": [(0, 10, 6), (2, 10, 6), (0, 11, 3)],
}


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[dict[int, SegmentedLog]]:
    opened = small_logs(tmp_path, 3, segment_bytes=120)  # a few records per segment
    try:
        yield opened
    finally:
        for log in opened.values():
            log.close()


def read_all(
    logs: dict[int, SegmentedLog],
    anchor: BrowseAnchor,
    *,
    newest_first: bool,
    page: int,
    keep: BrowseFilter | None = None,
) -> list[Key]:
    """The first page from ``anchor`` and every page its tokens continue to."""
    keys: list[Key] = []
    query = BrowseQuery(
        partitions=tuple(logs),
        newest_first=newest_first,
        limit=page,
        anchor=anchor,
        filter=keep or BrowseFilter(),
    )
    for _ in range(1000):
        result = browse("s", dict(logs), query)  # type: ignore[arg-type]
        keys += [(b.record.timestamp, b.partition, b.record.offset) for b in result.records]
        if result.next_token is None or not result.records:
            return keys
        query = BrowseQuery(
            partitions=tuple(logs),
            newest_first=newest_first,
            limit=page,
            position=decode_token(result.next_token),
            filter=keep or BrowseFilter(),
        )
    raise AssertionError("the pages never ended")


def beyond(order: list[Key], anchor: Key, *, include: bool) -> list[Key]:
    """What follows ``anchor`` in ``order`` (a page order), the anchor too with ``include``."""
    at = order.index(anchor)
    return order[at if include else at + 1 :]


@pytest.mark.parametrize("plan", PLANS.values(), ids=list(PLANS))
@pytest.mark.parametrize("newest_first", [True, False], ids=["newest first", "oldest first"])
@pytest.mark.parametrize("include", [False, True], ids=["exclusive", "inclusive"])
@pytest.mark.parametrize("page", [1, 4, 1000])
def test_a_page_from_every_record_holds_exactly_what_sorts_beyond_it(
    logs: dict[int, SegmentedLog],
    plan: list[tuple[int, int, int]],
    newest_first: bool,
    include: bool,
    page: int,
) -> None:
    rows = write(logs, plan)
    order = expected(rows, BrowseFilter(), newest_first)
    for key in order:
        anchor = BrowseAnchor(*key, include=include)
        got = read_all(logs, anchor, newest_first=newest_first, page=page)
        assert got == beyond(order, key, include=include), (key, include)


@pytest.mark.parametrize("include", [False, True])
def test_filters_hold_from_an_anchor(logs: dict[int, SegmentedLog], include: bool) -> None:
    rows = write(logs, PLANS["interleaved batches"])
    keep = BrowseFilter(key=b"k1", since_ns=101, until_ns=101)
    for newest_first in (True, False):
        order = expected(rows, BrowseFilter(), newest_first)
        wanted = expected(rows, keep, newest_first)
        for key in order:
            rest = set(beyond(order, key, include=include))
            anchor = BrowseAnchor(*key, include)
            got = read_all(logs, anchor, newest_first=newest_first, page=2, keep=keep)
            assert got == [k for k in wanted if k in rest], (key, newest_first)


def test_an_anchor_past_everything_starts_at_the_live_end(
    logs: dict[int, SegmentedLog],
) -> None:
    write(logs, PLANS["one batch per partition, one time"])
    query = BrowseQuery(
        partitions=tuple(logs),
        newest_first=False,
        anchor=BrowseAnchor(LAST_TIMESTAMP, 2**31 - 1, 2**63 - 1),
    )
    result = browse("s", dict(logs), query)  # type: ignore[arg-type]
    assert result.records == []
    assert result.next_token is not None
    logs[1].append([NewRecord(b"later")], timestamp=5)  # an older time than the rest: still new
    later = BrowseQuery(
        partitions=tuple(logs), newest_first=False, position=decode_token(result.next_token)
    )
    got = browse("s", dict(logs), later)  # type: ignore[arg-type]
    assert [(b.partition, b.record.value) for b in got.records] == [(1, b"later")]


def test_newest_first_from_an_anchor_below_the_oldest_is_empty(
    logs: dict[int, SegmentedLog],
) -> None:
    write(logs, PLANS["an empty partition"])
    query = BrowseQuery(partitions=tuple(logs), anchor=BrowseAnchor(0, 0, 0))
    result = browse("s", dict(logs), query)  # type: ignore[arg-type]
    assert result.records == []
    assert result.next_token is None
