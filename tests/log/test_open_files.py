"""Open files are bounded by the file cache, not by how many logs and segments there are.

The heavy test runs in a subprocess with a low ``RLIMIT_NOFILE`` (the test process keeps its own
limit): 20 logs of 100 segments (2,000 segments, 4,000 files) under a limit of 256 descriptors,
written, read both ways, compacted, trimmed by retention, closed and reopened.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from logtools import read_forward, read_reverse

from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.filecache import FileCache

CONFIG = LogConfig(
    segment_max_bytes=4096, flush_policy=FlushPolicy.NEVER, index_preallocate_bytes=1280
)

SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    from pathlib import Path
    from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog

    root, phase = Path(sys.argv[1]), sys.argv[2]
    LOGS, SEGMENTS, LIMIT, CAPACITY = 20, 100, 256, 128
    config = LogConfig(
        segment_max_bytes=4096, flush_policy=FlushPolicy.NEVER, index_preallocate_bytes=1280,
        retention_age_s=None,
    )
    kwargs = {}
    try:
        from tidelog.log.filecache import DEFAULT_FILE_CACHE
        DEFAULT_FILE_CACHE.set_capacity(CAPACITY)
        kwargs["lock_directory"] = False
    except ImportError:
        pass

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def value(log, n):
        return b"%d-%d-" % (log, n) + b"x" * 2500

    if phase == "limited":
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    baseline = fds()
    logs = [SegmentedLog(root / f"log-{i}", config, **kwargs) for i in range(LOGS)]
    if phase == "write":  # one 2,500-byte record per 4 KiB segment
        for n in range(SEGMENTS):
            for i, log in enumerate(logs):
                key = b"k" if n % 2 else None
                log.append([NewRecord(value(i, n), key=key)])
        for log in logs:
            log.close()
        print("written")
        sys.exit(0)
    peak = 0
    assert sum(log.segment_count for log in logs) >= LOGS * SEGMENTS
    for i, log in enumerate(logs):
        forward = [r.value for b in log.forward_reader(0) for r in b.records()]
        assert forward == [value(i, n) for n in range(SEGMENTS)], (i, len(forward))
        backward = [r.value for b in log.reverse_reader() for r in b.records()]
        assert backward == forward[::-1]
        peak = max(peak, fds())
    for n in range(SEGMENTS, SEGMENTS + 5):
        for i, log in enumerate(logs):
            assert log.append([value(i, n)])[0] == n
            peak = max(peak, fds())
    for log in logs:
        log.flush()
        report = log.compact()
        assert report.records_removed == SEGMENTS // 2 - 1, report
        peak = max(peak, fds())
    for i, log in enumerate(logs):
        assert log.offset_at_or_before_timestamp(2**62) == SEGMENTS + 4
        log.config = LogConfig(**{**{f: getattr(config, f) for f in config.__slots__},
                                  "retention_messages": 10})
        assert log.enforce_retention()
        assert log.oldest_offset > 0
        peak = max(peak, fds())
    for log in logs:
        log.close()
    logs = [SegmentedLog(root / f"log-{i}", config, **kwargs) for i in range(LOGS)]
    for i, log in enumerate(logs):
        newest = [r.value for r, _ in zip(log.reverse_reader().records(), range(3))]
        assert newest == [value(i, n) for n in (SEGMENTS + 4, SEGMENTS + 3, SEGMENTS + 2)]
        log.verify()
        peak = max(peak, fds())
    for log in logs:
        log.close()
    print("ok", baseline, peak)
    """
)


def run(root, phase):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), phase],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_thousands_of_segments_under_a_low_descriptor_limit(tmp_path):
    written = run(tmp_path, "write")
    assert written.stdout.strip() == "written", written.stderr[-3000:]
    done = run(tmp_path, "limited")
    assert done.returncode == 0, done.stderr[-3000:]
    _, baseline, peak = done.stdout.split()
    assert int(peak) <= int(baseline) + 128 + 8  # the cache's capacity plus a few


def test_the_cache_keeps_at_most_its_capacity_open(make_log):
    cache = FileCache(9)
    logs = [make_log(f"log-{i}", CONFIG, file_cache=cache) for i in range(4)]
    for n in range(12):
        for log in logs:
            log.append([b"%d" % n + b"v" * 3000])
            assert cache.descriptors <= 9
    for log in logs:
        assert [r.value[:2] for r in read_forward(log)][:2] == [b"0v", b"1v"]
        assert len(read_reverse(log)) == 12
        assert cache.descriptors <= 9
    assert cache.opened > 4 * 12  # segments were closed and reopened on demand


def test_a_segment_evicted_before_its_sync_is_still_synced(make_log, monkeypatch):
    cache = FileCache(3)  # one active segment
    first = make_log("first", CONFIG, file_cache=cache)
    second = make_log("second", CONFIG, file_cache=cache)
    first.append([b"a" * 100])
    second.append([b"b" * 100])  # evicts the first log's active segment
    assert not first._local.active.is_open
    synced: list[str] = []
    from tidelog import durable

    real = durable.sync_fd
    monkeypatch.setattr(
        durable,
        "sync_fd",
        lambda fd, call, path: (synced.append(str(path)), real(fd, call, path=path)),
    )
    first.flush()
    assert any("first" in p for p in synced)


def test_a_pinned_segment_is_never_closed_under_its_reader(make_log):
    """Readers of one log and writers of others race for a cache of two; every read sees whole,
    verified records (a closed descriptor would raise or return garbage)."""
    cache = FileCache(6)
    logs = [make_log(f"log-{i}", CONFIG, file_cache=cache) for i in range(4)]
    for log in logs:
        for n in range(20):
            log.append([b"%d-" % n + b"r" * 2000])
    errors: list[BaseException] = []

    def reader(log: SegmentedLog) -> None:
        try:
            for _ in range(15):
                assert len(read_forward(log)) >= 20
                assert len(read_reverse(log)) >= 20
        except BaseException as error:
            errors.append(error)

    def writer(log: SegmentedLog) -> None:
        try:
            for n in range(100):
                log.append([b"w%d" % n + b"w" * 2000])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=reader, args=(logs[i],)) for i in (0, 1)]
    threads += [threading.Thread(target=writer, args=(logs[i],)) for i in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert all(log.verify() >= 20 for log in logs)


def test_without_the_directory_lock_a_log_holds_no_descriptor_while_idle(make_log):
    cache = FileCache(8)
    log = make_log("idle", CONFIG, file_cache=cache, lock_directory=False)
    log.append([b"x"])
    log._local.active.close()
    assert len(cache) == 0
    assert [r.value for r in read_forward(log)] == [b"x"]
    assert NewRecord  # the import is used by the subprocess script's twin above


class FakeSegment:
    """What the cache sees of a segment: counts its opens and closes."""

    def __init__(self) -> None:
        self.pins = 0
        self.is_open = False
        self.descriptors = 0
        self.opened = self.closed = 0

    def open_files(self) -> None:
        assert not self.is_open, "opened twice"
        self.is_open, self.descriptors = True, 2
        self.opened += 1

    def close_files(self) -> None:
        self.is_open = False
        self.closed += 1


def test_a_segment_discarded_while_pinned_is_reopened_for_its_next_user():
    """A discard (an index rebuilt, a close) while another thread uses the segment closes it when
    that user unpins; a pin in between waits for that and then opens fresh files."""
    cache = FileCache(10)
    segment = FakeSegment()
    cache.pin(segment)  # a sync holds it
    cache.discard(segment)
    assert segment.is_open and not segment.closed  # not under its user
    pinned = threading.Event()

    def reader() -> None:
        cache.pin(segment)
        pinned.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert not pinned.wait(0.2), "pinned the discarded files"
    cache.unpin(segment)  # the sync ends: closed, and the reader's pin reopens
    thread.join(5)
    assert pinned.is_set()
    assert (segment.opened, segment.closed, segment.pins, segment.is_open) == (2, 1, 1, True)
    assert len(cache) == 1 and cache.descriptors == 2
    cache.unpin(segment)
    cache.discard(segment)
    assert (segment.closed, segment.pins, len(cache), cache.descriptors) == (2, 0, 0, 0)
