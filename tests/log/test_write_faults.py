"""Writes that fail (injected through ``tidelog.durable.faults``): an append is acknowledged and
readable in full, or it raises and the log is exactly as before, in memory, on disk and after a
reopen or a crash.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Iterator

import pytest
from logtools import crash_copy, read_forward, read_reverse

from tidelog.durable import OPEN, RESERVE, SYNC, TRUNCATE, WRITE, faults
from tidelog.errors import DiskFull, OutOfDescriptors, ResourceExhausted, SyncFailed
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.filecache import FileCache


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    faults.clear()
    yield
    faults.clear()


def small(**kwargs: object) -> LogConfig:
    kwargs.setdefault("flush_policy", FlushPolicy.NEVER)
    kwargs.setdefault("segment_max_bytes", 4096)
    kwargs.setdefault("index_preallocate_bytes", 1280)
    return LogConfig(**kwargs)  # type: ignore[arg-type]


def state(log: SegmentedLog) -> tuple[object, ...]:
    return (
        log.next_offset,
        log.high_watermark,
        log.segment_count,
        log.size_bytes,
        log.message_count,
        log._local.last_timestamp,
        log._local.active.base_offset,
        log._local.active.size,
        log._local.active.count,
    )


def values(log: SegmentedLog) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in read_forward(log)]


@pytest.mark.parametrize(
    ("where", "op", "keep"),
    [
        (".log", WRITE, None),
        (".log", WRITE, 10),
        (".index", WRITE, None),
        (".index", WRITE, 0),
        (".index", WRITE, 13),
        (".index", RESERVE, None),
    ],
)
def test_a_failed_append_changes_nothing_and_the_next_one_takes_its_offset(
    make_log, where, op, keep
):
    log = make_log(config=small())
    log.append([b"a"] * 63)  # the next two entries outgrow the index's first 64 slots
    before, contents = state(log), values(log)
    faults.fail(where, op=op, keep=keep)
    with pytest.raises(DiskFull) as raised:
        log.append([b"c" * 50, b"d" * 50])
    assert where in raised.value.path
    assert faults.hits and state(log) == before and values(log) == contents
    assert log.append([b"e"]) == range(63, 64)
    assert values(log) == [*contents, (63, b"e")]
    assert log.verify() == 64


def test_a_short_write_is_finished_not_accepted(make_log):
    log = make_log(config=small())
    faults.fail(".index", keep=7, error=0)
    faults.fail(".log", keep=3, error=0)
    assert log.append([b"x" * 40, b"y" * 40]) == range(0, 2)
    assert len(faults.hits) == 2
    assert values(log) == [(0, b"x" * 40), (1, b"y" * 40)]


def test_descriptors_running_out_is_its_own_error(make_log):
    log = make_log(config=small(segment_max_bytes=4096))
    log.append([b"a" * 3000])
    faults.fail(".log", op=OPEN, error=errno.EMFILE)  # the file cache closes files, retries
    assert log.append([b"b" * 3000]) == range(1, 2)
    faults.fail(".log", op=OPEN, error=errno.EMFILE, times=2)  # and then gives up
    with pytest.raises(OutOfDescriptors):
        log.append([b"c" * 3000])  # needs a roll: the new segment's file cannot be opened
    assert log.segment_count == 2 and values(log) == [(0, b"a" * 3000), (1, b"b" * 3000)]


@pytest.mark.parametrize(("where", "op"), [(".log", OPEN), (".index", OPEN), (".index", TRUNCATE)])
def test_a_roll_that_cannot_create_the_new_segment_leaves_the_old_one_active(make_log, where, op):
    log = make_log(config=small())
    log.append([b"a" * 3000])
    files_before = sorted(p.name for p in log.directory.iterdir())
    before = state(log)
    faults.fail(where, op=op)
    with pytest.raises(DiskFull):
        log.append([b"b" * 3000])  # over the size limit: rolls first
    assert state(log) == before
    assert sorted(p.name for p in log.directory.iterdir()) == files_before
    faults.fail(where, op=op)
    with pytest.raises(DiskFull):
        log.roll()
    assert state(log) == before
    assert log.append([b"c" * 10]) == range(1, 2)  # fits: still the first segment
    assert log.segment_count == 1
    assert log.append([b"d" * 3000]) == range(2, 3)
    assert log.segment_count == 2
    assert values(log) == [(0, b"a" * 3000), (1, b"c" * 10), (2, b"d" * 3000)]


def test_a_failed_append_into_a_new_segment_undoes_the_roll(make_log):
    log = make_log(config=small())
    log.append([b"a" * 3000])
    before = state(log)
    faults.fail(".log", skip=0)  # the first write after the roll created the new segment
    with pytest.raises(DiskFull):
        log.append([b"b" * 3000])
    assert state(log) == before
    assert [p.name for p in sorted(log.directory.glob("*.log"))] == ["00000000000000000000.log"]
    assert log.append([b"c" * 3000]) == range(1, 2)


def test_a_tail_that_cannot_be_cut_back_is_never_recovered(make_log, tmp_path):
    log = make_log(config=small())
    log.append([b"a" * 100])
    faults.fail(".index", op=WRITE)
    faults.fail(".log", op=TRUNCATE)
    with pytest.raises(DiskFull):
        log.append([b"b" * 100])
    assert values(log) == [(0, b"a" * 100)]
    crashed = SegmentedLog(crash_copy(log, tmp_path / "crashed"), small())
    try:
        assert values(crashed) == [(0, b"a" * 100)]
    finally:
        crashed.close()
    assert log.append([b"c" * 100]) == range(1, 2)  # cuts the stray tail first
    assert values(log) == [(0, b"a" * 100), (1, b"c" * 100)]
    assert log.directory.joinpath("00000000000000000000.log").stat().st_size == log.size_bytes


def segment_files(log: SegmentedLog) -> list[str]:
    return sorted(p.name for p in log.directory.iterdir() if p.suffix in (".log", ".index"))


def reopened_values(log: SegmentedLog, config: LogConfig) -> list[tuple[int, bytes]]:
    """What the log holds after a clean close and reopen (recovery must have nothing to do)."""
    log.close()
    with SegmentedLog(log.directory, config, file_cache=log._local.file_cache) as again:
        assert again.recovery_report.clean, again.recovery_report
        return values(again)


SEGMENT_0 = "00000000000000000000"


@pytest.mark.parametrize("where", [f"{SEGMENT_0}.log", f"{SEGMENT_0}.index"])
def test_a_roll_that_cannot_reopen_the_old_segment_changes_nothing(make_log, where):
    """The old segment was evicted by the new one's files; sealing it needs its files again.
    That must fail before the batch goes anywhere, not after the new segment replaced it."""
    config = small()
    log = make_log(config=config, file_cache=FileCache(3))  # one active segment open at a time
    while log._local.active.size + 200 <= 4096:
        log.append([b"x" * 150])
    before, contents, names = state(log), values(log), segment_files(log)
    faults.fail(where, op=OPEN, error=errno.EMFILE, times=2)  # the cache's retry fails too
    with pytest.raises(OutOfDescriptors):
        log.append([b"y" * 1000])  # rolls
    assert faults.hits and state(log) == before and values(log) == contents
    assert segment_files(log) == names
    faults.fail(where, op=OPEN, error=errno.EMFILE, times=2)
    with pytest.raises(OutOfDescriptors):
        log.roll()
    assert state(log) == before and segment_files(log) == names
    faults.clear()
    n = log.next_offset
    assert log.append([b"z" * 1000]) == range(n, n + 1)
    assert log.segment_count == 2 and log._local.active.base_offset == n
    assert reopened_values(log, config) == [*contents, (n, b"z" * 1000)]


def log_with_a_tail_left(make_log, config: LogConfig, **kwargs) -> SegmentedLog:
    """A log of ten records, then an append that fails on a full disk and whose bytes cannot be
    cut back (EIO); no fault stays armed."""
    log = make_log(config=config, **kwargs)
    for _ in range(10):
        log.append([b"a" * 150])
    faults.fail(".log", op=WRITE)
    faults.fail(".log", op=TRUNCATE, error=errno.EIO)
    with pytest.raises(DiskFull):
        log.append([b"b" * 150])
    assert log._local.active._cut_pending
    faults.clear()
    return log


@pytest.mark.parametrize("how", ["append", "roll", "maintain", "close"])
def test_a_tail_not_yet_cut_back_is_cut_before_the_segment_is_sealed(make_log, how):
    """A sealed segment with stray bytes past its end looks damaged to recovery, which would
    then remove every later segment."""
    config = small(segment_max_age_s=60)
    log = log_with_a_tail_left(make_log, config, clock=lambda: 10**9)
    contents = values(log)
    if how == "append":
        contents += [(10, b"c" * 3000)]
        assert log.append([b"c" * 3000]) == range(10, 11)  # rolls
    elif how == "roll":
        log.roll()
    elif how == "maintain":
        log.maintain(now_ns=10**9 + 61 * 10**9)  # over age: rolls
    if how == "close":
        log.close()
    else:
        assert log.segment_count == 2
        assert not log._local.segments[0]._cut_pending
        n = log.next_offset
        assert log.append([b"d" * 150]) == range(n, n + 1)
        contents += [(n, b"d" * 150)]
    first = log.directory / f"{SEGMENT_0}.log"
    assert first.stat().st_size == log._local.segments[0].size
    assert reopened_values(log, config) == contents


@pytest.mark.parametrize("how", ["append", "roll", "maintain"])
def test_a_roll_whose_pending_cut_fails_again_changes_nothing(make_log, how):
    config = small(segment_max_age_s=60)
    log = log_with_a_tail_left(make_log, config, clock=lambda: 10**9)
    before, contents, names = state(log), values(log), segment_files(log)
    faults.fail(".log", op=TRUNCATE, error=errno.ENOSPC)
    if how == "maintain":
        log.maintain(now_ns=10**9 + 61 * 10**9)  # logs it: retention must run on a full disk
    else:
        with pytest.raises(DiskFull):
            if how == "append":
                log.append([b"c" * 3000])
            else:
                log.roll()
    assert faults.hits and state(log) == before and values(log) == contents
    assert segment_files(log) == names and log._local.active._cut_pending
    faults.clear()
    assert log.append([b"c" * 3000]) == range(10, 11)
    assert reopened_values(log, config) == [*contents, (10, b"c" * 3000)]


def test_close_with_a_tail_it_cannot_cut_loses_nothing(make_log):
    config = small()
    log = log_with_a_tail_left(make_log, config)
    contents = values(log)
    faults.fail(".log", op=TRUNCATE, error=errno.EIO)  # still failing at close
    log.close()
    faults.clear()
    with SegmentedLog(log.directory, config) as again:
        assert values(again) == contents
        assert again.append([b"e"]) == range(10, 11)


def test_compaction_on_a_full_disk_leaves_the_segment_and_no_cleaned_files(make_log):
    log = make_log(config=small())
    log.append([NewRecord(b"x" * 100, key=b"same") for _ in range(30)])
    log.roll()
    contents = values(log)
    faults.fail(".cleaned")
    with pytest.raises(DiskFull):
        log.compact()
    assert not list(log.directory.glob("*.cleaned")) and values(log) == contents
    assert log.compact().segments_rewritten >= 1


def test_a_recovery_point_that_cannot_be_written_keeps_the_sealed_segments_unsynced(make_log):
    log = make_log(config=small())
    log.append([b"a" * 3000])
    faults.fail("recovery-point")
    assert log.append([b"b" * 3000]) == range(1, 2)  # committed: the roll's sync is not the ack
    assert faults.hits and log._local.unsynced_sealed and not list(log.directory.glob("*.tmp"))
    faults.fail("recovery-point")
    with pytest.raises(SyncFailed):
        log.flush()
    assert log._local.unsynced_sealed
    log.flush()
    assert not log._local.unsynced_sealed
    assert (log.directory / "recovery-point").read_text() == "0\n"


@pytest.mark.parametrize("where", [".log", "recovery-point"])
def test_a_sync_that_fails_says_the_records_were_written(make_log, where):
    """With ALWAYS the batch is in the log before its sync: a failed sync must not be reported
    as a write that was undone (DiskFull), and the batch is committed by the next sync."""
    config = small(flush_policy=FlushPolicy.ALWAYS)
    log = make_log(config=config)
    log.append([b"a" * 3000])
    faults.fail(where, op=SYNC if where == ".log" else WRITE)
    with pytest.raises(SyncFailed) as raised:
        log.append([b"b" * 3000])  # rolls: syncs the sealed segment and the recovery point
    assert not isinstance(raised.value, DiskFull)
    assert isinstance(raised.value, ResourceExhausted) and raised.value.resource == "disk space"
    assert "written but not confirmed durable" in str(raised.value)
    assert "nothing of the write was kept" not in str(raised.value)
    assert log.next_offset == 2 and log.high_watermark == 0  # written, not committed
    log.flush()
    assert log.high_watermark == 1
    assert values(log) == [(0, b"a" * 3000), (1, b"b" * 3000)]


def test_only_a_write_that_was_undone_says_nothing_was_kept():
    from tidelog.errors import resource_error

    full = OSError(errno.ENOSPC, "No space left on device", "/data/stream.json")
    assert "nothing of the write was kept" not in str(resource_error(full))
    assert "nothing of the write was kept" in str(resource_error(full, undone=True))


def test_random_failures_never_change_what_was_acknowledged(tmp_path):
    """Appends of random sizes (rolling often) with failures armed at random points of every
    write path; after each failure the log equals the model of acknowledged appends, and so does
    every reopen and every crash copy."""
    rng = random.Random(20240601)
    config = small(segment_max_bytes=8192)
    directory = tmp_path / "log"
    log = SegmentedLog(directory, config)
    model: list[tuple[int, bytes]] = []
    failures = 0
    try:
        for step in range(400):
            if rng.random() < 0.35:
                op = rng.choice([WRITE, WRITE, WRITE, RESERVE, OPEN, TRUNCATE])
                where = rng.choice([".log", ".index", ""])
                keep = rng.choice([None, 0, rng.randrange(1, 200)]) if op == WRITE else None
                faults.fail(where, op=op, skip=rng.randrange(3), keep=keep)
            count = rng.randrange(1, 6)
            batch = [b"%d-%d-" % (step, i) + b"p" * rng.randrange(0, 900) for i in range(count)]
            before = state(log)
            try:
                offsets = log.append(batch)
            except ResourceExhausted:
                failures += 1
                faults.clear()
                assert state(log) == before
                assert values(log) == model
                continue
            model += list(zip(offsets, batch, strict=True))
            if faults.hits:  # a fault fired somewhere the append survived (a retried write)
                faults.clear()
            if step % 50 == 49:
                faults.clear()
                crashed = SegmentedLog(crash_copy(log, tmp_path / f"crash-{step}"), config)
                try:
                    assert values(crashed) == model
                finally:
                    crashed.close()
                log.close()
                log = SegmentedLog(directory, config)
                assert values(log) == model
                assert log.verify() == len(model)
        faults.clear()
        assert failures > 20
        assert values(log) == model
        assert [(r.offset, r.value) for r in read_reverse(log)] == model[::-1]
        assert [o for o, _ in model] == list(range(len(model)))
        assert log.verify() == len(model)
    finally:
        faults.clear()
        log.close()
    with SegmentedLog(directory, config) as reopened:
        assert values(reopened) == model
        assert reopened.verify() == len(model)
