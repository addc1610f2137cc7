"""Damage at seeded random positions in log and index files: recovery cuts cleanly, reads raise
``CorruptRecord`` naming the segment and position, and wrong bytes are never returned."""

from __future__ import annotations

import contextlib
import random

import pytest
from logtools import (
    Expected,
    KiB,
    as_expected,
    base_of,
    bases,
    check_continues_densely,
    crash_copy,
    file_sizes,
    fill,
    flip_bit,
    layout,
    open_damaged,
    read_forward,
    read_reverse,
    segment_indexes,
    segment_logs,
)

from tidelog.errors import CorruptRecord
from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.index import ENTRY_SIZE
from tidelog.log.recovery import RECOVERY_POINT_FILE

CONFIG = LogConfig(
    segment_max_bytes=4 * KiB, flush_policy=FlushPolicy.NEVER, index_preallocate_bytes=1280
)
SEEDS = range(8)
RECORDS = 400


def damaged_record(expected, directory, log_file, position):
    """The record of ``log_file`` whose bytes include ``position``, and where it starts."""
    for record, start in layout(expected, bases(directory))[base_of(log_file)]:
        if start <= position < start + record.size:
            return record, start
    raise AssertionError(f"no record at byte {position} of {log_file.name}")


def read_until_corrupt(log, direction, **limits):
    """Records a full read returns, and the CorruptRecord that ended it (or None)."""
    reader = log.forward_reader(0) if direction == "forward" else log.reverse_reader()
    got: list[Expected] = []
    try:
        while batch := reader.read(**limits):
            got += as_expected(batch.records())
    except CorruptRecord as error:
        return got, error
    return got, None


def assert_prefix_or_corrupt(log, expected):
    """Reads in both directions either return exactly ``expected`` or stop with CorruptRecord
    after returning only records that equal it, in order, with none missing."""
    for direction, wanted in (("forward", expected), ("reverse", expected[::-1])):
        for limits in ({}, {"max_messages": 1}):
            got, error = read_until_corrupt(log, direction, **limits)
            if error is None:
                assert got == wanted, (direction, limits)
            else:
                assert got == wanted[: len(got)], (direction, limits, error)
    with contextlib.suppress(CorruptRecord):
        assert log.verify() == len(expected)


# -- (a) damage in the active region, found by recovery after a crash ------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_damage_in_the_active_segment_after_a_crash_is_cut_at_the_damaged_record(
    make_log, tmp_path, seed
):
    rng = random.Random(seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    copy = crash_copy(log, tmp_path / "crashed")
    newest = segment_logs(copy)[-1]
    position = rng.randrange(newest.stat().st_size)
    flip_bit(newest, position, rng.randrange(8))
    hit, start = damaged_record(expected, copy, newest, position)
    size_before = newest.stat().st_size

    recovered = open_damaged(copy, CONFIG)
    survivors = [r for r in expected if r.offset < hit.offset]
    assert read_forward(recovered) == survivors
    assert read_reverse(recovered) == survivors[::-1]
    assert recovered.recovery_report.truncated == [(base_of(newest), size_before - start)]
    assert newest.stat().st_size == start
    check_continues_densely(recovered, survivors)


# -- (b) damage in a sealed, synced segment, found by reads ----------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_damage_in_a_sealed_segment_raises_corrupt_record_and_never_returns_wrong_bytes(
    make_log, seed
):
    rng = random.Random(seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    log.close()
    victim = rng.choice(segment_logs(log.directory))
    position = rng.randrange(victim.stat().st_size)
    flip_bit(victim, position, rng.randrange(8))
    hit, start = damaged_record(expected, log.directory, victim, position)

    reopened = open_damaged(log.directory, CONFIG)
    assert reopened.recovery_report.clean  # trusted below the recovery point: found by reads
    before = [r for r in expected if r.offset < hit.offset]
    after = [r for r in expected if r.offset > hit.offset]
    for direction, wanted in (("forward", before), ("reverse", after[::-1])):
        got, error = read_until_corrupt(reopened, direction, max_messages=1)
        assert got == wanted, direction
        assert error is not None and (error.segment, error.position) == (victim.name, start)
        assert victim.name in str(error) and str(start) in str(error)
        got, error = read_until_corrupt(reopened, direction)
        assert got == wanted[: len(got)] and error is not None
    with pytest.raises(CorruptRecord):
        reopened.verify()
    # Records on either side of the damage stay readable.
    assert read_forward(reopened, hit.offset + 1) == after
    assert read_reverse(reopened, hit.offset - 1) == before[::-1]


# -- (c) damage in index files ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_index_damage_after_a_clean_close_never_yields_wrong_or_missing_records(make_log, seed):
    rng = random.Random(1000 + seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    log.close()
    victim = rng.choice(segment_indexes(log.directory))
    flip_bit(victim, rng.randrange(victim.stat().st_size), rng.randrange(8))
    sizes = file_sizes(log.directory)

    reopened = open_damaged(log.directory, CONFIG)
    # The index is derived data: damage to it must never cost records stored intact in the log.
    assert file_sizes(log.directory) == sizes
    assert_prefix_or_corrupt(reopened, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_index_damage_in_the_active_segment_after_a_crash_is_rebuilt(make_log, tmp_path, seed):
    rng = random.Random(2000 + seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    active_entries = len(layout(expected, bases(log.directory))[bases(log.directory)[-1]])
    copy = crash_copy(log, tmp_path / "crashed")
    index = segment_indexes(copy)[-1]
    flip_bit(index, rng.randrange(active_entries * ENTRY_SIZE), rng.randrange(8))

    recovered = open_damaged(copy, CONFIG)
    assert read_forward(recovered) == expected
    assert base_of(index) in recovered.recovery_report.rebuilt_indexes
    check_continues_densely(recovered, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_without_a_recovery_point_a_damaged_tail_index_is_rebuilt_from_the_log(make_log, seed):
    rng = random.Random(3000 + seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    log.close()
    index = segment_indexes(log.directory)[-1]
    flip_bit(index, rng.randrange(index.stat().st_size), rng.randrange(8))
    (log.directory / RECOVERY_POINT_FILE).unlink()
    sizes = file_sizes(log.directory)

    reopened = open_damaged(log.directory, CONFIG)
    report = reopened.recovery_report
    assert report.scanned_records == len(expected)  # every record verified
    assert base_of(index) in report.rebuilt_indexes
    assert report.truncated == [] and report.dropped_segments == []
    assert file_sizes(log.directory) == sizes
    assert read_forward(reopened) == expected
    assert read_reverse(reopened) == expected[::-1]


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_without_a_recovery_point_damage_in_a_sealed_log_is_cut_on_open(make_log, seed):
    rng = random.Random(4000 + seed)
    log = make_log(config=CONFIG)
    expected = fill(log, RECORDS)
    log.close()
    victim = rng.choice(segment_logs(log.directory)[:-1])
    position = rng.randrange(victim.stat().st_size)
    flip_bit(victim, position, rng.randrange(8))
    hit, start = damaged_record(expected, log.directory, victim, position)
    later = [b for b in bases(log.directory) if b > base_of(victim)]
    (log.directory / RECOVERY_POINT_FILE).unlink()

    reopened = open_damaged(log.directory, CONFIG)
    survivors = [r for r in expected if r.offset < hit.offset]
    assert read_forward(reopened) == survivors
    assert reopened.recovery_report.dropped_segments == later
    assert victim.stat().st_size == start
    check_continues_densely(reopened, survivors)


# -- index damage in particular fields (deterministic reproductions) -------------------------------


def closed_log(make_log, records=RECORDS):
    log = make_log(config=CONFIG)
    expected = fill(log, records)
    log.close()
    return log.directory, expected


REL, TIMESTAMP, POSITION = 0, 4, 12


@pytest.mark.parametrize(
    "field, byte, bit",
    [(REL, 0, 1), (REL, 2, 0), (TIMESTAMP, 7, 4), (POSITION, 2, 0)],
    ids=["rel+2", "rel+65536", "timestamp high bit", "position+65536"],
)
@pytest.mark.parametrize("where", ["first segment", "last segment"])
def test_one_damaged_index_entry_costs_no_intact_record(make_log, field, byte, bit, where):
    """One bit flipped in one entry of a trusted index (clean close, recovery point above it):
    recovery may rebuild the index or leave reads to raise CorruptRecord, but it must not cut
    records stored intact in the log, and reads must not silently skip records."""
    directory, expected = closed_log(make_log)
    index = segment_indexes(directory)[0 if where == "first segment" else -1]
    entries = index.stat().st_size // ENTRY_SIZE
    flip_bit(index, (entries // 2) * ENTRY_SIZE + field + byte, bit)
    sizes = file_sizes(directory)

    reopened = open_damaged(directory, CONFIG)
    assert file_sizes(directory) == sizes
    assert reopened.next_offset == expected[-1].offset + 1
    assert_prefix_or_corrupt(reopened, expected)


def test_a_damaged_last_entry_of_a_sealed_index_costs_no_later_segment(make_log):
    directory, expected = closed_log(make_log)
    index = segment_indexes(directory)[0]
    entries = index.stat().st_size // ENTRY_SIZE
    flip_bit(index, (entries - 1) * ENTRY_SIZE + REL + 2, 0)  # its offset jumps by 65536
    segments = bases(directory)

    reopened = open_damaged(directory, CONFIG)
    assert bases(directory) == segments
    assert reopened.recovery_report.dropped_segments == []
    assert reopened.next_offset == expected[-1].offset + 1
    assert_prefix_or_corrupt(reopened, expected)
