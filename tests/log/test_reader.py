"""Forward and reverse readers over tiny to large segments, so that every read path crosses
segment boundaries, and over offset gaps, so that every bound lands in one somewhere."""

from __future__ import annotations

import bisect
import itertools
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logtools import (
    HYPOTHESIS_PHASES,
    Expected,
    KiB,
    MiB,
    as_expected,
    base_of,
    payload,
    segment_logs,
)

from tidelog.errors import LogClosed, TidelogWarning
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog

SEGMENT_SIZES = [200, 4 * KiB, 16 * KiB, 1 * MiB]  # 200: about one batch per segment
DIRECTIONS = ["forward", "reverse"]
LARGE = 6000  # bytes of value: larger than the smallest segment


def build(log: SegmentedLog) -> list[Expected]:
    """Fill ``log`` and return what it holds: a gap before the first record, dense runs of
    mixed sizes with repeated timestamps, a gap inside a segment, a gap at a segment start,
    records larger than the smallest segment."""
    expected: list[Expected] = []
    ts = 1_000

    def add(offsets, sizes, *, keyed=False, chosen=False):
        messages = [
            NewRecord(
                payload(o, s),
                key=(b"k%d" % o if o % 3 else b"") if keyed else None,
                headers={"o": b"%d" % o, "a": b""} if keyed and o % 2 else {},
            )
            for o, s in zip(offsets, sizes, strict=True)
        ]
        if chosen:
            log.append_at(messages, offsets, timestamp=ts)
        else:
            assert log.append(messages, timestamp=ts) == range(offsets[0], offsets[-1] + 1)
        expected.extend(
            Expected(o, ts, m.value, m.key, tuple(m.headers.items()))
            for o, m in zip(offsets, messages, strict=True)
        )

    add([3], [10], chosen=True)  # offsets 0-2 never existed: the log starts at 3
    for i in range(90):
        first = log.next_offset
        n = 1 + i % 4
        add(
            list(range(first, first + n)),
            [(o * 37) % 300 for o in range(first, first + n)],
            keyed=i % 2 == 1,
        )
        ts += 10 * (i % 3 == 0)  # runs of equal timestamps across batches
    first = log.next_offset
    add([first + 5, first + 6, first + 9], [40, 50, 60], chosen=True)  # gaps inside a segment
    ts += 10
    log.roll()
    first = log.next_offset
    add([first + 20, first + 21], [70, 80], chosen=True)  # a gap at a segment start
    ts += 10
    first = log.next_offset
    add([first], [LARGE])
    add([first + 1, first + 2], [5, LARGE], keyed=True)
    ts += 10
    for i in range(40):
        first = log.next_offset
        add(list(range(first, first + 2)), [(i * 53) % 400, 0])
        ts += 5 * (i % 2)
    return expected


@pytest.fixture(scope="module", params=SEGMENT_SIZES, ids=lambda s: f"seg{s}")
def filled(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"reader-{request.param}")
    log = SegmentedLog(
        directory,
        LogConfig(
            segment_max_bytes=request.param,
            flush_policy=FlushPolicy.NEVER,
            index_preallocate_bytes=1280,
        ),
    )
    expected = build(log)
    yield log, expected
    log.close()


@pytest.fixture(params=DIRECTIONS)
def direction(request):
    return request.param


def want(expected, direction, start=None, stop_offset=None, stop_timestamp=None):
    """What a reader with these bounds must deliver, from the list of what was appended."""
    if direction == "forward":
        start = 0 if start is None else start
        return [
            r
            for r in expected
            if r.offset >= start
            and (stop_offset is None or r.offset <= stop_offset)
            and (stop_timestamp is None or r.timestamp <= stop_timestamp)
        ]
    return [
        r
        for r in reversed(expected)
        if (start is None or r.offset <= start)
        and (stop_offset is None or r.offset >= stop_offset)
        and (stop_timestamp is None or r.timestamp >= stop_timestamp)
    ]


def open_reader(log, direction, start=None, stop_offset=None, stop_timestamp=None):
    if direction == "forward":
        return log.forward_reader(
            0 if start is None else start, stop_offset=stop_offset, stop_timestamp=stop_timestamp
        )
    return log.reverse_reader(start, stop_offset=stop_offset, stop_timestamp=stop_timestamp)


def drain(reader, max_messages=1000, max_bytes=1 << 20):
    batches = []
    while batch := reader.read(max_messages, max_bytes):
        batches.append(batch)
    return batches


def records(batches):
    return [r for b in batches for r in as_expected(b.records())]


def swapped(direction, start, stop_offset):
    if stop_offset is None:
        return False
    if direction == "forward":
        return (start or 0) > stop_offset
    return start is not None and start < stop_offset


def read(log, direction, start=None, stop_offset=None, stop_timestamp=None, **limits):
    if swapped(direction, start, stop_offset):  # an empty read, and a warning saying why
        with pytest.warns(TidelogWarning, match="swapped bounds"):
            reader = open_reader(log, direction, start, stop_offset, stop_timestamp)
        assert reader.done
    else:
        reader = open_reader(log, direction, start, stop_offset, stop_timestamp)
    return records(drain(reader, **limits)), reader


def interesting_offsets(expected):
    """Every offset next to a record, a gap or the ends."""
    offsets = {r.offset + d for r in expected for d in (-1, 0, 1)}
    return sorted(o for o in offsets | {0, expected[-1].offset + 50} if o >= 0)


def test_the_fixture_exercises_what_it_claims(filled):
    log, expected = filled
    offsets = [r.offset for r in expected]
    assert offsets[0] == 3 and len(set(offsets)) == len(offsets)
    gaps = [b for a, b in itertools.pairwise(offsets) if b - a > 1]
    assert len(gaps) >= 3
    if log.config.segment_max_bytes == 4 * KiB:
        assert log.segment_count > 10
    assert any(r.size > log.config.segment_max_bytes for r in expected) == (
        log.config.segment_max_bytes < LARGE
    )


def test_a_full_read_equals_what_was_appended(filled, direction):
    log, expected = filled
    got, reader = read(log, direction)
    assert got == (expected if direction == "forward" else expected[::-1])
    if direction == "reverse":
        assert reader.done


def test_start_offsets_below_at_inside_gaps_and_beyond_the_newest(filled, direction):
    log, expected = filled
    for start in interesting_offsets(expected):
        got, _ = read(log, direction, start)
        assert got == want(expected, direction, start), start


def test_forward_reader_from_beyond_the_newest_waits_there(filled):
    log, expected = filled
    reader = log.forward_reader(expected[-1].offset + 10)
    assert not reader.read() and not reader.done
    assert reader.next_offset == expected[-1].offset + 10


def test_reverse_reader_starts_at_the_high_watermark_by_default(filled):
    log, expected = filled
    assert read(log, "reverse", None)[0] == read(log, "reverse", 10**12)[0] == expected[::-1]
    assert read(log, "reverse", 2)[0] == []  # below the oldest record: nothing


def test_stop_offsets_anywhere_including_inside_gaps(filled, direction):
    log, expected = filled
    hw = log.high_watermark
    starts = [None, expected[len(expected) // 2].offset]
    for start in starts:
        for stop in interesting_offsets(expected):
            got, reader = read(log, direction, start, stop_offset=stop)
            assert got == want(expected, direction, start, stop_offset=stop), (start, stop)
            if direction == "reverse":
                assert reader.done
            else:
                assert reader.done == (stop <= hw or (start or 0) > stop), (start, stop)


def test_stop_timestamps_anywhere_including_between_records(filled, direction):
    log, expected = filled
    stamps = sorted({r.timestamp + d for r in expected for d in (-1, 0, 1)})
    for stop_ts in stamps:
        got, reader = read(log, direction, stop_timestamp=stop_ts)
        assert got == want(expected, direction, stop_timestamp=stop_ts), stop_ts
        if direction == "reverse":
            assert reader.done
        else:
            assert reader.done == (expected[-1].timestamp > stop_ts), stop_ts


def test_both_stop_bounds_together(filled, direction):
    log, expected = filled
    middle = expected[len(expected) // 2]
    for stop in (middle.offset - 3, middle.offset, middle.offset + 7):
        for stop_ts in (middle.timestamp - 10, middle.timestamp, middle.timestamp + 10):
            got, _ = read(log, direction, stop_offset=stop, stop_timestamp=stop_ts)
            assert got == want(expected, direction, stop_offset=stop, stop_timestamp=stop_ts)


@pytest.mark.parametrize("max_messages", [1, 3, 1000])
@pytest.mark.parametrize("max_bytes", [1, 300, 5000, 1 << 20])
def test_max_messages_and_max_bytes_are_honoured(filled, direction, max_messages, max_bytes):
    log, expected = filled
    batches = drain(open_reader(log, direction), max_messages, max_bytes)
    assert records(batches) == want(expected, direction)
    for batch in batches:
        assert 1 <= len(batch) <= max_messages
        assert batch.byte_size <= max_bytes or len(batch) == 1
        assert batch.byte_size == sum(int(s) for s in batch.sizes)


def test_a_record_larger_than_max_bytes_comes_alone(filled, direction):
    log, expected = filled
    large = [r for r in expected if len(r.value) == LARGE]
    batches = drain(open_reader(log, direction), 1000, LARGE)
    for batch in batches:
        offsets = batch.offsets.tolist()
        if any(r.offset in offsets for r in large):
            assert len(batch) == 1
    assert records(batches) == want(expected, direction)


def test_every_batch_comes_from_one_segment_and_reads_cross_every_boundary(filled, direction):
    log, expected = filled
    bases = [base_of(p) for p in segment_logs(log.directory)]

    def segment_of(offset):
        return bases[bisect.bisect_right(bases, offset) - 1]

    per_segment = {}
    for r in expected:
        per_segment.setdefault(segment_of(r.offset), []).append(r.offset)
    batches = drain(open_reader(log, direction), 10**6, 1 << 30)
    got = [b.offsets.tolist() for b in batches]
    wanted = [offsets for _, offsets in sorted(per_segment.items())]
    if direction == "reverse":
        wanted = [offsets[::-1] for offsets in wanted[::-1]]
    assert got == wanted  # unlimited batches are exactly the segments, in order
    for max_messages in (2, 5):
        for batch in drain(open_reader(log, direction), max_messages, 1 << 20):
            assert len({segment_of(o) for o in batch.offsets.tolist()}) == 1


def test_reverse_scan_equals_reversed_forward_scan_over_a_grid_of_bounds(filled):
    log, expected = filled
    points = interesting_offsets(expected)[::7]
    for low in points:
        for high in points:
            if low > high:
                continue
            forward, _ = read(log, "forward", low, stop_offset=high)
            reverse, _ = read(log, "reverse", high, stop_offset=low)
            assert reverse == forward[::-1], (low, high)


@settings(
    max_examples=40,
    deadline=None,
    phases=HYPOTHESIS_PHASES,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_reverse_scan_equals_reversed_forward_scan_for_any_bounds(filled, data):
    log, expected = filled
    top = expected[-1].offset + 5
    low = data.draw(st.integers(0, top), label="low")
    high = data.draw(st.integers(low, top), label="high")
    ts_low = data.draw(st.none() | st.sampled_from([r.timestamp for r in expected]), label="ts_low")
    ts_high = data.draw(
        st.none() | st.sampled_from([r.timestamp for r in expected]), label="ts_high"
    )
    max_messages = data.draw(st.integers(1, 50), label="max_messages")
    max_bytes = data.draw(st.integers(1, 20_000), label="max_bytes")

    # Forward from ``low`` bounded by (high, ts_high) and reverse from ``high`` bounded by (low,
    # ts_low) cover the same records when the timestamp bounds are applied to both.
    forward, _ = read(
        log,
        "forward",
        low,
        stop_offset=high,
        stop_timestamp=ts_high,
        max_messages=max_messages,
        max_bytes=max_bytes,
    )
    forward = [r for r in forward if ts_low is None or r.timestamp >= ts_low]
    reverse, _ = read(
        log,
        "reverse",
        high,
        stop_offset=low,
        stop_timestamp=ts_low,
        max_messages=max_messages,
        max_bytes=max_bytes,
    )
    reverse = [r for r in reverse if ts_high is None or r.timestamp <= ts_high]
    assert reverse == forward[::-1]
    assert forward == [
        r
        for r in want(expected, "forward", low, high, ts_high)
        if ts_low is None or r.timestamp >= ts_low
    ]


# -- readers on a live log -----------------------------------------------------------------------


@pytest.fixture
def live(make_log):
    return make_log(config=LogConfig(segment_max_bytes=4096, flush_policy=FlushPolicy.NEVER))


def test_a_caught_up_forward_reader_sees_later_appends(live):
    reader = live.forward_reader(0)
    assert not reader.read()
    live.append([b"a", b"b"])
    assert reader.read().values() == [b"a", b"b"]
    assert not reader.read() and reader.next_offset == 2
    live.append([b"c"])
    assert [r.value for r in reader.records()] == [b"c"]


def test_a_forward_reader_with_a_stop_offset_ends_once_the_log_passes_it(live):
    live.append([b"0", b"1"])
    reader = live.forward_reader(0, stop_offset=5)
    assert reader.read().offsets.tolist() == [0, 1]
    assert not reader.read() and not reader.done  # offsets 2..5 may still come
    live.append_at([b"9"], [9])  # ... and now never will
    assert not reader.read() and reader.done


def test_a_reverse_reader_does_not_see_records_appended_after_its_start(live):
    live.append([b"0", b"1", b"2"])
    reader = live.reverse_reader(1)
    live.append([b"3"])
    assert [r.value for r in reader.records()] == [b"1", b"0"]
    assert reader.done and reader.next_offset == -1


def test_reader_wait_is_woken_by_an_append(live):
    reader = live.forward_reader(0)
    done = []
    thread = threading.Thread(target=lambda: done.append(reader.wait(timeout=10)))
    thread.start()
    live.append([b"x"])
    thread.join(10)
    assert done == [True]
    assert reader.read().values() == [b"x"]


def test_a_done_reader_does_not_wait(live):
    live.append([b"a", b"b"])
    reader = live.forward_reader(0, stop_offset=0)
    assert reader.read().values() == [b"a"]
    assert reader.done and not reader.wait(timeout=10)


def test_limits_must_be_positive(live):
    live.append([b"a"])
    for direction in DIRECTIONS:
        with pytest.raises(ValueError):
            open_reader(live, direction).read(max_messages=0)
        with pytest.raises(ValueError):
            open_reader(live, direction).read(max_bytes=0)


def test_reading_a_closed_log_raises_log_closed(live):
    live.append([b"a", b"b"])
    forward, reverse = live.forward_reader(0), live.reverse_reader()
    assert forward.read(max_messages=1) and reverse.read(max_messages=1)
    live.close()
    with pytest.raises(LogClosed):
        forward.read()
    with pytest.raises(LogClosed):
        reverse.read()
