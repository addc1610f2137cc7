"""Recovery on open: make a log directory consistent again after a crash, a torn write or damage.

Theory. Each flush (sync) of a log's files is recorded in ``recovery-point``: the newest offset
whose record is known to be on stable storage. Segments that lie entirely at or below it are
trusted and get an O(1) check (index and file sizes agree at both ends). Everything else is
checked record by record: the longest prefix of index entries that is self-consistent (positions
chained, offsets increasing, timestamps not decreasing, inside the file) and at or below the
recovery point is kept, then the file is scanned from the end of that prefix, verifying each
record's framing and CRC-32C, and the index is rebuilt from what is found. The first record that
is incomplete or damaged marks the cut: the file is truncated there and every later segment is
removed, so the log stays a gap-free prefix of what was written and nothing after a tear appears.

Atomic batches. A batch appended with ``atomic=True`` has CONTINUES set on every record but its
last, and never spans segments. Once the tail is found, if the newest record left has CONTINUES
set, the batch it belongs to was torn: the log is cut back to the end of the newest record
without it (the start of that batch). Only records recovery scanned above the recovery point are
ever cut this way. Everything at or below the recovery point was synced by a roll or a clean
close, which only ever happen between batches; a CONTINUES record there whose batch end is
missing lost it to compaction (which keeps records, not batches), not to a crash, and stays.
Trusted segments therefore need no attrs check beyond their O(1) one.

Index repair after open lives here too (:func:`verify_index`): a trusted segment's index is fully
checked on its first lookup, with the same self-consistency rules and the same scan.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from tidelog import durable
from tidelog.errors import CorruptRecord
from tidelog.log.compaction import finish_swaps
from tidelog.log.config import LogConfig
from tidelog.log.filecache import FileCache
from tidelog.log.index import ENTRY_SIZE, INDEX_DTYPE, IndexArray, read_index_file, write_index_file
from tidelog.log.record import HEADER_SIZE, ScannedRecord, scan_records
from tidelog.log.segment import Segment, index_path, log_path

LOG = logging.getLogger("tidelog.log.recovery")

RECOVERY_POINT_FILE: Final = "recovery-point"
_SCAN_CHUNK: Final = 8 * 1024 * 1024
_MAX_RECORD: Final = 64 * 1024 * 1024 + 1024 * 1024
_ENTRY: Final = struct.Struct("<IqII")
_SIZE_FIELD: Final = struct.Struct("<I")
_RECORD_START: Final = struct.Struct("<IIqq")  # crc, size, offset, timestamp


@dataclass(frozen=True, slots=True)
class RecoveredSegment:
    base_offset: int
    count: int
    size: int
    verified: bool
    """Every index entry was checked; False after the O(1) check of a trusted segment."""
    bounds: IndexArray | None = None
    """The first and last entries (None when empty), so the log need not open the index."""


@dataclass(frozen=True, slots=True)
class _Tail:
    """The newest segment holding records, as the record-by-record pass left it."""

    slot: int
    """Its place in the list of kept segments."""
    base: int
    entries: IndexArray
    trusted: int
    """How many leading ``entries`` came from the stored index (at or below the recovery point)."""
    scanned: list[ScannedRecord]
    """The records after those, read from the file."""
    start: int
    """Where the scan began: the end of the trusted entries."""


@dataclass(slots=True)
class RecoveryReport:
    """What recovery changed; empty lists and zeros after a clean shutdown."""

    scanned_records: int = 0
    rebuilt_indexes: list[int] = field(default_factory=list)
    truncated: list[tuple[int, int]] = field(default_factory=list)
    """(segment base offset, bytes cut from its tail)"""
    dropped_segments: list[int] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.rebuilt_indexes or self.truncated or self.dropped_segments)


def read_recovery_point(directory: Path) -> int:
    """The newest offset known to be synced, or -1 when unknown (everything gets checked)."""
    try:
        return int((directory / RECOVERY_POINT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return -1


def write_recovery_point(directory: Path, offset: int) -> None:
    """Atomically record ``offset`` as synced (call only after the sync it describes)."""
    durable.replace_file(directory / RECOVERY_POINT_FILE, f"{offset}\n".encode(), sync=True)


def segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segments in ``directory``; removes temp files and orphan indexes."""
    bases = set()
    for path in directory.iterdir():
        stem, suffix = path.stem, path.suffix
        if suffix == ".tmp":
            path.unlink(missing_ok=True)
        elif suffix == ".log" and len(stem) == 20 and stem.isdigit():
            bases.add(int(stem))
    for path in directory.glob("*.index"):
        if path.stem.isdigit() and int(path.stem) not in bases:
            path.unlink(missing_ok=True)
    return sorted(bases)


def _quick_check(directory: Path, base: int, log_size: int, previous_offset: int) -> int | None:
    """Entry count of a trusted segment whose index agrees with its file at both ends, else None."""
    path = index_path(directory, base)
    try:
        index_size = path.stat().st_size
    except FileNotFoundError:
        return None
    if index_size % ENTRY_SIZE or (index_size == 0) != (log_size == 0):
        return None
    if index_size == 0:
        return 0
    with open(path, "rb") as f:
        first = _ENTRY.unpack(f.read(ENTRY_SIZE))
        f.seek(index_size - ENTRY_SIZE)
        last = _ENTRY.unpack(f.read(ENTRY_SIZE))
    ok = (
        first[2] == 0
        and first[3] >= HEADER_SIZE
        and base + first[0] > previous_offset
        and last[0] >= first[0]
        and last[2] + last[3] == log_size
    )
    if ok:
        # The last entry carries the offset and time the next segment is checked against: it
        # must agree with the record it points at.
        with open(log_path(directory, base), "rb") as f:
            f.seek(last[2])
            header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            return None
        _crc, size, offset, timestamp = _RECORD_START.unpack_from(header)
        ok = (size, offset, timestamp) == (last[3], base + last[0], last[1])
    return index_size // ENTRY_SIZE if ok else None


def valid_prefix(
    entries: IndexArray, log_size: int, base: int, previous_offset: int, previous_timestamp: int
) -> int:
    """How many leading ``entries`` are consistent with each other and with the file size."""
    n = len(entries)
    if n == 0:
        return 0
    offsets = entries["rel"].astype(np.int64) + base
    positions = entries["position"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    timestamps = entries["timestamp"]
    ends = positions + sizes
    ok = (sizes >= HEADER_SIZE) & (ends <= log_size)
    ok &= positions == np.concatenate(([0], ends[:-1]))
    ok &= offsets > np.concatenate(([previous_offset], offsets[:-1]))
    ok &= timestamps >= np.concatenate(([previous_timestamp], timestamps[:-1]))
    return n if bool(ok.all()) else int(np.argmin(ok))


def scan_file(
    path: Path, start: int, log_size: int, previous_offset: int, previous_timestamp: int
) -> tuple[list[ScannedRecord], int]:
    """Intact records from byte ``start`` of ``path`` and the position where the intact run ends."""
    found: list[ScannedRecord] = []
    position = start
    want = _SCAN_CHUNK
    with open(path, "rb") as f:
        while position < log_size:
            f.seek(position)
            chunk = f.read(min(want, log_size - position))
            records, end = scan_records(chunk, 0, previous_offset, previous_timestamp)
            found += [
                ScannedRecord(r.offset, r.timestamp, r.position + position, r.size, r.continues)
                for r in records
            ]
            if records:
                previous_offset, previous_timestamp = records[-1].offset, records[-1].timestamp
            reached_file_end = position + len(chunk) >= log_size
            position += end
            want = _SCAN_CHUNK
            if reached_file_end:
                break  # a stop short of the file end here is the torn or damaged tail
            if end == len(chunk):
                continue
            if len(chunk) - end < HEADER_SIZE:
                continue  # the next header straddles the chunk edge: read on from it
            (size,) = _SIZE_FIELD.unpack_from(chunk, end + 4)
            if HEADER_SIZE <= size <= _MAX_RECORD and end + size > len(chunk):
                want = max(_SCAN_CHUNK, size)  # a record longer than what is left of the chunk
                continue
            break  # a whole record is in hand and it is damaged
    return found, position


def index_entries(records: list[ScannedRecord], base: int) -> IndexArray:
    """Index entries for scanned records of the segment with base offset ``base``."""
    entries = np.empty(len(records), dtype=INDEX_DTYPE)
    if records:
        entries["rel"] = [r.offset - base for r in records]
        entries["timestamp"] = [r.timestamp for r in records]
        entries["position"] = [r.position for r in records]
        entries["size"] = [r.size for r in records]
    return entries


def recover(directory: Path, recovery_point: int) -> tuple[list[RecoveredSegment], RecoveryReport]:
    """Check and repair every segment in ``directory``; return what the log now holds."""
    report = RecoveryReport()
    for action in finish_swaps(directory):  # an interrupted compaction: done or undone
        LOG.warning("%s: %s", directory, action)
    bases = segment_bases(directory)
    kept: list[RecoveredSegment] = []
    tail: _Tail | None = None
    previous_offset, previous_timestamp = -1, np.iinfo(np.int64).min
    for k, base in enumerate(bases):
        lpath, ipath = log_path(directory, base), index_path(directory, base)
        log_size = lpath.stat().st_size
        following = bases[k + 1] if k + 1 < len(bases) else None
        if following is not None and following - 1 <= recovery_point:
            count = _quick_check(directory, base, log_size, previous_offset)
            if count is not None:
                bounds = None
                if count:
                    with open(ipath, "rb") as f:
                        first = f.read(ENTRY_SIZE)
                        f.seek((count - 1) * ENTRY_SIZE)
                        last = f.read(ENTRY_SIZE)
                    bounds = np.frombuffer(first + last, dtype=INDEX_DTYPE).copy()
                    rel, timestamp = int(bounds["rel"][1]), int(bounds["timestamp"][1])
                    previous_offset, previous_timestamp = base + rel, timestamp
                    tail = None  # trusted: never cut (see the module docstring)
                kept.append(RecoveredSegment(base, count, log_size, verified=False, bounds=bounds))
                continue

        stored = read_index_file(ipath)
        good = valid_prefix(stored, log_size, base, previous_offset, previous_timestamp)
        if 0 < good < int(np.count_nonzero(stored["size"])):
            # Entry `good` disagrees with the one before it: either may be the damaged one (an
            # entry is only checked against its predecessor), so trust neither; the scan below
            # re-reads their records from the file.
            good -= 1
        # An index whose whole chain is consistent but ends past the file: the file lost records
        # it once held (a truncated segment), even if it now ends on a record boundary.
        listed = int(np.count_nonzero(stored["size"]))
        chain = valid_prefix(stored[:listed], 2**62, base, previous_offset, previous_timestamp)
        lost_tail = (
            following is not None
            and listed > 0
            and chain == listed
            and int(stored["position"][listed - 1]) + int(stored["size"][listed - 1]) > log_size
        )
        trusted_rel = recovery_point - base
        good = min(good, int(np.searchsorted(stored["rel"][:good], trusted_rel, side="right")))
        trusted = stored[:good]
        start = int(trusted["position"][-1]) + int(trusted["size"][-1]) if good else 0
        if good:
            previous_offset = base + int(trusted["rel"][-1])
            previous_timestamp = int(trusted["timestamp"][-1])
        scan_from_offset = max(previous_offset, base - 1)
        scanned, end = scan_file(lpath, start, log_size, scan_from_offset, previous_timestamp)
        report.scanned_records += len(scanned)
        entries = np.concatenate((trusted, index_entries(scanned, base)))
        if scanned:
            previous_offset, previous_timestamp = scanned[-1].offset, scanned[-1].timestamp
        if len(entries) != len(stored) or not np.array_equal(entries, stored[: len(entries)]):
            write_index_file(ipath, entries)
            report.rebuilt_indexes.append(base)
        kept.append(RecoveredSegment(base, len(entries), end, True, _bounds(entries)))
        if len(entries):
            tail = _Tail(len(kept) - 1, base, entries, good, scanned, start)
        if end < log_size or lost_tail:
            if end < log_size:
                os.truncate(lpath, end)
            report.truncated.append((base, log_size - end))
            LOG.warning(
                "%s: cut %d bytes of torn or damaged records at byte %d (after offset %d)",
                lpath,
                log_size - end,
                end,
                previous_offset,
            )
            for later in bases[k + 1 :]:
                log_path(directory, later).unlink(missing_ok=True)
                index_path(directory, later).unlink(missing_ok=True)
                report.dropped_segments.append(later)
            if bases[k + 1 :]:
                LOG.warning(
                    "%s: removed %d later segments, which followed the damage",
                    directory,
                    len(bases) - k - 1,
                )
            break
    if tail is not None:
        kept = _cut_torn_batch(directory, kept, tail, recovery_point, report)
    return kept, report


def _cut_torn_batch(
    directory: Path,
    kept: list[RecoveredSegment],
    tail: _Tail,
    recovery_point: int,
    report: RecoveryReport,
) -> list[RecoveredSegment]:
    """``kept`` with an atomic batch torn at the log's tail removed (files cut to match)."""
    scanned = tail.scanned
    if not scanned or not scanned[-1].continues:
        return kept
    whole = len(scanned)
    while whole and scanned[whole - 1].continues:
        whole -= 1
    if scanned[whole].offset <= recovery_point:
        return kept  # synced whole; its end went to compaction (see the module docstring)
    cut = scanned[whole - 1].position + scanned[whole - 1].size if whole else tail.start
    count = tail.trusted + whole
    lpath = log_path(directory, tail.base)
    size = kept[tail.slot].size
    os.truncate(lpath, cut)
    write_index_file(index_path(directory, tail.base), tail.entries[:count])
    if tail.base not in report.rebuilt_indexes:
        report.rebuilt_indexes.append(tail.base)
    if report.truncated and report.truncated[-1][0] == tail.base:
        report.truncated[-1] = (tail.base, report.truncated[-1][1] + size - cut)
    else:
        report.truncated.append((tail.base, size - cut))
    LOG.warning(
        "%s: cut an atomic batch torn by a crash: %d records (offsets %d..%d, %d bytes) at byte %d",
        lpath,
        len(scanned) - whole,
        scanned[whole].offset,
        scanned[-1].offset,
        size - cut,
        cut,
    )
    for later in kept[tail.slot + 1 :]:  # empty segments (the tail is the newest with records)
        log_path(directory, later.base_offset).unlink(missing_ok=True)
        index_path(directory, later.base_offset).unlink(missing_ok=True)
        report.dropped_segments.append(later.base_offset)
    bounds = _bounds(tail.entries[:count])
    return [*kept[: tail.slot], RecoveredSegment(tail.base, count, cut, True, bounds)]


def _bounds(entries: IndexArray) -> IndexArray | None:
    return entries[[0, -1]].copy() if len(entries) else None


def open_segments(
    directory: Path, config: LogConfig, cache: FileCache
) -> tuple[list[Segment], RecoveryReport]:
    """The segments of ``directory`` after :func:`recover`, opened (the newest one active)."""
    recovered, report = recover(directory, read_recovery_point(directory))
    segments = [
        Segment(
            directory,
            r.base_offset,
            count=r.count,
            size=r.size,
            active=i == len(recovered) - 1,
            preallocate_bytes=config.index_preallocate_bytes,
            cache=cache,
            verified=r.verified,
            bounds=r.bounds,
        )
        for i, r in enumerate(recovered)
    ]
    return segments, report


def verify_index(segment: Segment) -> None:
    """Check every index entry of a segment recovery trusted (it got an O(1) check only); a
    damaged index is rebuilt from the segment file, whose records are CRC-checked. If the file
    is damaged too, raise ``CorruptRecord`` rather than let reads skip records."""
    entries = segment.entries(0, segment.count)
    good = valid_prefix(
        entries, segment.size, segment.base_offset, segment.base_offset - 1, -(2**63)
    )
    if good < len(entries):
        records, end = scan_file(
            segment.log_path, 0, segment.size, segment.base_offset - 1, -(2**63)
        )
        if end < segment.size:
            raise CorruptRecord(
                segment.name,
                end,
                f"its index is damaged at entry {good} and the file cannot be read past "
                f"byte {end} to rebuild it",
            )
        segment.replace_index(index_entries(records, segment.base_offset))
        LOG.warning(
            "%s: index damaged at entry %d; rebuilt it from the file (%d records)",
            segment.index_path,
            good,
            len(records),
        )
    segment.verified = True
