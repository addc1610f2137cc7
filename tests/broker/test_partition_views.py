"""Materialised views of one partition (``PartitionView``) against plain models of the log.

A table must equal "the latest non-empty value per key", a window index must equal "every keyed
record, by key and timestamp", in both directions and for any bounds; reopening, replaying after
a crash, retention and a log cut behind the view's checkpoint must all end in that same state.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.partition_view import (
    CHECKPOINT_FILE,
    PartitionView,
    ViewEntry,
    ViewKind,
    ViewSpec,
    window_start,
)
from tidelog.errors import InvalidArgument
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog

MS = 1_000_000
TABLE = ViewSpec("t", ViewKind.TABLE)
WINDOWS = ViewSpec("w", ViewKind.WINDOW, window_size_ms=10)

Row = tuple[bytes | None, bytes, int]
"""(key, value, timestamp in ms) as appended."""


def open_log(directory: Path, **config: object) -> SegmentedLog:
    settings_ = {"flush_policy": FlushPolicy.NEVER, "retention_age_s": None}
    settings_.update(config)
    return SegmentedLog(directory, LogConfig(**settings_))  # type: ignore[arg-type]


def append(log: SegmentedLog, rows: list[Row]) -> None:
    for key, value, millis in rows:
        log.append([NewRecord(value, key=key)], timestamp=millis * MS)


def table_model(log_rows: list[tuple[int, Row]]) -> dict[bytes, tuple[int, bytes]]:
    """key -> (offset, value) of the latest keyed record, empty values deleting the key."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for offset, (key, value, _millis) in log_rows:
        if key is None:
            continue
        if value:
            latest[key] = (offset, value)
        else:
            latest.pop(key, None)
    return latest


def numbered(rows: list[Row], first: int = 0) -> list[tuple[int, Row]]:
    return list(enumerate(rows, start=first))


def window_model(
    log_rows: list[tuple[int, Row]], key: bytes, time_from: int | None, time_to: int | None
) -> list[int]:
    """Offsets of ``key``'s records with timestamps in the bounds, oldest first."""
    return [
        offset
        for offset, (k, _value, millis) in log_rows
        if k == key
        and (time_from is None or millis >= time_from)
        and (time_to is None or millis <= time_to)
    ]


@pytest.fixture
def log(tmp_path: Path) -> SegmentedLog:
    opened = open_log(tmp_path / "log")
    yield opened  # type: ignore[misc]
    opened.close()


def test_table_holds_the_latest_value_per_key_and_deletes_on_empty_values(
    tmp_path: Path, log: SegmentedLog
) -> None:
    rows: list[Row] = [
        (b"a", b"1", 1),
        (b"b", b"1", 2),
        (None, b"keyless", 3),
        (b"a", b"2", 4),
        (b"c", b"1", 5),
        (b"b", b"", 6),  # tombstone
        (b"", b"empty key", 7),
    ]
    append(log, rows)
    view = PartitionView(TABLE, 0, tmp_path / "view")
    assert view.catch_up(log) == len(rows)
    assert view.applied == len(rows)
    model = table_model(numbered(rows))
    assert {e.key: (e.offset, e.value) for e in view.entries()} == model
    found = view.get(b"a")
    assert found == ViewEntry(b"a", b"2", 0, 3, 4 * MS)
    assert view.get(b"b") is None
    assert [e.key for e in view.range(None, None, False, 10)] == [b"", b"a", b"c"]
    assert [e.key for e in view.range(None, None, True, 10)] == [b"c", b"a", b""]
    assert [e.key for e in view.range(b"a", b"b", True, 10)] == [b"a"]
    assert [e.key for e in view.range(None, None, True, 2)] == [b"c", b"a"]
    view.close()


def test_catch_up_applies_only_new_records(tmp_path: Path, log: SegmentedLog) -> None:
    view = PartitionView(TABLE, 0, tmp_path / "view")
    assert view.catch_up(log) == 0  # empty log
    append(log, [(b"k", b"1", 1)])
    assert view.catch_up(log) == 1
    assert view.catch_up(log) == 0
    append(log, [(b"k", b"2", 2), (b"j", b"1", 3)])
    assert view.catch_up(log) == 2
    assert view.get(b"k") is not None and view.get(b"k").value == b"2"  # type: ignore[union-attr]
    view.close()


def test_window_fetch_both_ways_including_records_sharing_a_window(
    tmp_path: Path, log: SegmentedLog
) -> None:
    # Window size 10 ms: offsets 0-2 share window 0, 3-4 share window 10 (with another key).
    rows: list[Row] = [
        (b"k", b"a", 1),
        (b"k", b"b", 1),
        (b"k", b"c", 9),
        (b"x", b"other", 12),
        (b"k", b"d", 12),
        (b"k", b"e", 25),
        (None, b"keyless", 26),
    ]
    append(log, rows)
    view = PartitionView(WINDOWS, 0, tmp_path / "view")
    view.catch_up(log)
    forward = view.window_fetch(b"k", None, None, False, 100)
    assert [e.value for e in forward] == [b"a", b"b", b"c", b"d", b"e"]
    assert [e.window_start_ms for e in forward] == [0, 0, 0, 10, 20]
    backward = view.window_fetch(b"k", None, None, True, 100)
    assert backward == forward[::-1]
    # Bounds apply to each record's own timestamp, not only its window.
    assert [e.value for e in view.window_fetch(b"k", 5, 12, False, 100)] == [b"c", b"d"]
    assert [e.value for e in view.window_fetch(b"k", 5, 12, True, 100)] == [b"d", b"c"]
    # The query of KIP-617: the last 2 values of k in [0, 20].
    assert [e.value for e in view.window_fetch(b"k", 0, 20, True, 2)] == [b"d", b"c"]
    assert view.window_fetch(b"missing", None, None, True, 10) == []
    view.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    gaps=st.lists(st.integers(0, 7), min_size=1, max_size=60),
    keys=st.lists(st.sampled_from([b"a", b"b", b"ab", b""]), min_size=60, max_size=60),
    bounds=st.tuples(st.none() | st.integers(-5, 250), st.none() | st.integers(-5, 250)),
    limit=st.integers(1, 70),
)
def test_window_backward_is_the_reversed_forward_and_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory,
    gaps: list[int],
    keys: list[bytes],
    bounds: tuple[int | None, int | None],
    limit: int,
) -> None:
    directory = tmp_path_factory.mktemp("windows")
    log = open_log(directory / "log")
    millis, rows = 0, []
    for gap, key in zip(gaps, keys, strict=False):
        millis += gap  # timestamps never decrease, and often repeat
        rows.append((key, f"v{len(rows)}".encode(), millis))
    append(log, rows)
    view = PartitionView(ViewSpec("w", ViewKind.WINDOW, window_size_ms=7), 0, directory / "view")
    view.catch_up(log)
    time_from, time_to = bounds
    try:
        for key in (b"a", b"b", b"ab", b""):
            if time_from is not None and time_to is not None and time_from > time_to:
                continue
            expected = window_model(numbered(rows), key, time_from, time_to)
            forward = view.window_fetch(key, time_from, time_to, False, 1000)
            backward = view.window_fetch(key, time_from, time_to, True, 1000)
            assert [e.offset for e in forward] == expected
            assert backward == forward[::-1]
            assert view.window_fetch(key, time_from, time_to, True, limit) == backward[:limit]
            for entry in forward:
                assert entry.window_start_ms == window_start(entry.timestamp_ns, 7)
    finally:
        view.close()
        log.close()


def test_reopen_keeps_the_view_and_continues_from_the_checkpoint(
    tmp_path: Path, log: SegmentedLog
) -> None:
    append(log, [(b"k", b"1", 1), (b"j", b"1", 2)])
    view = PartitionView(WINDOWS, 0, tmp_path / "view")
    view.catch_up(log)
    before = view.entries()
    view.close()
    assert json.loads((tmp_path / "view" / CHECKPOINT_FILE).read_text())["applied"] == 2
    append(log, [(b"k", b"2", 3)])
    again = PartitionView(WINDOWS, 0, tmp_path / "view")
    assert again.applied == 2
    assert again.entries() == before
    assert again.catch_up(log) == 1
    assert [e.value for e in again.window_fetch(b"k", None, None, False, 10)] == [b"1", b"2"]
    again.close()


@pytest.mark.parametrize("spec", [TABLE, WINDOWS], ids=["table", "window"])
def test_replay_after_a_crash_behind_the_checkpoint_applies_nothing_twice(
    tmp_path: Path, log: SegmentedLog, spec: ViewSpec
) -> None:
    """A crash leaves the store ahead of its checkpoint (the store is flushed first, the
    checkpoint written after): replaying from the checkpoint must not duplicate anything."""
    rows = [(b"k" if i % 3 else b"j", f"v{i}".encode(), i) for i in range(50)]
    append(log, rows)
    view = PartitionView(spec, 0, tmp_path / "view")
    view.catch_up(log)
    expected = view.entries()
    view.close()
    checkpoint = tmp_path / "view" / CHECKPOINT_FILE
    data = json.loads(checkpoint.read_text())
    data["applied"] = 17  # as if the process died before checkpointing offsets 17..49
    checkpoint.write_text(json.dumps(data))
    replayed = PartitionView(spec, 0, tmp_path / "view")
    assert replayed.applied == 17
    assert replayed.catch_up(log) == 33
    assert replayed.entries() == expected
    # New records after the replay are applied normally (no duplicate check hides them).
    append(log, [(b"k", b"late", 50)])
    replayed.catch_up(log)
    assert replayed.entries()[-1].value == b"late" or spec is TABLE
    replayed.close()


def test_a_checkpoint_past_the_log_end_rebuilds_the_view(
    tmp_path: Path, log: SegmentedLog, caplog: pytest.LogCaptureFixture
) -> None:
    append(log, [(b"k", b"1", 1)])
    view = PartitionView(TABLE, 0, tmp_path / "view")
    view.catch_up(log)
    view.close()
    checkpoint = tmp_path / "view" / CHECKPOINT_FILE
    data = json.loads(checkpoint.read_text())
    data["applied"] = 40  # the view saw records a crash then cut from the log
    checkpoint.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, "tidelog.broker.views"):
        rebuilt = PartitionView(TABLE, 0, tmp_path / "view")
        rebuilt.catch_up(log)
    assert "rebuilding" in caplog.text
    assert rebuilt.applied == 1
    assert [(e.key, e.value) for e in rebuilt.entries()] == [(b"k", b"1")]
    rebuilt.close()


def test_a_checkpoint_of_another_definition_or_garbage_rebuilds(
    tmp_path: Path, log: SegmentedLog
) -> None:
    append(log, [(b"k", b"1", 1), (b"k", b"2", 15)])
    view = PartitionView(WINDOWS, 0, tmp_path / "view")
    view.catch_up(log)
    view.close()
    wider = ViewSpec("w", ViewKind.WINDOW, window_size_ms=100)
    rebuilt = PartitionView(wider, 0, tmp_path / "view")
    assert rebuilt.applied == 0
    rebuilt.catch_up(log)
    assert [e.window_start_ms for e in rebuilt.window_fetch(b"k", None, None, False, 9)] == [0, 0]
    rebuilt.close()
    (tmp_path / "view" / CHECKPOINT_FILE).write_text("{not json")
    garbage = PartitionView(wider, 0, tmp_path / "view")
    assert garbage.applied == 0
    garbage.catch_up(log)
    assert len(garbage.entries()) == 2
    garbage.close()


def test_records_removed_by_retention_before_the_view_saw_them_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path / "log", segment_max_bytes=4096, retention_messages=10)
    try:
        append(log, [(b"k", f"{i:0100d}".encode(), i) for i in range(200)])
        log.maintain()
        oldest = log.oldest_offset
        assert oldest > 0
        with caplog.at_level(logging.WARNING, "tidelog.broker.views"):
            view = PartitionView(WINDOWS, 0, tmp_path / "view")
            view.catch_up(log)
        assert "retention removed" not in caplog.text  # a new view starts at the oldest
        assert [e.offset for e in view.window_fetch(b"k", None, None, False, 1000)] == list(
            range(oldest, 200)
        )
        view.close()
    finally:
        log.close()


def test_view_specs_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="invalid view name"):
        ViewSpec("a/b", ViewKind.TABLE).validate()
    with pytest.raises(InvalidArgument, match="window size"):
        ViewSpec("w", ViewKind.WINDOW).validate()
    with pytest.raises(InvalidArgument, match="retention"):
        ViewSpec("w", ViewKind.WINDOW, 10, -1).validate()
    with pytest.raises(InvalidArgument, match="takes no window"):
        ViewSpec("t", ViewKind.TABLE, 10).validate()
    spec = ViewSpec("w.1-x", ViewKind.WINDOW, 60_000, 3_600_000).validate()
    assert ViewSpec.from_json(spec.to_json()) == spec


def test_window_start_floors_negative_and_positive_times() -> None:
    assert window_start(0, 10) == 0
    assert window_start(9 * MS, 10) == 0
    assert window_start(10 * MS, 10) == 10
    assert window_start(-1 * MS, 10) == -10
