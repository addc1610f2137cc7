"""Recovery on open after crashes (simulated by copying an open log's directory) and tears.

A crash is simulated without any special API: while a log is open its directory is copied (the
page cache, including the memory-mapped active index, is what the copy sees), and the copy is
opened as a log. Files of the copy are then cut to simulate torn writes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from logtools import (
    Expected,
    KiB,
    MiB,
    base_of,
    bases,
    check_continues_densely,
    crash_copy,
    file_sizes,
    fill,
    layout,
    open_damaged,
    payload,
    read_forward,
    read_reverse,
    segment_indexes,
    segment_logs,
    survivors_of_cut,
)

from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.index import ENTRY_SIZE
from tidelog.log.recovery import (
    RECOVERY_POINT_FILE,
    RecoveryReport,
    read_recovery_point,
    segment_bases,
    valid_prefix,
    write_recovery_point,
)

CONFIG = LogConfig(
    segment_max_bytes=4 * KiB, flush_policy=FlushPolicy.NEVER, index_preallocate_bytes=1280
)


# -- clean shutdown --------------------------------------------------------------------------------


def test_a_clean_close_reopens_with_a_clean_report_and_no_scan(make_log):
    log = make_log(config=CONFIG)
    expected = fill(log, 300)
    log.close()
    assert read_recovery_point(log.directory) == 299
    assert all(p.stat().st_size % ENTRY_SIZE == 0 for p in segment_indexes(log.directory))
    reopened = make_log(config=CONFIG)
    report = reopened.recovery_report
    assert report.clean and report == RecoveryReport()
    assert read_forward(reopened) == expected


# -- crashes without damage ------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 40, 400])
def test_a_crash_loses_nothing_that_was_written(make_log, tmp_path, count):
    log = make_log(config=CONFIG)
    expected = fill(log, count)
    copy = crash_copy(log, tmp_path / "crashed")
    recovered = make_log(copy, CONFIG)
    assert read_forward(recovered) == expected
    assert read_reverse(recovered) == expected[::-1]
    assert recovered.recovery_report.truncated == []
    assert recovered.recovery_report.dropped_segments == []
    check_continues_densely(recovered, expected)


def test_a_crash_after_a_reopen_keeps_old_and_new_records(make_log, tmp_path):
    log = make_log(config=CONFIG)
    expected = fill(log, 150)
    log.close()
    log = make_log(config=CONFIG)
    expected += fill(log, 150, first_ts=expected[-1].timestamp + 1)
    recovered = make_log(crash_copy(log, tmp_path / "crashed"), CONFIG)
    assert read_forward(recovered) == expected
    check_continues_densely(recovered, expected)


def test_a_crash_right_after_a_roll_keeps_the_empty_active_segment_usable(make_log, tmp_path):
    log = make_log(config=CONFIG)
    expected = fill(log, 50)
    log.roll()
    recovered = make_log(crash_copy(log, tmp_path / "crashed"), CONFIG)
    assert read_forward(recovered) == expected
    check_continues_densely(recovered, expected)


def test_a_crash_with_gaps_keeps_them(make_log, tmp_path):
    log = make_log(config=CONFIG)
    log.append_at([b"a"], [10], timestamp=5)
    log.append([b"b"], timestamp=6)
    log.roll()
    log.append_at([b"c", b"d"], [40, 45], timestamp=7)
    recovered = make_log(crash_copy(log, tmp_path / "crashed"), CONFIG)
    assert [(r.offset, r.value) for r in read_forward(recovered)] == [
        (10, b"a"),
        (11, b"b"),
        (40, b"c"),
        (45, b"d"),
    ]
    assert recovered.next_offset == 46


# -- torn writes -----------------------------------------------------------------------------------


def test_a_torn_tail_is_cut_at_every_possible_byte(make_log, tmp_path):
    log = make_log(config=CONFIG)
    expected = fill(log, 60)
    original = crash_copy(log, tmp_path / "original")
    newest = segment_logs(original)[-1]
    size = newest.stat().st_size
    placed = layout(expected, bases(original))[base_of(newest)]
    last_two_start = placed[-2][1]
    for cut in range(last_two_start, size + 1):
        copy = tmp_path / f"cut{cut}"
        copy.mkdir()
        for path in original.iterdir():
            (copy / path.name).write_bytes(path.read_bytes())
        os.truncate(copy / newest.name, cut)
        survivors = survivors_of_cut(expected, bases(original), base_of(newest), cut)
        recovered = open_damaged(copy, CONFIG)
        try:
            assert read_forward(recovered) == survivors, cut
            assert recovered.next_offset == survivors[-1].offset + 1
            cut_bytes = cut - sum(r.size for r, _ in placed if r in survivors)
            assert recovered.recovery_report.truncated == (
                [(base_of(newest), cut_bytes)] if cut_bytes else []
            )
        finally:
            recovered.close()


def test_a_sealed_segment_cut_inside_a_record_drops_everything_after_it(make_log, tmp_path):
    log = make_log(config=CONFIG)
    expected = fill(log, 300)
    copy = crash_copy(log, tmp_path / "crashed")
    segments = bases(copy)
    assert len(segments) >= 4
    victim = segments[1]
    placed = layout(expected, segments)[victim]
    cut = placed[3][1] + 10  # inside the fourth record
    os.truncate(copy / segment_logs(copy)[1].name, cut)

    recovered = open_damaged(copy, CONFIG)
    survivors = survivors_of_cut(expected, segments, victim, cut)
    assert read_forward(recovered) == survivors
    assert recovered.recovery_report.dropped_segments == segments[2:]
    assert bases(copy) == segments[:2]
    check_continues_densely(recovered, survivors)


@pytest.mark.parametrize("record", [0, 3], ids=["at the segment start", "after three records"])
def test_a_sealed_segment_cut_at_a_record_boundary_drops_everything_after_it(
    make_log, tmp_path, record
):
    """docs/operations.md: "Every record before the cut is intact; nothing after it reappears."
    A sealed segment that lost whole records (its index lists more than its file holds) is
    damaged exactly like one cut inside a record: the segments after it must go too."""
    log = make_log(config=CONFIG)
    expected = fill(log, 300)
    copy = crash_copy(log, tmp_path / "crashed")
    segments = bases(copy)
    victim = segments[1]
    cut = layout(expected, segments)[victim][record][1]
    os.truncate(copy / segment_logs(copy)[1].name, cut)

    recovered = open_damaged(copy, CONFIG)
    survivors = survivors_of_cut(expected, segments, victim, cut)
    assert read_forward(recovered) == survivors
    check_continues_densely(recovered, survivors)


@pytest.mark.parametrize("which", ["sealed", "active"])
@pytest.mark.parametrize("keep_bytes", [0, 7, ENTRY_SIZE * 3, ENTRY_SIZE * 3 + 11])
def test_a_cut_index_is_rebuilt_from_the_log(make_log, tmp_path, which, keep_bytes):
    log = make_log(config=CONFIG)
    expected = fill(log, 300)
    copy = crash_copy(log, tmp_path / "crashed")
    index = segment_indexes(copy)[0 if which == "sealed" else -1]
    os.truncate(index, keep_bytes)
    recovered = open_damaged(copy, CONFIG)
    assert read_forward(recovered) == expected
    assert base_of(index) in recovered.recovery_report.rebuilt_indexes
    check_continues_densely(recovered, expected)


@pytest.mark.parametrize("which", [0, -1], ids=["sealed", "active"])
def test_a_missing_index_is_rebuilt_from_the_log(make_log, tmp_path, which):
    log = make_log(config=CONFIG)
    expected = fill(log, 200)
    copy = crash_copy(log, tmp_path / "crashed")
    segment_indexes(copy)[which].unlink()
    recovered = open_damaged(copy, CONFIG)
    assert read_forward(recovered) == expected


def test_leftover_temp_files_and_orphan_indexes_are_removed(make_log, tmp_path):
    log = make_log(config=CONFIG)
    expected = fill(log, 100)
    copy = crash_copy(log, tmp_path / "crashed")
    (copy / "recovery-point.tmp").write_text("12\n")
    (copy / "00000000000000000000.index.tmp").write_bytes(b"\0" * 40)
    (copy / "00000000000000099999.index").write_bytes(b"\1" * 40)
    (copy / "notes.txt").write_text("left alone")
    assert segment_bases(copy) == bases(copy)
    names = {p.name for p in copy.iterdir()}
    assert not any(n.endswith(".tmp") for n in names)
    assert "00000000000000099999.index" not in names and "notes.txt" in names
    recovered = make_log(copy, CONFIG)
    assert read_forward(recovered) == expected


# -- the recovery point ----------------------------------------------------------------------------


def test_recovery_point_round_trip_and_unreadable_values(tmp_path):
    assert read_recovery_point(tmp_path) == -1
    write_recovery_point(tmp_path, 1234)
    assert read_recovery_point(tmp_path) == 1234
    assert (tmp_path / RECOVERY_POINT_FILE).read_text() == "1234\n"
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / RECOVERY_POINT_FILE).write_text("garbage")
    assert read_recovery_point(tmp_path) == -1


def test_without_a_recovery_point_every_record_is_verified_on_open(make_log):
    log = make_log(config=CONFIG)
    expected = fill(log, 300)
    log.close()
    (log.directory / RECOVERY_POINT_FILE).unlink()
    reopened = make_log(config=CONFIG)
    assert reopened.recovery_report.scanned_records == len(expected)
    assert (
        reopened.recovery_report.truncated == [] and reopened.recovery_report.dropped_segments == []
    )
    assert read_forward(reopened) == expected


def test_a_roll_records_the_sealed_segments_in_the_recovery_point(make_log):
    log = make_log(config=CONFIG)
    fill(log, 20)
    log.roll()
    assert read_recovery_point(log.directory) == 19


def test_valid_prefix_stops_at_the_first_inconsistent_entry():
    entries = np.zeros(
        5, dtype=[("rel", "<u4"), ("timestamp", "<i8"), ("position", "<u4"), ("size", "<u4")]
    )
    entries["rel"] = [0, 1, 2, 3, 4]
    entries["timestamp"] = [5, 5, 6, 7, 8]
    entries["size"] = 40
    entries["position"] = [0, 40, 80, 120, 160]
    assert valid_prefix(entries, 200, 10, 9, 0) == 5
    assert valid_prefix(entries, 199, 10, 9, 0) == 4  # the last entry ends past the file
    assert valid_prefix(entries, 200, 10, 10, 0) == 0  # the first offset does not increase
    assert valid_prefix(entries, 200, 10, 9, 6) == 0  # the first timestamp decreases
    broken = entries.copy()
    broken["position"][2] = 81
    assert valid_prefix(broken, 200, 10, 9, 0) == 2
    broken = entries.copy()
    broken["timestamp"][3] = 4
    assert valid_prefix(broken, 200, 10, 9, 0) == 3
    assert valid_prefix(entries[:0], 0, 10, 9, 0) == 0


# -- large records: the scan reads the file in chunks ----------------------------------------------


def test_a_scan_across_chunk_edges_and_of_records_longer_than_a_chunk(make_log, tmp_path):
    config = LogConfig(
        segment_max_bytes=64 * MiB, max_message_bytes=12 * MiB, flush_policy=FlushPolicy.NEVER
    )
    log = make_log(config=config)
    sizes = [3 * MiB + 17, 5, 3 * MiB + 1001, 10 * MiB + 3, 77, 2 * MiB, 1]
    expected = []
    for size in sizes:
        (offset,) = log.append([payload(log.next_offset, size)], timestamp=1)
        expected.append(Expected(offset, 1, payload(offset, size)))
    copy = crash_copy(log, tmp_path / "crashed")  # the active segment gets scanned in full
    recovered = make_log(copy, config)
    assert recovered.recovery_report.scanned_records == len(sizes)
    assert read_forward(recovered) == expected
    recovered.close()

    # The same file with a torn last big record: everything before it survives.
    damaged = crash_copy(log, tmp_path / "torn")
    newest = segment_logs(damaged)[-1]
    placed = layout(expected, [0])[0]
    os.truncate(newest, placed[5][1] + 1 * MiB)
    recovered = open_damaged(damaged, config)
    assert read_forward(recovered) == expected[:5]
    assert file_sizes(damaged)[newest.name] == placed[5][1]
