"""Atomic batches: CONTINUES on every record but the last, and recovery keeps all or none.

A crash is simulated as in ``test_recovery.py`` (copy the open log's directory, then cut the
newest ``.log`` file). What must survive is computed from the documented format alone
(``logtools.layout``), not asked of the log under test.
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logtools import (
    HYPOTHESIS_PHASES,
    Expected,
    KiB,
    bases,
    check_continues_densely,
    crash_copy,
    layout,
    open_damaged,
    read_forward,
    segment_logs,
)

from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.record import encode_batch
from tidelog.log.recovery import read_recovery_point

ATTRS_AT = 25  # byte 25 of a record: attributes
CONTINUES = 0x01
_SIZE = struct.Struct("<I")


def config(segment_bytes: int) -> LogConfig:
    return LogConfig(
        segment_max_bytes=segment_bytes,
        flush_policy=FlushPolicy.NEVER,
        index_preallocate_bytes=1280,
    )


def attrs_of(path: Path) -> list[int]:
    """The attributes byte of every record in a ``.log`` file, walking the size fields."""
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        out.append(data[at + ATTRS_AT])
        at += _SIZE.unpack_from(data, at + 4)[0]
    return out


def message(offset: int, size: int) -> NewRecord:
    value = (b"<%d>" % offset * (size // 3 + 1))[:size]
    return NewRecord(value, key=b"k%d" % offset if offset % 2 else None)


def as_expected(offset: int, timestamp: int, m: NewRecord) -> Expected:
    return Expected(offset, timestamp, m.value, m.key, tuple(m.headers.items()))


# -- the bits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 16, 17, 300], ids=lambda n: f"{n} records")
def test_atomic_append_sets_continues_on_all_records_but_the_last(make_log, count):
    log = make_log(config=config(1 << 20))
    log.append([b"before"])
    log.append([message(o, 5 + o % 40) for o in range(1, count + 1)], atomic=True)
    log.append([b"after", b"after too"])
    (path,) = segment_logs(log.directory)
    log.flush()
    assert attrs_of(path) == [0] + [CONTINUES] * (count - 1) + [0] + [0, 0]
    assert [r.value for r in read_forward(log)][-2:] == [b"after", b"after too"]
    assert log.verify() == count + 3


@pytest.mark.parametrize("count", [1, 5, 16, 17, 200], ids=lambda n: f"{n} records")
@pytest.mark.parametrize("same_size", [True, False], ids=["same sizes", "mixed sizes"])
def test_a_non_atomic_batch_is_byte_for_byte_what_it_was(count, same_size):
    """attrs 0 everywhere; the atomic encoding differs only in the attrs bytes and the CRCs."""
    messages = [b"x" * (7 if same_size else 3 + i % 11) for i in range(count)]
    offsets = np.arange(100, 100 + count, dtype=np.int64)
    plain = encode_batch(messages, offsets, 5_000, 1 << 20)
    atomic = encode_batch(messages, offsets, 5_000, 1 << 20, atomic=True)
    plain_bytes, atomic_bytes = plain.data.tobytes(), atomic.data.tobytes()
    # An independent encoding of record i from the documented byte table, attrs 0.
    from crc32c import crc32c

    expected = b""
    for i, value in enumerate(messages):
        tail = struct.pack("<IqqBBHii", 36 + len(value), 100 + i, 5_000, 1, 0, 0, -1, len(value))
        expected += struct.pack("<I", crc32c(tail + value)) + tail + value
    assert plain_bytes == expected
    starts = np.concatenate(([0], np.cumsum(plain.sizes)[:-1]))
    differ = {i for i, (a, b) in enumerate(zip(plain_bytes, atomic_bytes, strict=True)) if a != b}
    allowed = {int(s) + k for s in starts for k in (0, 1, 2, 3, ATTRS_AT)}
    assert differ <= allowed
    assert [atomic_bytes[int(s) + ATTRS_AT] for s in starts] == [CONTINUES] * (count - 1) + [0]


# -- every cut inside a torn batch -----------------------------------------------------------------


@dataclass
class Written:
    records: list[Expected]
    batch: list[Expected]
    """The atomic batch written last."""


def write_then_atomic_batch(log: SegmentedLog, value_sizes: list[int]) -> Written:
    """Some plain and atomic batches, then one atomic batch with the given value sizes."""
    records: list[Expected] = []
    ts = 1_000
    for n in range(30):
        first = log.next_offset
        batch = [message(first + i, 20 + (first + i) % 90) for i in range(1 + n % 4)]
        log.append(batch, timestamp=ts, atomic=n % 2 == 1)
        records += [as_expected(first + i, ts, m) for i, m in enumerate(batch)]
        ts += 10
    first = log.next_offset
    batch = [message(first + i, size) for i, size in enumerate(value_sizes)]
    assert log.append(batch, timestamp=ts, atomic=True) == range(first, first + len(batch))
    last = [as_expected(first + i, ts, m) for i, m in enumerate(batch)]
    return Written(records + last, last)


@pytest.mark.parametrize(
    "segment_bytes", [4 * KiB, 5000, 64 * KiB], ids=["4 KiB", "5000 B", "64 KiB"]
)
def test_a_torn_atomic_batch_at_the_tail_is_kept_whole_or_not_at_all(
    make_log, tmp_path, segment_bytes
):
    log = make_log(config=config(segment_bytes))
    written = write_then_atomic_batch(log, [40, 3, 0, 90, 17])
    pristine = crash_copy(log, tmp_path / "pristine")
    names = bases(pristine)
    placed = layout(written.records, names)[names[-1]]
    positions = {r.offset: at for r, at in placed}
    start = positions[written.batch[0].offset]
    end = positions[written.batch[-1].offset] + written.batch[-1].size
    assert segment_logs(pristine)[-1].stat().st_size == end
    before = written.records[: -len(written.batch)]
    for cut in range(start, end + 1):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(pristine, work)
        with open(segment_logs(work)[-1], "r+b") as f:
            f.truncate(cut)
        reopened = open_damaged(work, config(segment_bytes))
        try:
            survivors = written.records if cut == end else before
            assert read_forward(reopened) == survivors, f"cut at byte {cut}"
            assert reopened.next_offset == survivors[-1].offset + 1
            if start < cut < end:
                assert not reopened.recovery_report.clean
        finally:
            reopened.close()
        shutil.rmtree(work)
    # And the log goes on from there (once is enough).
    shutil.copytree(pristine, tmp_path / "again")
    with open(segment_logs(tmp_path / "again")[-1], "r+b") as f:
        f.truncate(end - 1)
    again = open_damaged(tmp_path / "again", config(segment_bytes))
    try:
        check_continues_densely(again, before)
    finally:
        again.close()


def test_a_torn_batch_that_began_a_segment_leaves_that_segment_empty(make_log, tmp_path):
    log = make_log(config=config(4 * KiB))
    log.append([b"x" * 1000] * 3, timestamp=10)
    log.append([b"y" * 900, b"z" * 900], timestamp=20, atomic=True)  # rolls first
    assert len(bases(log.directory)) == 2
    copy = crash_copy(log, tmp_path / "copy")
    with open(segment_logs(copy)[-1], "r+b") as f:
        f.truncate(1500)  # the first record whole, the second torn
    reopened = open_damaged(copy, config(4 * KiB))
    try:
        assert [r.offset for r in read_forward(reopened)] == [0, 1, 2]
        assert reopened.next_offset == 3
        assert reopened.append([b"next"]) == range(3, 4)
    finally:
        reopened.close()


@pytest.mark.parametrize("loss", ["later segments emptied", "later segments and index gone"])
def test_a_continues_record_at_or_below_the_recovery_point_is_never_cut(make_log, loss):
    """Compaction may remove the end of a batch (it keeps records, not batches); if what
    follows is then lost, the synced records of that batch stay, whether the segment is trusted
    (O(1) check) or scanned record by record (its index lost)."""
    log = make_log(config=config(4 * KiB))
    log.append(
        [NewRecord(b"a" * 1500, key=b"a"), NewRecord(b"b" * 1500, key=b"b")],
        timestamp=10,
        atomic=True,
    )
    log.append([NewRecord(b"b2" * 700, key=b"b")], timestamp=20)  # rolls; supersedes b
    log.roll()
    log.compact()
    log.close()
    assert read_recovery_point(log.directory) == 2
    assert attrs_of(segment_logs(log.directory)[0]) == [CONTINUES]  # "b" was compacted away
    for path in segment_logs(log.directory)[1:]:  # lost after the sync the recovery point records
        if loss == "later segments emptied":
            path.write_bytes(b"")
        else:
            path.unlink()
            path.with_suffix(".index").unlink()
    if loss != "later segments emptied":
        (log.directory / "00000000000000000000.index").unlink()
    reopened = open_damaged(log.directory, config(4 * KiB))
    try:
        assert [r.offset for r in read_forward(reopened)] == [0]
    finally:
        reopened.close()


# -- property: any mix of batches across rolls, any cut of the newest segment ----------------------

batches_strategy = st.lists(
    st.tuples(st.booleans(), st.lists(st.integers(0, 900), min_size=1, max_size=6)),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=60,
    deadline=None,
    phases=HYPOTHESIS_PHASES,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batches=batches_strategy,
    segment_bytes=st.sampled_from([4 * KiB, 6000, 16 * KiB]),
    cut_fraction=st.floats(0, 1),
)
def test_recovery_keeps_a_prefix_of_whole_batches_across_rolls(
    tmp_path_factory, batches, segment_bytes, cut_fraction
):
    root = tmp_path_factory.mktemp("atomic")
    cfg = config(segment_bytes)
    log = SegmentedLog(root / "log", cfg)
    model: list[tuple[bool, list[Expected]]] = []
    try:
        ts = 100
        for atomic, sizes in batches:
            first = log.next_offset
            messages = [message(first + i, size) for i, size in enumerate(sizes)]
            log.append(messages, timestamp=ts, atomic=atomic)
            model.append((atomic, [as_expected(first + i, ts, m) for i, m in enumerate(messages)]))
            ts += 5
        copy = crash_copy(log, root / "copy")
    finally:
        log.close()
    records = [r for _, batch in model for r in batch]
    names = bases(copy)
    newest = segment_logs(copy)[-1]
    cut = int(newest.stat().st_size * cut_fraction)
    with open(newest, "r+b") as f:
        f.truncate(cut)
    placed = layout(records, names)
    positions = {r.offset: (base, at) for base, rs in placed.items() for r, at in rs}

    def whole(r: Expected) -> bool:
        base, at = positions[r.offset]
        return base != names[-1] or at + r.size <= cut

    survivors: list[Expected] = []
    for atomic, batch in model:
        kept = [r for r in batch if whole(r)]
        if atomic and len(kept) < len(batch):
            break
        survivors += kept
        if len(kept) < len(batch):
            break
    reopened = open_damaged(copy, cfg)
    try:
        assert read_forward(reopened) == survivors
        check_continues_densely(reopened, survivors)
    finally:
        reopened.close()
