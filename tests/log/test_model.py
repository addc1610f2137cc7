"""SegmentedLog against a plain list of records, over random operation sequences (hypothesis).

The model is the list of records the log must hold, oldest first. Appends (random sizes, keys,
headers, explicit and clock timestamps, gaps), forward and reverse reads with random bounds,
timestamp lookups, forced rolls, retention, close and reopen, and simulated crashes with torn
files all run against both; after each step the log must answer exactly what the model says.

A crash is simulated without any special API: the open log's directory is copied, one copied
file may be cut at a random byte, and the copy is opened. Which records must survive a cut is
computed from the format alone (record sizes, segment bases from the file names).
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from logtools import (
    HYPOTHESIS_PHASES,
    Expected,
    bases,
    crash_copy,
    layout,
    open_damaged,
    read_forward,
    read_reverse,
    segment_indexes,
    segment_logs,
    survivors_of_cut,
)

from tidelog.errors import MessageTooLarge
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog

MAX_MESSAGE = 1500

keys = st.none() | st.binary(max_size=12)
headers = st.dictionaries(st.text(max_size=6), st.binary(max_size=8), max_size=3)
values = st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=1200))
messages = st.builds(NewRecord, values, keys, headers)
batches = st.lists(st.one_of(values, messages), min_size=1, max_size=6)


class LogMachine(RuleBasedStateMachine):
    """One log directory per run; ``self.model`` is what it must hold."""

    def __init__(self, root: Path, crash_cuts: tuple[str, ...]) -> None:
        super().__init__()
        self.root = root
        self.crash_cuts = crash_cuts
        self.generation = itertools.count()
        self.now = 1_000_000
        self.model: list[Expected] = []
        self.next_offset = 0
        self.last_timestamp = 0
        self.log: SegmentedLog | None = None

    # -- plumbing ---------------------------------------------------------------------------------

    def clock(self) -> int:
        return self.now

    def open(self, directory: Path, damaged: bool = False) -> SegmentedLog:
        if damaged:
            return open_damaged(directory, self.config, clock=self.clock)
        return SegmentedLog(directory, self.config, clock=self.clock)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def store(self, offsets, batch, timestamp) -> None:
        stamp = max(timestamp, self.last_timestamp)
        for offset, m in zip(offsets, batch, strict=True):
            m = m if isinstance(m, NewRecord) else NewRecord(m)
            self.model.append(Expected(offset, stamp, m.value, m.key, tuple(m.headers.items())))
        self.last_timestamp = stamp
        self.next_offset = offsets[-1] + 1

    def after_reopen(self) -> None:
        """What a reopened log knows: its newest stored timestamp (0 when it holds nothing)."""
        self.last_timestamp = max((r.timestamp for r in self.model), default=0)

    def check_everything(self) -> None:
        assert read_forward(self.log) == self.model
        assert read_reverse(self.log) == self.model[::-1]
        assert self.log.verify() == len(self.model)

    # -- rules ------------------------------------------------------------------------------------

    @initialize(
        retention_messages=st.none() | st.integers(0, 60),
        retention_bytes=st.none() | st.integers(0, 20_000),
        retention_age_ns=st.none() | st.integers(1, 5_000),
        segment_age_ns=st.none() | st.integers(200, 5_000),
    )
    def start(self, retention_messages, retention_bytes, retention_age_ns, segment_age_ns) -> None:
        self.root.mkdir(parents=True)
        self.config = LogConfig(
            segment_max_bytes=4096,
            segment_max_age_s=3600.0 if segment_age_ns is None else segment_age_ns / 1e9,
            max_message_bytes=MAX_MESSAGE,
            index_preallocate_bytes=1280,
            flush_policy=FlushPolicy.NEVER,
            retention_messages=retention_messages,
            retention_bytes=retention_bytes,
            retention_age_s=None if retention_age_ns is None else retention_age_ns / 1e9,
        )
        self.log = self.open(self.root / f"g{next(self.generation)}")

    @rule(
        appends=st.lists(
            st.tuples(batches, st.integers(0, 300), st.none() | st.integers(0, 2_000_000)),
            min_size=1,
            max_size=4,
        )
    )
    def append(self, appends) -> None:
        for batch, step, explicit in appends:
            self.now += step
            timestamp = self.now if explicit is None else explicit
            offsets = self.log.append(batch, timestamp=explicit)
            assert offsets == range(self.next_offset, self.next_offset + len(batch))
            self.store(list(offsets), batch, timestamp)

    @rule(batch=batches, gap=st.integers(1, 40), spread=st.integers(1, 3))
    def append_with_gaps(self, batch, gap, spread) -> None:
        self.now += 10
        offsets = [self.next_offset + gap + i * spread for i in range(len(batch))]
        self.log.append_at(batch, offsets)
        self.store(offsets, batch, self.now)

    @rule(
        batch=batches, big=st.integers(MAX_MESSAGE + 1, MAX_MESSAGE + 100), where=st.integers(0, 5)
    )
    def append_too_large(self, batch, big, where) -> None:
        batch = list(batch)
        batch.insert(min(where, len(batch)), b"x" * big)
        with pytest.raises(MessageTooLarge):
            self.log.append(batch)
        assert self.log.next_offset == self.next_offset

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(data=st.data())
    def forward_read(self, data) -> None:
        top = self.next_offset + 3
        start = data.draw(st.integers(0, top), label="start")
        stop = data.draw(st.none() | st.integers(start, top), label="stop_offset")
        stop_ts = data.draw(st.none() | st.integers(0, self.now + 10), label="stop_timestamp")
        max_messages = data.draw(st.integers(1, 30), label="max_messages")
        max_bytes = data.draw(st.integers(1, 5000), label="max_bytes")
        got = read_forward(
            self.log,
            start,
            stop_offset=stop,
            stop_timestamp=stop_ts,
            max_messages=max_messages,
            max_bytes=max_bytes,
        )
        assert got == [
            r
            for r in self.model
            if r.offset >= start
            and (stop is None or r.offset <= stop)
            and (stop_ts is None or r.timestamp <= stop_ts)
        ]

    @rule(data=st.data())
    def reverse_read(self, data) -> None:
        top = self.next_offset + 3
        start = data.draw(st.none() | st.integers(0, top), label="start")
        stop = data.draw(st.none() | st.integers(0, top if start is None else start), label="stop")
        stop_ts = data.draw(st.none() | st.integers(0, self.now + 10), label="stop_timestamp")
        max_messages = data.draw(st.integers(1, 30), label="max_messages")
        max_bytes = data.draw(st.integers(1, 5000), label="max_bytes")
        got = read_reverse(
            self.log,
            start,
            stop_offset=stop,
            stop_timestamp=stop_ts,
            max_messages=max_messages,
            max_bytes=max_bytes,
        )
        wanted = [
            r
            for r in reversed(self.model)
            if (start is None or r.offset <= start)
            and (stop is None or r.offset >= stop)
            and (stop_ts is None or r.timestamp >= stop_ts)
        ]
        assert got == wanted
        # The same range read forward, reversed, is the same thing.
        low = 0 if stop is None else stop
        forward = read_forward(self.log, low, stop_offset=start)
        assert [r for r in forward if stop_ts is None or r.timestamp >= stop_ts][::-1] == wanted

    @rule(data=st.data())
    def timestamp_lookups(self, data) -> None:
        ts = data.draw(st.integers(0, self.now + 10), label="timestamp")
        after = next((r.offset for r in self.model if r.timestamp >= ts), None)
        before = next((r.offset for r in reversed(self.model) if r.timestamp <= ts), None)
        assert self.log.offset_at_or_after_timestamp(ts) == after
        assert self.log.offset_at_or_before_timestamp(ts) == before

    @rule(advance=st.integers(0, 10_000), maintain=st.booleans())
    def retention(self, advance, maintain) -> None:
        config = self.config
        count_before = self.log.message_count
        size_before = self.log.size_bytes
        segments_before = bases(self.log.directory)
        now = self.now + advance
        if maintain:  # may roll an over-age active segment first, which may then expire
            deleted = self.log.maintain(now_ns=now)
        else:
            deleted = self.log.enforce_retention(now_ns=now)
        # The model drops what the log dropped; the checks below say it was allowed to.
        oldest = self.log.oldest_offset
        dropped = [r for r in self.model if r.offset < oldest]
        self.model = [r for r in self.model if r.offset >= oldest]
        assert self.log.message_count == len(self.model) == count_before - len(dropped)
        # Whole segments, oldest first: exactly the segments whose bases are below the new oldest.
        assert deleted == segments_before[: len(deleted)]
        assert not set(deleted) & set(bases(self.log.directory))  # their files are gone
        if not maintain:  # never the active segment
            assert segments_before[-1] not in deleted
        limits = {
            "messages": config.retention_messages,
            "bytes": config.retention_bytes,
            "age": config.retention_age_s,
        }
        active_limits = [name for name, value in limits.items() if value is not None]
        if not active_limits:
            assert dropped == [] and deleted == []
        elif active_limits == ["messages"] and dropped:
            assert len(self.model) >= min(config.retention_messages, count_before)
        elif active_limits == ["bytes"] and dropped:
            assert self.log.size_bytes >= min(config.retention_bytes, size_before)
        self.check_everything()

    @rule(data=st.data())
    def truncate(self, data) -> None:
        """A replica's cut (``truncate_to``): everything from the cut on goes, whichever
        segment it falls in; appends continue from there."""
        oldest = self.model[0].offset if self.model else self.log.next_offset
        cut = data.draw(st.integers(oldest, self.next_offset + 2), label="cut at offset")
        self.log.truncate_to(cut)
        self.model = [r for r in self.model if r.offset < cut]
        if cut < self.next_offset:
            kept_end = self.model[-1].offset + 1 if self.model else 0
            assert kept_end <= self.log.next_offset <= cut  # a cut in a gap ends at the record
            self.next_offset = self.log.next_offset
        self.after_reopen()
        self.check_everything()

    @rule()
    def reopen(self) -> None:
        directory = self.log.directory
        self.log.close()
        self.log = self.open(directory)
        assert self.log.recovery_report.clean
        self.after_reopen()
        assert self.log.next_offset == self.next_offset
        self.check_everything()

    @rule(data=st.data())
    def crash(self, data) -> None:
        copy = crash_copy(self.log, self.root / f"g{next(self.generation)}")
        self.log.close()
        shutil.rmtree(self.log.directory)
        kind = data.draw(st.sampled_from(("none", *self.crash_cuts)), label="cut")
        segments = bases(copy)
        survivors = list(self.model)
        lost_from = None
        if kind != "none":
            if kind == "newest log":
                victim = segment_logs(copy)[-1]
            elif kind == "sealed log":  # any but the newest (the other variant covers that)
                logs = segment_logs(copy)
                victim = data.draw(st.sampled_from(logs[:-1] or logs), label="log file")
            else:
                victim = data.draw(st.sampled_from(segment_indexes(copy)), label="index file")
            size = victim.stat().st_size
            boundaries = [0, size]
            if victim.suffix == ".log":  # record boundaries: a tear there leaves no partial record
                placed = layout(self.model, segments).get(int(victim.stem), [])
                boundaries += [at for _, at in placed]
            cut = data.draw(
                st.sampled_from(sorted(set(boundaries))) | st.integers(0, size), label="cut at"
            )
            os.truncate(victim, cut)
            if victim.suffix == ".log":
                survivors = survivors_of_cut(self.model, segments, int(victim.stem), cut)
                lost = [r for r in self.model if r not in survivors]
                lost_from = lost[0].offset if lost else None

        self.log = self.open(copy, damaged=True)
        assert read_forward(self.log) == survivors
        self.model = survivors
        self.after_reopen()
        # Offsets continue right after the last surviving record (no reuse, no jump past what
        # was lost; only a gap left by append_at may remain below the next offset).
        if lost_from is None:
            assert self.log.next_offset == self.next_offset
        else:
            assert (
                (survivors[-1].offset + 1 if survivors else 0) <= self.log.next_offset <= lost_from
            )
        self.next_offset = self.log.next_offset
        self.check_everything()
        self.now += 1
        offsets = self.log.append([b"after crash", NewRecord(b"2", key=b"k")])
        assert offsets == range(self.next_offset, self.next_offset + 2)
        self.store(list(offsets), [b"after crash", NewRecord(b"2", key=b"k")], self.now)
        self.check_everything()

    @invariant()
    def offsets_agree(self) -> None:
        if self.log is None:
            return
        oldest = self.model[0].offset if self.model else self.log.next_offset
        assert self.log.next_offset == self.next_offset
        assert self.log.newest_offset == self.next_offset - 1
        assert self.log.high_watermark == self.next_offset - 1
        assert self.log.oldest_offset == oldest
        assert self.log.message_count == len(self.model)

    @precondition(lambda self: self.log is not None and len(self.model) > 0)
    @rule(data=st.data())
    def read_one_record_anywhere(self, data) -> None:
        record = data.draw(st.sampled_from(self.model), label="record")
        assert read_forward(self.log, record.offset, stop_offset=record.offset) == [record]
        assert read_reverse(self.log, record.offset, stop_offset=record.offset) == [record]


CRASH_CUTS = {
    "newest log or an index": ("newest log", "index"),
    "a sealed segment's log": ("sealed log",),
}

SETTINGS = settings(
    max_examples=60,
    phases=HYPOTHESIS_PHASES,
    print_blob=True,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("cuts", CRASH_CUTS.values(), ids=CRASH_CUTS.keys())
def test_segmented_log_matches_the_list_model(tmp_path, cuts):
    runs = itertools.count()
    run_state_machine_as_test(
        lambda: LogMachine(tmp_path / f"run{next(runs)}", cuts), settings=SETTINGS
    )
