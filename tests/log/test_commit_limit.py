"""The commit limit: a replicated partition's leader shows readers only what every in-sync
replica holds, while replicas copy everything committed."""

from __future__ import annotations

import threading

import pytest

from tidelog.log import FlushPolicy, LogConfig


def offsets(reader) -> list[int]:
    return [record.offset for record in reader.records()]


@pytest.mark.parametrize("policy", [FlushPolicy.NEVER, FlushPolicy.ALWAYS])
def test_readers_see_up_to_the_limit_and_replicas_see_everything_committed(make_log, policy):
    log = make_log(config=LogConfig(flush_policy=policy))
    log.set_commit_limit(-1)
    log.append([b"m%d" % i for i in range(10)])
    assert log.high_watermark == -1
    assert log.committed_offset == 9
    assert log.newest_offset == 9
    assert offsets(log.forward_reader(0)) == []
    assert offsets(log.forward_reader(0, past_limit=True)) == list(range(10))

    log.set_commit_limit(4)
    assert log.high_watermark == 4
    assert offsets(log.forward_reader(0)) == [0, 1, 2, 3, 4]
    assert offsets(log.reverse_reader()) == [4, 3, 2, 1, 0]
    assert offsets(log.forward_reader(3, past_limit=True)) == list(range(3, 10))

    log.append([b"late"])  # committed, not shown: the limit holds
    assert (log.high_watermark, log.committed_offset) == (4, 10)

    log.set_commit_limit(None)
    assert log.high_watermark == 10
    assert offsets(log.forward_reader(8)) == [8, 9, 10]


def test_raising_the_limit_wakes_waiters_and_listeners(make_log):
    log = make_log()
    log.set_commit_limit(-1)
    log.append([b"a", b"b", b"c"])
    heard: list[int] = []
    log.add_listener(heard.append)
    woke = threading.Event()

    def wait() -> None:
        if log.wait_for_offset(2, timeout=10):
            woke.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert not woke.wait(0.1)
    log.set_commit_limit(1)  # not far enough for the waiter
    assert not woke.wait(0.1)
    log.set_commit_limit(2)
    waiter.join(10)
    assert woke.is_set()
    assert heard == [2, 2]  # the newest committed offset, once per raise that showed more
    log.set_commit_limit(2)  # nothing new shown: nobody is told
    assert heard == [2, 2]


def test_the_high_watermark_never_moves_back_when_the_limit_is_lowered(make_log):
    """A replica's high watermark only rises: a lower limit holds back what is not shown yet,
    and never hides what readers have seen."""
    log = make_log()
    log.append([b"a", b"b", b"c"])
    log.set_commit_limit(0)
    assert log.high_watermark == 2
    log.append([b"d"])
    assert log.high_watermark == 2
    log.set_commit_limit(3)
    assert log.high_watermark == 3


def test_truncation_below_the_limit_lowers_both(make_log):
    log = make_log()
    log.set_commit_limit(-1)
    log.append([b"x%d" % i for i in range(6)])
    log.set_commit_limit(3)
    log.truncate_to(2)
    assert (log.high_watermark, log.committed_offset, log.next_offset) == (1, 1, 2)
    log.append([b"y"])
    assert offsets(log.forward_reader(0, past_limit=True)) == [0, 1, 2]
    assert log.high_watermark == 2  # the limit (3) lets the new record show


def test_a_timestamp_stop_does_not_end_early_while_records_are_held(make_log):
    """Records held back by the limit are no older than the high watermark's: a forward read
    bounded by a time it has not reached must wait for them, not end."""
    log = make_log()
    log.set_commit_limit(-1)
    log.append([b"first"], timestamp=1_000)
    log.append([b"second"], timestamp=2_000)
    log.set_commit_limit(0)
    reader = log.forward_reader(0, stop_timestamp=2_000)
    assert [r.offset for r in reader.read().records()] == [0]
    assert not reader.read()
    assert not reader.done
    log.set_commit_limit(1)
    assert [r.offset for r in reader.read().records()] == [1]
