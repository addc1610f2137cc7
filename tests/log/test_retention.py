"""Retention: the pure decisions (``expired_prefix``, ``released_prefix``) and their effect on a
log (injected time)."""

from __future__ import annotations

import pytest
from logtools import read_forward, read_reverse, segment_logs

from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.retention import SegmentSummary, expired_prefix, released_prefix

S = 1_000_000_000  # ns per second


def seg(base, size=100, count=10, newest=None):
    return SegmentSummary(base, size, count, newest)


ACTIVE = seg(1000, size=50, count=5, newest=100 * S)


def expire(sealed, active=ACTIVE, *, bytes_=None, messages=None, age=None, now=100 * S):
    return expired_prefix(
        sealed,
        active,
        retention_bytes=bytes_,
        retention_messages=messages,
        retention_age_s=age,
        now_ns=now,
    )


def test_nothing_to_delete_without_sealed_segments():
    assert expire([], bytes_=0, messages=0, age=1) == 0


def test_no_limits_keep_everything():
    assert expire([seg(0), seg(10), seg(20)]) == 0


def test_age_deletes_segments_whose_newest_record_is_older_than_the_limit():
    sealed = [seg(0, newest=10 * S), seg(10, newest=20 * S), seg(20, newest=50 * S)]
    # cutoff = now - age = 100 s - 70 s = 30 s
    assert expire(sealed, age=70) == 2
    assert expire(sealed, age=90) == 0  # cutoff 10 s: the oldest's newest record is not older
    assert expire(sealed, age=89.999) == 1
    assert expire(sealed, age=1) == 3


def test_age_never_deletes_the_active_segment_however_old():
    old_active = seg(30, count=3, newest=1 * S)
    assert expire([seg(0, newest=1 * S)], old_active, age=1) == 1
    assert expire([], old_active, age=1) == 0


def test_bytes_limit_is_a_floor():
    sealed = [seg(0, size=100), seg(10, size=100), seg(20, size=100)]  # + active 50 = 350
    assert expire(sealed, bytes_=120) == 2  # 150 left: one more deletion would leave 50 < 120
    assert expire(sealed, bytes_=150) == 2
    assert expire(sealed, bytes_=151) == 1
    assert expire(sealed, bytes_=350) == 0
    assert expire(sealed, bytes_=0) == 3


def test_messages_limit_is_a_floor():
    sealed = [seg(0, count=10), seg(10, count=10), seg(20, count=10)]  # + active 5 = 35
    assert expire(sealed, messages=5) == 3
    assert expire(sealed, messages=6) == 2
    assert expire(sealed, messages=25) == 1
    assert expire(sealed, messages=26) == 0


def test_empty_sealed_segments_go_with_the_ones_before_them():
    sealed = [seg(0, size=0, count=0), seg(0, size=100, count=10, newest=99 * S)]
    assert expire(sealed) == 1
    assert expire(sealed, age=1000) == 1


def test_deletion_stops_at_the_first_segment_no_rule_wants():
    sealed = [seg(0, newest=10 * S), seg(10, newest=90 * S), seg(20, size=0, count=0)]
    assert expire(sealed, age=20) == 1


# -- applied to a log --------------------------------------------------------------------------


def filled_log(make_log, config, segments=4, per_segment=5, start_ns=S):
    """A log whose segment ``k`` holds records stamped ``start_ns + k * S`` (one roll per k)."""
    log = make_log(config=config)
    for k in range(segments):
        log.append([b"x" * 30] * per_segment, timestamp=start_ns + k * S)
        log.roll()
    return log


def config(**kwargs):
    kwargs.setdefault("retention_age_s", None)
    return LogConfig(flush_policy=FlushPolicy.NEVER, **kwargs)


def test_enforce_retention_deletes_whole_segments_by_age(make_log):
    log = filled_log(make_log, config(retention_age_s=2.5))
    # newest records: 1 s, 2 s, 3 s, 4 s; at 5 s the cutoff is 2.5 s.
    assert log.enforce_retention(now_ns=5 * S) == [0, 5]
    assert log.oldest_offset == 10
    assert [p.name for p in segment_logs(log.directory)] == [
        "00000000000000000010.log",
        "00000000000000000015.log",
        "00000000000000000020.log",
    ]
    assert [r.offset for r in read_forward(log, 0)] == list(range(10, 20))
    assert [r.offset for r in read_reverse(log)] == list(range(19, 9, -1))
    assert log.enforce_retention(now_ns=5 * S) == []


def test_retention_never_deletes_the_active_segment(make_log):
    log = make_log(config=config(retention_age_s=1, retention_bytes=0, retention_messages=0))
    log.append([b"a", b"b"], timestamp=S)
    assert log.enforce_retention(now_ns=1000 * S) == []
    assert [r.value for r in read_forward(log)] == [b"a", b"b"]


@pytest.mark.parametrize(
    "limit, kept_from", [(0, 20), (5, 15), (6, 10), (10, 10), (11, 5), (20, 0)]
)
def test_enforce_retention_messages_floor(make_log, limit, kept_from):
    log = filled_log(make_log, config(retention_messages=limit))  # active segment is empty
    log.enforce_retention(now_ns=S)
    assert log.oldest_offset == kept_from
    assert log.message_count == 20 - kept_from >= limit
    assert [r.offset for r in read_forward(log)] == list(range(kept_from, 20))


def test_enforce_retention_bytes_floor(make_log):
    log = filled_log(make_log, config(retention_bytes=1))
    log.append([b"tail"])
    size_of_active = log.size_bytes - 4 * 5 * (36 + 30)
    log.enforce_retention(now_ns=S)
    assert log.size_bytes == size_of_active
    assert log.oldest_offset == 20


def test_maintain_rolls_an_over_age_active_segment_then_applies_retention(make_log):
    now = [S]
    log = make_log(config=config(segment_max_age_s=10, retention_age_s=5), clock=lambda: now[0])
    log.append([b"a", b"b"])
    assert log.maintain(now_ns=5 * S) == []  # 4 s old: neither rolled nor expired
    assert log.segment_count == 1
    deleted = log.maintain(now_ns=20 * S)  # 19 s old: rolled, then older than 5 s
    assert deleted == [0]
    assert (log.oldest_offset, log.next_offset, log.message_count) == (2, 2, 0)
    assert read_forward(log) == [] and read_reverse(log) == []
    assert log.append([b"c"]) == range(2, 3)


def test_a_reader_in_a_deleted_segment_continues_at_the_new_oldest_offset(make_log):
    log = filled_log(make_log, config(retention_messages=10))
    reader = log.forward_reader(0)
    first = reader.read(max_messages=2)
    assert first.offsets.tolist() == [0, 1]
    log.enforce_retention(now_ns=S)
    assert log.oldest_offset == 10
    rest = [int(o) for batch in reader for o in batch.offsets]
    assert rest == list(range(10, 20))


# -- releases ------------------------------------------------------------------------------------


def test_released_prefix_counts_sealed_segments_wholly_below_the_offset():
    bases = [0, 10, 20, 30]  # the last is the active segment
    assert released_prefix(bases, 0) == 0
    assert released_prefix(bases, 9) == 0  # segment 0 may hold offset 9
    assert released_prefix(bases, 10) == 1
    assert released_prefix(bases, 29) == 2
    assert released_prefix(bases, 30) == 3
    assert released_prefix(bases, 10**9) == 3  # never the active segment
    assert released_prefix([0], 10**9) == 0


def test_release_before_deletes_only_sealed_segments_wholly_below_the_offset(make_log):
    log = filled_log(make_log, config())  # segments 0-4, 5-9, 10-14, 15-19, active from 20
    assert log.release_before(4) == []  # segment 0-4 holds offset 4: kept
    assert log.release_before(5) == [0]
    assert log.oldest_offset == 5
    assert log.release_before(14) == [5]
    assert log.release_before(10**6) == [10, 15]
    assert log.segment_count == 1 and log.oldest_offset == 20
    assert log.append([b"y"]) == range(20, 21)
    assert [r.offset for r in read_forward(log, 0)] == [20]


# -- start listeners -------------------------------------------------------------------------------


def test_start_listeners_hear_every_move_of_the_oldest_offset_and_nothing_else(make_log):
    """What a replica's producer table and leader-epoch cache are trimmed by: retention and a
    release call them with the new oldest offset; a cut at the end, an append, or a pass that
    deletes nothing does not."""
    log = filled_log(make_log, config(retention_messages=15))  # 0-4, 5-9, 10-14, 15-19, active
    heard: list[int] = []
    log.add_start_listener(heard.append)
    log.append([b"tail"])
    log.truncate_to(20)
    assert log.enforce_retention(now_ns=S) == [0]
    assert log.enforce_retention(now_ns=S) == []
    assert log.release_before(12) == [5]
    assert log.release_before(12) == []
    assert heard == [5, 10]
    log.remove_start_listener(heard.append)
    assert log.release_before(15) == [10]
    assert heard == [5, 10]
