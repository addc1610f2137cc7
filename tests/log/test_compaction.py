"""Compaction keeps the latest record per key; a crash at any step leaves old or new, never
neither; readers and lookups stay correct over the gaps it leaves."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog

CONFIG = LogConfig(segment_max_bytes=4096, flush_policy=FlushPolicy.NEVER)


def fill(log: SegmentedLog, events: list[tuple[bytes | None, bytes]]) -> list[tuple]:
    """Append (key, value) events in small batches; return (offset, key, value) in order."""
    stored = []
    for i in range(0, len(events), 3):
        chunk = events[i : i + 3]
        offsets = log.append([NewRecord(v, key=k) for k, v in chunk])
        stored += [(o, k, v) for o, (k, v) in zip(offsets, chunk, strict=True)]
    return stored


def expected_after(stored: list[tuple], high_watermark: int, active_base: int) -> list[tuple]:
    """What compaction must keep: keyless records, the latest per key, anything >= HW, and
    everything in the active segment (never rewritten)."""
    latest = {k: o for o, k, _ in stored if k is not None}
    return [
        (o, k, v)
        for o, k, v in stored
        if k is None or o >= high_watermark or o >= active_base or latest[k] == o
    ]


def contents(log: SegmentedLog) -> list[tuple]:
    return [(r.offset, r.key, r.value) for r in log.forward_reader(0).records()]


def active_base(log: SegmentedLog) -> int:
    return log._local.segments[-1].base_offset  # the one segment compaction never touches


events_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])), st.binary(max_size=300)
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(events=events_strategy)
def test_compaction_keeps_exactly_the_live_records(tmp_path_factory, events) -> None:
    directory = tmp_path_factory.mktemp("log")
    log = SegmentedLog(directory, CONFIG)
    try:
        stored = fill(log, events)
        want = expected_after(stored, log.high_watermark, active_base(log))
        log.compact()
        assert contents(log) == want
        reverse = [(r.offset, r.key, r.value) for r in log.reverse_reader().records()]
        assert reverse == want[::-1]
        assert log.next_offset == stored[-1][0] + 1
        log.close()
        log = SegmentedLog(directory, CONFIG)
        assert log.recovery_report.clean
        assert contents(log) == want
        assert log.verify() == len(want)
    finally:
        log.close()


def test_stop_bounds_and_lookups_inside_compaction_gaps(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path / "log", CONFIG)
    try:
        events = [(b"k", bytes([i]) * 200) for i in range(60)] + [(None, b"tail")] * 3
        stored = fill(log, events)
        log.compact()
        offsets = [o for o, _, _ in contents(log)]
        assert offsets[0] > 0  # the early versions of k are gone
        gap = offsets[0] - 1
        assert [b.offsets.tolist() for b in log.forward_reader(0, stop_offset=gap)] == []
        got = [r.offset for r in log.forward_reader(gap).records()]
        assert got == offsets
        back = [r.offset for r in log.reverse_reader(stop_offset=gap).records()]
        assert back == offsets[::-1]
        assert log.offset_at_or_after_timestamp(0) == offsets[0]
        assert stored[-1][0] == offsets[-1]
    finally:
        log.close()


def test_appends_after_compaction_continue_densely(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path / "log", CONFIG)
    try:
        stored = fill(log, [(b"k", b"x" * 300)] * 40)
        log.compact()
        more = fill(log, [(b"k", b"new"), (None, b"free")])
        assert [o for o, _, _ in more] == [stored[-1][0] + 1, stored[-1][0] + 2]
        assert contents(log)[-2:] == more
    finally:
        log.close()


@pytest.mark.parametrize("crash_at", ["log renamed to .swap", "committed", "log swapped"])
def test_a_crash_mid_swap_leaves_the_old_or_the_new_segment(tmp_path: Path, crash_at: str) -> None:
    rng = random.Random(7)
    log = SegmentedLog(tmp_path / "log", CONFIG)
    stored = fill(log, [(rng.choice([b"a", b"b"]), rng.randbytes(200)) for _ in range(80)])
    before = contents(log)
    want = expected_after(stored, log.high_watermark, active_base(log))

    class Crash(Exception):
        pass

    def step(name: str) -> None:
        if name == crash_at:
            shutil.copytree(tmp_path / "log", tmp_path / "crashed")  # the disk at the crash
            raise Crash(name)

    with pytest.raises(Crash):
        log.compact(step=step)
    log.delete()
    reopened = SegmentedLog(tmp_path / "crashed", CONFIG)
    try:
        after = contents(reopened)
        live = set(want)
        # Every live record survives; what else survives is a subset of what was there.
        assert live <= set(after) <= set(before)
        assert after == sorted(after)
        if crash_at == "log renamed to .swap":
            assert after == before  # not committed: the first segment is the old one
        assert reopened.verify() == len(after)
        assert not list((tmp_path / "crashed").glob("*.swap"))
        assert not list((tmp_path / "crashed").glob("*.cleaned"))
    finally:
        reopened.close()
