"""Flush policies (when the high watermark moves, group commit) and the background Flusher."""

from __future__ import annotations

import os
import threading
import time

import pytest
from logtools import read_forward

from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.flush import Flusher
from tidelog.log.recovery import read_recovery_point

WAIT = 10.0  # generous bound for events that should happen within milliseconds


def wait_until(predicate, timeout=WAIT):
    """Poll ``predicate`` until it holds or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := predicate()) and time.monotonic() < deadline:
        time.sleep(0.001)
    return ok


class CountingSync:
    """Replaces ``os.fdatasync``: counts calls and can hold the first one at a gate."""

    def __init__(self, gate_first=None):
        self.real = os.fdatasync
        self.calls = 0
        self.lock = threading.Lock()
        self.entered = threading.Event()
        self.gate_first = gate_first

    def __call__(self, fd):
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        self.entered.set()
        if first and self.gate_first is not None:
            self.gate_first()
        self.real(fd)


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_every_policy_commits_an_append_before_it_returns(make_log, policy):
    log = make_log(config=LogConfig(flush_policy=policy, flush_interval_s=60))
    heard = []
    log.add_listener(heard.append)
    assert log.high_watermark == -1
    assert log.append([b"a", b"b"]) == range(0, 2)
    assert log.high_watermark == 1 == log.newest_offset
    assert log.wait_for_offset(1, timeout=0)
    assert heard == [1]
    assert [r.value for r in read_forward(log)] == [b"a", b"b"]


def test_never_does_not_sync_on_append_only_on_roll_and_close(make_log, monkeypatch):
    sync = CountingSync()
    monkeypatch.setattr(os, "fdatasync", sync)
    log = make_log(config=LogConfig(flush_policy=FlushPolicy.NEVER))
    for _ in range(5):
        log.append([b"x"])
    assert sync.calls == 0
    log.roll()
    after_roll = sync.calls
    assert after_roll >= 1
    log.append([b"y"])
    assert sync.calls == after_roll
    log.close()
    assert sync.calls > after_roll


def test_always_commits_only_after_the_sync(make_log, monkeypatch):
    release = threading.Event()
    sync = CountingSync(gate_first=lambda: release.wait(WAIT))
    monkeypatch.setattr(os, "fdatasync", sync)
    log = make_log(config=LogConfig(flush_policy=FlushPolicy.ALWAYS))
    heard = []
    log.add_listener(heard.append)
    result = []
    appender = threading.Thread(target=lambda: result.append(log.append([b"a"], timestamp=5)))
    appender.start()
    try:
        assert sync.entered.wait(WAIT)
        # Written, not yet synced: nothing of it is visible to readers or lookups.
        assert (log.newest_offset, log.high_watermark) == (0, -1)
        assert read_forward(log) == []
        assert log.reverse_reader().read().offsets.tolist() == []
        assert log.offset_at_or_after_timestamp(0) is None
        assert log.offset_at_or_before_timestamp(10) is None
        assert not log.wait_for_offset(0, timeout=0.01)
        assert heard == [] and result == []
    finally:
        release.set()
        appender.join(WAIT)
    assert result == [range(0, 1)]
    assert log.high_watermark == 0 and heard == [0]
    assert log.offset_at_or_after_timestamp(0) == 0


def test_always_group_commit_shares_one_sync_among_waiting_appenders(make_log, monkeypatch):
    appenders = 8
    log = make_log(config=LogConfig(flush_policy=FlushPolicy.ALWAYS))
    # Hold the first sync until every appender has written its batch: one more sync must then
    # cover them all, however the threads are scheduled.
    sync = CountingSync(gate_first=lambda: wait_until(lambda: log.next_offset == 2 * appenders))
    monkeypatch.setattr(os, "fdatasync", sync)
    heard = []
    log.add_listener(heard.append)
    barrier = threading.Barrier(appenders)
    results = {}

    def append(n):
        barrier.wait(WAIT)
        results[n] = log.append([f"{n}-a".encode(), f"{n}-b".encode()])

    threads = [threading.Thread(target=append, args=(n,)) for n in range(appenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)

    assert sync.calls <= 2
    assert sorted(o for r in results.values() for o in r) == list(range(2 * appenders))
    assert log.high_watermark == 2 * appenders - 1
    values = {r.offset: r.value for r in read_forward(log)}
    for n, offsets in results.items():
        assert [values[o] for o in offsets] == [f"{n}-a".encode(), f"{n}-b".encode()]
    assert heard == sorted(set(heard)) and heard[-1] == 2 * appenders - 1


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_concurrent_appenders_get_dense_offsets_and_all_data_is_readable(make_log, policy):
    threads_n, appends_each = 4, 40
    log = make_log(
        config=LogConfig(flush_policy=policy, segment_max_bytes=4096, flush_interval_s=0.01)
    )
    results: dict[int, list[range]] = {n: [] for n in range(threads_n)}

    def append(n):
        for i in range(appends_each):
            batch = [f"{n}:{i}:{j}".encode() * (1 + i % 5) for j in range(1 + i % 3)]
            results[n].append(log.append(batch))

    threads = [threading.Thread(target=append, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)

    total = sum(1 + i % 3 for i in range(appends_each)) * threads_n
    offsets = sorted(o for ranges in results.values() for r in ranges for o in r)
    assert offsets == list(range(total))
    assert log.high_watermark == total - 1
    records = {r.offset: r.value for r in read_forward(log)}
    assert len(records) == total
    for n, ranges in results.items():
        assert [r.start for r in ranges] == sorted(r.start for r in ranges)  # each thread in order
        for i, r in enumerate(ranges):
            expected = [f"{n}:{i}:{j}".encode() * (1 + i % 5) for j in range(1 + i % 3)]
            assert [records[o] for o in r] == expected
    assert log.verify() == total


# -- INTERVAL and the background flusher ---------------------------------------------------------


class RecordingFlusher:
    def __init__(self):
        self.events = []

    def register(self, target, interval_s):
        self.events.append(("register", target, interval_s))

    def unregister(self, target):
        self.events.append(("unregister", target))


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_only_interval_logs_register_with_the_flusher(make_log, policy):
    flusher = RecordingFlusher()
    log = make_log(config=LogConfig(flush_policy=policy, flush_interval_s=0.25), flusher=flusher)
    if policy is FlushPolicy.INTERVAL:
        assert flusher.events == [("register", log, 0.25)]
    else:
        assert [e for e in flusher.events if e[0] == "register"] == []
    log.close()
    if policy is FlushPolicy.INTERVAL:
        assert flusher.events[-1] == ("unregister", log)


def test_interval_syncs_appended_data_in_the_background(make_log, monkeypatch):
    sync = CountingSync()
    monkeypatch.setattr(os, "fdatasync", sync)
    flusher = Flusher()
    log = make_log(
        config=LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_s=0.01),
        flusher=flusher,
    )
    log.append([b"a"])
    assert log.high_watermark == 0  # committed at once: in the OS, safe from a process crash
    assert sync.entered.wait(WAIT)


class CountingTarget:
    def __init__(self, fail=False):
        self.flushes = 0
        self.fail = fail

    def flush(self):
        self.flushes += 1
        if self.fail:
            raise OSError("disk full")


def test_flusher_flushes_each_target_on_its_own_interval():
    flusher = Flusher()
    fast, slow = CountingTarget(), CountingTarget()
    flusher.register(fast, 0.005)
    flusher.register(slow, 0.02)
    try:
        assert wait_until(lambda: fast.flushes >= 3 and slow.flushes >= 2)
    finally:
        flusher.unregister(fast)
        flusher.unregister(slow)


def test_a_failing_target_does_not_stop_the_others(caplog):
    flusher = Flusher()
    broken, healthy = CountingTarget(fail=True), CountingTarget()
    flusher.register(broken, 0.005)
    flusher.register(healthy, 0.005)
    try:
        assert wait_until(lambda: broken.flushes >= 2 and healthy.flushes >= 2)
    finally:
        flusher.unregister(broken)
        flusher.unregister(healthy)
    assert "background flush failed" in caplog.text


def test_unregistered_targets_are_no_longer_flushed():
    flusher = Flusher()
    gone, staying = CountingTarget(), CountingTarget()
    flusher.register(gone, 0.005)
    flusher.register(staying, 0.005)
    try:
        assert wait_until(lambda: gone.flushes >= 1)
        flusher.unregister(gone)
        at_unregister = gone.flushes
        seen = staying.flushes
        assert wait_until(lambda: staying.flushes >= seen + 3)
        # At most one flush already in flight when unregister returned may still land.
        assert gone.flushes <= at_unregister + 1
    finally:
        flusher.unregister(staying)


def test_a_flusher_serves_new_targets_after_going_idle():
    flusher = Flusher()
    first = CountingTarget()
    flusher.register(first, 0.005)
    assert wait_until(lambda: first.flushes >= 1)
    flusher.unregister(first)
    second = CountingTarget()
    flusher.register(second, 0.005)
    try:
        assert wait_until(lambda: second.flushes >= 2)
    finally:
        flusher.unregister(second)


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_an_append_that_rolls_syncs_the_sealed_segment_under_every_policy(
    make_log, monkeypatch, policy
):
    """docs/operations.md: "Sealed segments are synced on roll under every policy", and the
    recovery point then covers them, so recovery after a crash need not re-check them."""
    sync = CountingSync()
    monkeypatch.setattr(os, "fdatasync", sync)
    log = make_log(
        config=LogConfig(flush_policy=policy, segment_max_bytes=4096, flush_interval_s=60)
    )
    log.append([b"x" * 2000])
    log.append([b"y" * 2000])
    calls_before_roll = sync.calls
    assert log.segment_count == 1 and read_recovery_point(log.directory) == -1
    log.append([b"z" * 2000])  # does not fit: seals offsets 0-1 and starts a new segment
    assert log.segment_count == 2
    assert sync.calls > calls_before_roll
    assert read_recovery_point(log.directory) == 1


def test_a_roll_syncs_the_sealed_segments_index_too(make_log, monkeypatch):
    """The recovery point written after a roll vouches for the sealed index (recovery then trusts
    it with an O(1) check), so that index must be on disk, not only its records."""
    log = make_log(config=LogConfig(flush_policy=FlushPolicy.NEVER, segment_max_bytes=4096))
    log.append([b"a" * 3000])
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log.append([b"b" * 3000])  # rolls; the sealed segment is synced
    assert any(p.endswith("00000000000000000000.index") for p in synced), synced
