"""The ``CommitLog`` contract (``contract.py``, ``docs/api.md``), run against every backend.

Only ``SegmentedLog`` exists today; a new backend joins by adding a parameter to ``backend``.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
from logtools import read_forward, read_reverse

from tidelog.errors import LogClosed, OffsetOutOfRange, TidelogWarning
from tidelog.log import FlushPolicy, LogConfig, NewRecord

WAIT = 10.0


class Clock:
    """An injectable clock: ns, moved by the test."""

    def __init__(self, now=1_000):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture(params=["segmented"])
def backend(request, make_log):
    def open_backend(config=None, clock=None, name="log"):
        if request.param == "segmented":
            return make_log(name, config or LogConfig(flush_policy=FlushPolicy.NEVER), clock=clock)
        raise AssertionError(request.param)

    return open_backend


def test_an_empty_log(backend):
    log = backend()
    assert (log.oldest_offset, log.newest_offset, log.next_offset, log.high_watermark) == (
        0,
        -1,
        0,
        -1,
    )
    assert log.offset_at_or_after_timestamp(0) is None
    assert log.offset_at_or_before_timestamp(2**62) is None
    forward = log.forward_reader(0)
    assert not forward.read() and not forward.done
    reverse = log.reverse_reader()
    assert not reverse.read() and reverse.done


def test_append_assigns_dense_offsets_and_returns_them(backend):
    log = backend()
    assert log.append([b"a"]) == range(0, 1)
    assert log.append([b"b", b"c", b"d"]) == range(1, 4)
    assert log.append([]) == range(4, 4)
    assert (log.oldest_offset, log.newest_offset, log.next_offset, log.high_watermark) == (
        0,
        3,
        4,
        3,
    )
    assert [r.value for r in read_forward(log)] == [b"a", b"b", b"c", b"d"]


def test_a_batch_shares_one_timestamp_from_the_clock(backend):
    clock = Clock(500)
    log = backend(clock=clock)
    log.append([b"a", b"b"])
    clock.now = 700
    log.append([b"c"])
    assert [(r.offset, r.timestamp) for r in read_forward(log)] == [(0, 500), (1, 500), (2, 700)]


def test_timestamps_never_decrease(backend):
    clock = Clock(1_000)
    log = backend(clock=clock)
    log.append([b"a"])
    clock.now = 900  # the clock stepped back
    log.append([b"b"])
    log.append([b"c"], timestamp=10)  # an explicit older timestamp
    log.append([b"d"], timestamp=2_000)
    log.append([b"e"])
    assert [r.timestamp for r in read_forward(log)] == [1_000, 1_000, 1_000, 2_000, 2_000]


# Records (offset, timestamp) with repeated timestamps and offset gaps.
TIMELINE = [(0, 100), (1, 100), (2, 200), (5, 200), (6, 200), (9, 300), (20, 500)]


def timeline_log(backend):
    log = backend(config=LogConfig(flush_policy=FlushPolicy.NEVER, segment_max_bytes=4096))
    log.append([b"0", b"1"], timestamp=100)
    log.append([b"2"], timestamp=200)
    log.append_at([b"5", b"6"], [5, 6], timestamp=200)
    log.roll()
    log.append_at([b"9"], [9], timestamp=300)
    log.append_at([b"20"], [20], timestamp=500)
    return log


@pytest.mark.parametrize("ts", [0, 99, 100, 101, 199, 200, 201, 299, 300, 301, 499, 500, 501])
def test_offset_at_or_after_timestamp_is_the_first_with_a_timestamp_at_or_above(backend, ts):
    log = timeline_log(backend)
    expected = next((o for o, t in TIMELINE if t >= ts), None)
    assert log.offset_at_or_after_timestamp(ts) == expected


@pytest.mark.parametrize("ts", [0, 99, 100, 101, 199, 200, 201, 299, 300, 301, 499, 500, 501])
def test_offset_at_or_before_timestamp_is_the_last_with_a_timestamp_at_or_below(backend, ts):
    log = timeline_log(backend)
    expected = next((o for o, t in reversed(TIMELINE) if t <= ts), None)
    assert log.offset_at_or_before_timestamp(ts) == expected


def test_append_at_leaves_gaps_that_reads_skip(backend):
    log = backend()
    log.append([b"0", b"1"])
    log.append_at([b"10", b"12"], [10, 12])
    assert (log.newest_offset, log.next_offset, log.high_watermark) == (12, 13, 12)
    assert log.append([b"13"]) == range(13, 14)
    assert [r.offset for r in read_forward(log)] == [0, 1, 10, 12, 13]
    assert [r.offset for r in read_forward(log, 2)] == [10, 12, 13]
    assert [r.offset for r in read_reverse(log, 11)] == [10, 1, 0]


@pytest.mark.parametrize(
    "offsets",
    [[2], [1, 3], [5, 5], [6, 4]],
    ids=["not above newest", "first reused", "repeat", "descending"],
)
def test_append_at_rejects_offsets_that_do_not_increase_from_above_the_newest(backend, offsets):
    log = backend()
    log.append([b"0", b"1", b"2"])
    with pytest.raises(OffsetOutOfRange):
        log.append_at([b"x"] * len(offsets), offsets)
    assert (log.next_offset, log.message_count) == (3, 3)


def test_append_at_needs_one_offset_per_message(backend):
    log = backend()
    with pytest.raises(ValueError, match="offsets"):
        log.append_at([b"a", b"b"], [0])
    assert log.next_offset == 0


def test_wait_for_offset_is_woken_by_an_append_from_another_thread(backend):
    log = backend()
    log.append([b"a"])
    assert log.wait_for_offset(0, timeout=0)
    assert not log.wait_for_offset(1, timeout=0.01)
    started = threading.Event()
    woke = []

    def waiter():
        started.set()
        woke.append(log.wait_for_offset(2, timeout=WAIT))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(WAIT)
    log.append([b"b"])  # offset 1: not enough
    log.append([b"c"])  # offset 2
    thread.join(WAIT)
    assert not thread.is_alive() and woke == [True]


def test_a_forward_reader_waits_for_its_next_offset(backend):
    log = backend()
    log.append([b"a"])
    reader = log.forward_reader(0)
    assert reader.read().offsets.tolist() == [0]
    assert not reader.read() and not reader.done
    assert not reader.wait(timeout=0.01)
    appender = threading.Timer(0.01, lambda: log.append([b"b"]))
    appender.start()
    assert reader.wait(timeout=WAIT)
    appender.join(WAIT)
    assert reader.read().values() == [b"b"]


def test_close_wakes_waiters_with_false(backend):
    log = backend()
    result = []
    thread = threading.Thread(target=lambda: result.append(log.wait_for_offset(5, timeout=WAIT)))
    thread.start()
    log.close()
    thread.join(WAIT)
    assert not thread.is_alive() and result == [False]


def test_listeners_hear_each_new_high_watermark_from_the_appending_thread(backend):
    log = backend()
    heard = []
    log.add_listener(lambda hw: heard.append((hw, threading.current_thread().name)))
    log.append([b"a", b"b"])
    thread = threading.Thread(target=lambda: log.append([b"c"]), name="appender")
    thread.start()
    thread.join(WAIT)
    log.append_at([b"x"], [10])
    assert heard == [
        (1, threading.current_thread().name),
        (2, "appender"),
        (10, threading.current_thread().name),
    ]


def test_listeners_run_outside_the_logs_locks(backend):
    log = backend()
    seen = []

    def listener(hw):  # would deadlock if called with the log's lock held
        seen.append((hw, log.high_watermark, [r.offset for r in read_forward(log, hw)]))

    log.add_listener(listener)
    thread = threading.Thread(target=lambda: log.append([b"a", b"b"]))
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert seen == [(1, 1, [1])]


def test_removed_listeners_are_not_called(backend):
    log = backend()
    heard = []

    def listener(hw):
        heard.append(hw)

    log.add_listener(listener)
    log.append([b"a"])
    log.remove_listener(listener)
    log.append([b"b"])
    assert heard == [0]


def test_a_bound_method_listener_can_be_removed(backend):
    """``obj.method`` makes a new bound-method object on every attribute access, so the natural
    ``add_listener(self.on_commit)`` ... ``remove_listener(self.on_commit)`` passes two equal but
    distinct objects; removal must match by equality."""

    class Consumer:
        def __init__(self):
            self.heard = []

        def on_commit(self, hw):
            self.heard.append(hw)

    log = backend()
    consumer = Consumer()
    log.add_listener(consumer.on_commit)
    log.append([b"a"])
    log.remove_listener(consumer.on_commit)
    log.append([b"b"])
    assert consumer.heard == [0]


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_listeners_hear_appends_that_roll_a_segment(backend, policy):
    """Every advance of the high watermark is announced, including the append that finds the
    active segment full and rolls it."""
    log = backend(
        config=LogConfig(flush_policy=policy, segment_max_bytes=4096, flush_interval_s=60)
    )
    heard = []
    log.add_listener(heard.append)
    for _ in range(40):
        log.append([b"x" * 300])
    assert log.segment_count > 1
    assert heard == list(range(40))


def test_close_is_idempotent_and_a_context_manager_closes(backend):
    log = backend()
    with log:
        log.append([b"a"])
    log.close()
    with pytest.raises(LogClosed):
        log.append([b"b"])


AFTER_CLOSE = {
    "append": lambda log: log.append([b"x"]),
    "append empty": lambda log: log.append([]),
    "append_at": lambda log: log.append_at([b"x"], [100]),
    "forward read": lambda log: log.forward_reader(0).read(),
    "reverse read": lambda log: log.reverse_reader().read(),
    "roll": lambda log: log.roll(),
    "maintain": lambda log: log.maintain(),
    "enforce_retention": lambda log: log.enforce_retention(),
    "verify": lambda log: log.verify(),
    "offset_at_or_after_timestamp": lambda log: log.offset_at_or_after_timestamp(0),
    "offset_at_or_before_timestamp": lambda log: log.offset_at_or_before_timestamp(2**62),
}


@pytest.mark.parametrize("call", AFTER_CLOSE.values(), ids=AFTER_CLOSE.keys())
def test_calls_after_close_raise_log_closed(backend, call):
    log = backend()
    log.append([b"a", b"b"])
    log.close()
    with pytest.raises(LogClosed):
        call(log)


def test_offsets_stay_readable_after_close(backend):
    """``close`` releases the files, not the answers: the offset properties either keep their
    values or say the log is closed, never fail with an unrelated error."""
    log = backend()
    log.append([b"a", b"b"])
    before = (log.oldest_offset, log.newest_offset, log.next_offset, log.high_watermark)
    log.close()
    for name, value in zip(
        ("oldest_offset", "newest_offset", "next_offset", "high_watermark"), before, strict=True
    ):
        with contextlib.suppress(LogClosed):
            assert getattr(log, name) == value


def test_negative_offsets_are_out_of_range(backend):
    log = backend()
    with pytest.raises(OffsetOutOfRange):
        log.forward_reader(-1)
    with pytest.raises(OffsetOutOfRange):
        log.forward_reader(0, stop_offset=-1)
    with pytest.raises(OffsetOutOfRange):
        log.reverse_reader(-1)
    with pytest.raises(OffsetOutOfRange):
        log.reverse_reader(stop_offset=-1)


def test_swapped_bounds_give_an_empty_result_and_a_warning(backend):
    """STYLE.md habit 2 and ``TidelogWarning``'s docstring: swapped bounds give an empty result
    and a warning."""
    log = backend()
    log.append([NewRecord(str(i).encode()) for i in range(10)])
    with pytest.warns(TidelogWarning):
        forward = log.forward_reader(7, stop_offset=3)
    assert not forward.read() and forward.done
    with pytest.warns(TidelogWarning):
        reverse = log.reverse_reader(3, stop_offset=7)
    assert not reverse.read() and reverse.done
