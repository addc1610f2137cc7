"""SegmentedLog itself: the directory lock, segments and rolls, gaps, reopening, input checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from logtools import Expected, read_forward, read_reverse, segment_logs

from tidelog.errors import IncorrectOffset, LogClosed, LogLocked
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog, open_log

NEVER = FlushPolicy.NEVER


def small(**kwargs):
    kwargs.setdefault("flush_policy", NEVER)
    kwargs.setdefault("segment_max_bytes", 4096)
    return LogConfig(**kwargs)


def test_a_directory_opens_in_one_log_at_a_time(make_log):
    first = make_log()
    with pytest.raises(LogLocked):
        SegmentedLog(first.directory, small())
    first.append([b"still usable"])
    first.close()
    again = make_log()
    assert [r.value for r in read_forward(again)] == [b"still usable"]


def test_another_process_cannot_open_a_locked_directory(make_log):
    log = make_log()
    script = textwrap.dedent(
        f"""
        from tidelog.errors import LogLocked
        from tidelog.log import SegmentedLog
        try:
            SegmentedLog({str(log.directory)!r})
        except LogLocked:
            print("locked")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "locked", out.stderr


def test_open_log_creates_the_directory(tmp_path):
    with open_log(tmp_path / "a" / "b", small()) as log:
        assert log.append([b"x"]) == range(0, 1)
    assert (tmp_path / "a" / "b" / "00000000000000000000.log").exists()


def test_data_survives_close_and_reopen(make_log):
    clock_now = [10]
    log = make_log(config=small(), clock=lambda: clock_now[0])
    messages = [
        NewRecord(f"v{i}".encode() * i, key=None if i % 3 else b"k", headers={"i": b"%d" % i})
        for i in range(200)
    ]
    for i in range(0, 200, 7):
        clock_now[0] += 5
        log.append(messages[i : i + 7])
    before = read_forward(log)
    segments = log.segment_count
    assert segments > 3
    log.close()

    log = make_log(config=small())
    assert log.recovery_report.clean and log.recovery_report.scanned_records == 0
    assert read_forward(log) == before
    assert read_reverse(log) == before[::-1]
    assert (log.oldest_offset, log.newest_offset, log.next_offset, log.high_watermark) == (
        0,
        199,
        200,
        199,
    )
    assert log.segment_count == segments
    log.append([b"after"], timestamp=1)  # older than anything stored: raised, never decreases
    assert read_forward(log, 200) == [Expected(200, before[-1].timestamp, b"after")]


def test_segments_roll_before_an_append_would_pass_the_size_limit(make_log):
    log = make_log(config=small())
    for _ in range(30):
        log.append([b"x" * 500])  # 536 bytes a record: 7 fit in 4096
    sizes = [p.stat().st_size for p in segment_logs(log.directory)]
    assert all(size <= 4096 for size in sizes)
    assert sizes[:-1] == [7 * 536] * (len(sizes) - 1)
    assert log.size_bytes == sum(sizes) == 30 * 536
    assert log.message_count == 30


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(make_log):
    log = make_log(config=small(max_message_bytes=10_000))
    log.append([b"a"])
    log.append([b"b" * 3000, b"c" * 3000])
    log.append([b"d"])
    assert [p.name for p in segment_logs(log.directory)] == [
        "00000000000000000000.log",
        "00000000000000000001.log",
        "00000000000000000003.log",
    ]
    assert [r.value[:1] for r in read_forward(log)] == [b"a", b"b", b"c", b"d"]


def test_an_append_rolls_a_segment_whose_first_record_is_too_old(make_log):
    now = [1_000_000_000]
    log = make_log(
        config=small(segment_max_bytes=1 << 20, segment_max_age_s=5), clock=lambda: now[0]
    )
    log.append([b"a"])
    now[0] += 4_000_000_000
    log.append([b"b"])
    assert log.segment_count == 1
    now[0] += 1_000_000_000
    log.append([b"c"])
    assert log.segment_count == 2
    assert [r.value for r in read_forward(log)] == [b"a", b"b", b"c"]


def test_roll_seals_the_active_segment_only_when_it_holds_something(make_log):
    log = make_log(config=small(segment_max_bytes=1 << 20))
    log.roll()
    assert log.segment_count == 1
    log.append([b"a", b"b"])
    log.roll()
    log.roll()
    assert log.segment_count == 2
    assert [p.name for p in segment_logs(log.directory)][-1] == "00000000000000000002.log"
    assert log.append([b"c"]) == range(2, 3)


def test_a_gap_at_a_segment_start_names_the_segment_after_its_first_record(make_log):
    log = make_log(config=small())
    log.append_at([b"fifty"], [50])
    assert log.oldest_offset == 50
    log.roll()
    log.append_at([b"ninety"], [90])
    assert [p.name for p in segment_logs(log.directory)] == [
        "00000000000000000050.log",
        "00000000000000000090.log",
    ]
    log.close()
    log = make_log(config=small())
    assert [r.offset for r in read_forward(log)] == [50, 90]
    assert (log.oldest_offset, log.next_offset) == (50, 91)
    assert [r.offset for r in read_forward(log, 51)] == [90]
    assert [r.offset for r in read_reverse(log, 89)] == [50]
    assert read_reverse(log, 49) == []


def test_gaps_survive_reopen(make_log):
    log = make_log(config=small())
    log.append([b"0", b"1"])
    log.append_at([b"7"], [7])
    log.append_at([b"1000"], [1000])
    log.close()
    log = make_log(config=small())
    assert [r.offset for r in read_forward(log)] == [0, 1, 7, 1000]
    assert log.append([b"next"]) == range(1001, 1002)


@pytest.mark.parametrize(
    "messages",
    [["text"], [b"ok", "text"], [NewRecord(b"ok"), 5], [b"ok", None]],
    ids=["str", "str after bytes", "int after message", "none after bytes"],
)
def test_values_that_are_not_bytes_raise_type_error_and_write_nothing(make_log, messages):
    log = make_log(config=small())
    log.append([b"before"])
    size = log.size_bytes
    with pytest.raises(TypeError):
        log.append(messages)
    assert (log.size_bytes, log.next_offset) == (size, 1)
    assert [p.stat().st_size for p in segment_logs(log.directory)] == [size]


def test_bytes_like_values_are_stored_as_bytes(make_log):
    log = make_log(config=small())
    log.append([bytearray(b"ba"), memoryview(b"mv"), b"b"])
    log.append([NewRecord(b"m"), bytearray(b"after message")])
    assert [r.value for r in read_forward(log)] == [b"ba", b"mv", b"b", b"m", b"after message"]


def test_size_and_count_totals(make_log):
    log = make_log(config=small())
    log.append([b"a" * 10, NewRecord(b"b", key=b"kk", headers={"h": b"v"})])
    assert log.message_count == 2
    assert log.size_bytes == (36 + 10) + (36 + 2 + 1 + (2 + 1 + 4 + 1))


def test_delete_removes_the_directory_and_closes(make_log):
    log = make_log(config=small())
    log.append([b"a"])
    log.delete()
    assert not log.directory.exists()
    with pytest.raises(LogClosed):
        log.append([b"b"])


def test_expected_offset_appends_only_at_that_offset(make_log):
    log = make_log(config=small())
    assert log.append([b"a", b"b"], expected_offset=0) == range(0, 2)
    with pytest.raises(IncorrectOffset) as raised:
        log.append([b"c"], expected_offset=1)
    assert (raised.value.expected, raised.value.actual) == (1, 2)
    assert (log.next_offset, log.size_bytes) == (2, 2 * 37)
    assert log.append([b"c"], expected_offset=2) == range(2, 3)
    log.close()
    with pytest.raises(LogClosed):
        log.append([b"d"], expected_offset=0)
