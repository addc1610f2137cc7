"""Helpers shared by the ``tidelog.log`` tests: expected records, reads, payloads, file damage.

Nothing here asks the log under test what it should contain: record sizes and positions are
computed from the documented format (``record.py``), so the tests can check the engine against an
independent account of what was written.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import Phase

from tidelog.errors import TidelogWarning
from tidelog.log import LogConfig, NewRecord, Record, SegmentedLog

KiB = 1024
MiB = 1024 * KiB
HEADER_SIZE = 36  # the fixed record header of the documented format

Headers = tuple[tuple[str, bytes], ...]

# Shrinking a failure of a file-heavy property re-runs it thousands of times (minutes). By default
# a failure is reported as found (with a @reproduce_failure blob; the example database replays it
# first next time); TIDELOG_HYPOTHESIS_SHRINK=1 shrinks it to a minimal example for debugging.
HYPOTHESIS_PHASES = tuple(
    p for p in Phase if p is not Phase.shrink or os.environ.get("TIDELOG_HYPOTHESIS_SHRINK") == "1"
)


@dataclass(frozen=True)
class Expected:
    """One record as a test expects to read it back (headers as an ordered tuple of pairs)."""

    offset: int
    timestamp: int
    value: bytes
    key: bytes | None = None
    headers: Headers = field(default=())

    @property
    def size(self) -> int:
        return record_size(self.value, self.key, dict(self.headers))


def record_size(
    value: bytes, key: bytes | None = None, headers: Mapping[str, bytes] | None = None
) -> int:
    """Bytes one record occupies on disk, from the format table in ``record.py``."""
    encoded_headers = sum(
        2 + len(name.encode()) + 4 + len(v) for name, v in (headers or {}).items()
    )
    return HEADER_SIZE + len(key or b"") + len(value) + encoded_headers


def as_expected(records: Iterable[Record]) -> list[Expected]:
    """Records read from a log in the comparable form (headers keep their stored order)."""
    return [
        Expected(r.offset, r.timestamp, bytes(r.value), r.key, tuple(r.headers.items()))
        for r in records
    ]


def payload(offset: int, size: int | None = None) -> bytes:
    """A value derivable from its offset alone (so a reader can check any record in isolation)."""
    if size is None:
        size = 8 + offset % 97
    stem = f"<{offset}>".encode()
    return (stem * (size // len(stem) + 1))[:size]


def message_for(offset: int) -> NewRecord:
    """A whole message (value, key, headers) derivable from its offset alone."""
    return NewRecord(
        payload(offset, 20 + (offset * 7919) % 700),
        key=b"k%d" % offset if offset % 3 else None,
        headers={"o": b"%d" % offset, "n": b""} if offset % 5 == 0 else {},
    )


def read_forward(
    log: SegmentedLog,
    start: int = 0,
    *,
    stop_offset: int | None = None,
    stop_timestamp: int | None = None,
    max_messages: int = 1000,
    max_bytes: int = 1 << 20,
) -> list[Expected]:
    reader = log.forward_reader(start, stop_offset=stop_offset, stop_timestamp=stop_timestamp)
    out: list[Expected] = []
    while batch := reader.read(max_messages, max_bytes):
        out += as_expected(batch.records())
    return out


def read_reverse(
    log: SegmentedLog,
    start: int | None = None,
    *,
    stop_offset: int | None = None,
    stop_timestamp: int | None = None,
    max_messages: int = 1000,
    max_bytes: int = 1 << 20,
) -> list[Expected]:
    reader = log.reverse_reader(start, stop_offset=stop_offset, stop_timestamp=stop_timestamp)
    out: list[Expected] = []
    while batch := reader.read(max_messages, max_bytes):
        out += as_expected(batch.records())
    return out


def segment_logs(directory: Path) -> list[Path]:
    """The ``.log`` files of a log directory, oldest segment first."""
    return sorted(directory.glob("*.log"))


def segment_indexes(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.index"))


def base_of(path: Path) -> int:
    return int(path.stem)


def crash_copy(log: SegmentedLog, destination: Path) -> Path:
    """What a crash would leave: the open log's files as they are now (the page cache, including
    the memory-mapped active index), without the close that would sync and trim them."""
    shutil.copytree(log.directory, destination)
    return destination


def flip_bit(path: Path, position: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        (byte,) = f.read(1)
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))


DAMAGED_OPENED: list[SegmentedLog] = []
"""Logs opened by :func:`open_damaged`; tests/log/conftest.py closes them after each test."""


def open_damaged(directory: Path, config: LogConfig, **kwargs: object) -> SegmentedLog:
    """Open a log a test damaged on purpose; warnings about the damage are expected, not errors.
    The log is closed when the test ends (open logs hold file descriptors and a lock)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TidelogWarning)
        log = SegmentedLog(directory, config, **kwargs)  # type: ignore[arg-type]
    DAMAGED_OPENED.append(log)
    return log


def layout(
    records: Sequence[Expected], bases: Sequence[int]
) -> dict[int, list[tuple[Expected, int]]]:
    """Which segment each record lives in and at which byte, from the format alone.

    ``bases`` are the segment base offsets (ascending); records are assigned to the last base at
    or below their offset and laid out back to back from byte 0.
    """
    out: dict[int, list[tuple[Expected, int]]] = {b: [] for b in bases}
    positions = dict.fromkeys(bases, 0)
    for record in records:
        base = max(b for b in bases if b <= record.offset)
        out[base].append((record, positions[base]))
        positions[base] += record.size
    return out


def survivors_of_cut(
    records: Sequence[Expected], bases: Sequence[int], cut_base: int, cut_at: int
) -> list[Expected]:
    """The records that must survive when segment ``cut_base``'s log file ends at byte ``cut_at``:
    everything in earlier segments and every record of that segment wholly before the cut; and,
    when the cut took nothing (it lies at or past the segment's end), everything."""
    placed = layout(records, bases)
    kept_here = [r for r, at in placed[cut_base] if at + r.size <= cut_at]
    if len(kept_here) == len(placed[cut_base]):
        return list(records)
    return [r for b in bases if b < cut_base for r, _ in placed[b]] + kept_here


def file_sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in segment_logs(directory)}


def bases(directory: Path) -> list[int]:
    """Base offsets of the segments in ``directory``, from the file names."""
    return [base_of(p) for p in segment_logs(directory)]


def fill(log: SegmentedLog, count: int, *, first_ts: int = 1_000) -> list[Expected]:
    """Append ``count`` records in batches of 1-5, with offset-derived values, some keys and
    headers, and explicit increasing timestamps; return them as expected."""
    expected: list[Expected] = []
    ts = first_ts
    while count > 0:
        first = log.next_offset
        n = min(count, 1 + first % 5)
        offsets = range(first, first + n)
        messages = [
            NewRecord(
                payload(o),
                key=b"%d" % o if o % 2 else None,
                headers={"o": b"%d" % o} if o % 3 == 0 else {},
            )
            for o in offsets
        ]
        assert log.append(messages, timestamp=ts) == offsets
        expected += [
            Expected(o, ts, m.value, m.key, tuple(m.headers.items()))
            for o, m in zip(offsets, messages, strict=True)
        ]
        ts += 7
        count -= n
    return expected


def check_continues_densely(log: SegmentedLog, survivors: list[Expected]) -> None:
    """After recovery the log appends right after its last surviving record, and everything
    (old and new) reads back and verifies."""
    next_offset = survivors[-1].offset + 1 if survivors else log.next_offset
    assert log.next_offset == next_offset
    more = fill(log, 12, first_ts=10**12)
    assert [r.offset for r in more] == list(range(next_offset, next_offset + 12))
    assert read_forward(log) == survivors + more
    assert log.verify() == len(survivors) + len(more)
