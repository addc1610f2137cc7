"""``SegmentedLog``: the commit log on disk, a directory of segments (see ``docs/format.md``).

Concurrency. One lock guards the segment list and counters; appends, reads (index lookup plus one
``pread`` per batch) and structural changes take it briefly, and CRC work happens outside it. Syncs
run outside that lock under a second one, taken first wherever both are needed, so appenders keep
writing into the page cache while an fsync is in flight. With ``FlushPolicy.ALWAYS`` every
appender waits for a sync covering its batch; whoever holds the sync lock syncs everything written
so far, so concurrent appenders share one fsync (group commit).

High watermark. With ``ALWAYS`` it is the newest synced offset; otherwise the newest written one
(the data is in the OS and survives a process crash). Listeners hear every advance.
"""

from __future__ import annotations

import bisect
import enum
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tidelog.errors import (
    CorruptRecord,
    IncorrectOffset,
    LogClosed,
    LogLocked,
    OffsetOutOfRange,
    ResourceExhausted,
    SyncFailed,
)
from tidelog.log import files
from tidelog.log.batch import MessageBatch
from tidelog.log.compaction import (
    CompactionReport,
    Step,
    finish_swaps,
    keep_mask,
    latest_offsets,
    swap_in,
    sync_dir,
    write_cleaned,
)
from tidelog.log.config import FlushPolicy, LogConfig
from tidelog.log.contract import AppendGuard
from tidelog.log.filecache import DEFAULT_FILE_CACHE, FileCache
from tidelog.log.flush import DEFAULT_FLUSHER, Flusher
from tidelog.log.index import IndexArray
from tidelog.log.reader import ForwardReader, ReverseReader
from tidelog.log.record import Message, encode_batch, verify_records
from tidelog.log.recovery import (
    RecoveryReport,
    index_entries,
    read_recovery_point,
    recover,
    scan_file,
    valid_prefix,
    write_recovery_point,
)
from tidelog.log.retention import SegmentSummary, expired_prefix
from tidelog.log.segment import Segment, segment_name

LOG = logging.getLogger("tidelog.log")


class _Change(enum.Enum):
    """What an append does to the segment list before its batch is written."""

    NONE = "none"
    ROLL = "roll"
    """A new segment after the active one, which is sealed."""
    REPLACE = "replace"
    """A new segment instead of the empty active one (a gap at the segment start)."""


class SegmentedLog:
    """A commit log stored as segment files in one directory (implements ``CommitLog``)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Callable[[], int] = time.time_ns,
        flusher: Flusher = DEFAULT_FLUSHER,
        file_cache: FileCache = DEFAULT_FILE_CACHE,
        lock_directory: bool = True,
    ) -> None:
        """``file_cache``: keeps the segments' files open, bounded (shared by every log of the
        process by default; see ``filecache.py``). ``lock_directory``: hold an ``flock`` on
        ``<directory>/.lock`` (one descriptor) while open, so a second open of the directory
        raises ``LogLocked``; pass False when the caller already guarantees that (the broker,
        which locks its whole data directory)."""
        self.directory = Path(directory)
        self.config = config or LogConfig()
        self._clock = clock
        self._flusher = flusher
        self._file_cache = file_cache
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = -1
        if lock_directory:
            self._lock_file = files.open_fd(self.directory / ".lock", os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_file)
                raise LogLocked(
                    f"{self.directory} is open in another log object or process"
                ) from None

        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._committed = threading.Condition(self._lock)
        self._listeners: list[Callable[[int], None]] = []
        self._closed = False
        self._oldest_at_close = 0

        try:
            recovered, self.recovery_report = recover(
                self.directory, read_recovery_point(self.directory)
            )
            preallocate = self.config.index_preallocate_bytes
            self._segments = [
                Segment(
                    self.directory,
                    r.base_offset,
                    count=r.count,
                    size=r.size,
                    active=i == len(recovered) - 1,
                    preallocate_bytes=preallocate,
                    cache=file_cache,
                    verified=r.verified,
                    bounds=r.bounds,
                )
                for i, r in enumerate(recovered)
            ]
            if not self._segments:
                self._segments.append(self._new_segment(0))
        except BaseException:
            self._release_lock()  # releases the flock: a failed open leaves nothing held
            raise
        self._bases = [s.base_offset for s in self._segments]
        newest = max(
            (s.newest_offset for s in self._segments if s.count),
            default=self._active.base_offset - 1,
        )
        self._next_offset = max(newest + 1, self._active.base_offset)
        self._last_timestamp = max(
            (s.newest_timestamp for s in self._segments if s.newest_timestamp is not None),
            default=0,
        )
        self._high_watermark = newest
        self._high_watermark_timestamp = self._last_timestamp
        self._synced = newest
        self._unsynced_sealed: list[Segment] = []
        if self.config.flush_policy is FlushPolicy.INTERVAL:
            self._flusher.register(self, self.config.flush_interval_s)

    # -- state -----------------------------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"log {self.directory} is closed")

    @property
    def oldest_offset(self) -> int:
        with self._lock:
            return self._oldest_offset_locked()

    def _oldest_offset_locked(self) -> int:
        if self._closed:
            return self._oldest_at_close
        return next((s.oldest_offset for s in self._segments if s.count), self._next_offset)

    @property
    def newest_offset(self) -> int:
        with self._lock:
            return self._next_offset - 1

    @property
    def next_offset(self) -> int:
        with self._lock:
            return self._next_offset

    @property
    def high_watermark(self) -> int:
        with self._lock:
            return self._high_watermark

    @property
    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    @property
    def size_bytes(self) -> int:
        """Bytes of record data held (index files not counted)."""
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def message_count(self) -> int:
        with self._lock:
            return sum(s.count for s in self._segments)

    # -- appending -------------------------------------------------------------------------------

    def append(
        self,
        messages: Sequence[bytes | Message],
        *,
        timestamp: int | None = None,
        expected_offset: int | None = None,
        atomic: bool = False,
        guard: AppendGuard | None = None,
    ) -> range:
        """Append ``messages`` with dense offsets; see ``CommitLog.append``.

        ``timestamp`` (ns) replaces the clock for this batch; like the clock it is raised to the
        log's newest timestamp if it is older, so timestamps never decrease.
        ``expected_offset`` (optimistic concurrency): append only if the first message would get
        exactly this offset, else raise ``IncorrectOffset`` and write nothing.
        ``atomic``: flag the records (CONTINUES) so that recovery keeps all of them or none.
        ``guard``: its ``check`` runs under the log's lock before ``expected_offset`` is checked,
        its ``written`` under the same lock hold once the batch is written.
        """
        if not messages:
            with self._lock:
                self._check_open()
                return range(self._next_offset, self._next_offset)
        with self._lock:
            first = self._next_offset
            if guard is not None:
                self._check_open()
                guard.check(first)
            if expected_offset is not None and expected_offset != first:
                self._check_open()
                raise IncorrectOffset(expected_offset, first)
            offsets = np.arange(first, first + len(messages), dtype=np.int64)
            rolled = self._append_locked(messages, offsets, timestamp, atomic=atomic)
            if guard is not None:
                guard.written(range(first, first + len(messages)))
        self._after_append(first + len(messages) - 1, rolled)
        return range(first, first + len(messages))

    def append_at(
        self,
        messages: Sequence[bytes | Message],
        offsets: Sequence[int],
        *,
        timestamp: int | None = None,
    ) -> None:
        """Append with caller-chosen offsets: for replicas and compaction, which keep the offsets
        records had elsewhere. ``offsets`` must strictly increase from above ``newest_offset``; any
        gaps they leave stay gaps (readers skip them)."""
        if len(offsets) != len(messages):
            raise ValueError(f"{len(messages)} messages but {len(offsets)} offsets")
        if not messages:
            return
        chosen = np.asarray(offsets, dtype=np.int64)
        if len(chosen) > 1 and not bool((np.diff(chosen) > 0).all()):
            raise OffsetOutOfRange("offsets passed to append_at must strictly increase")
        with self._lock:
            if int(chosen[0]) < self._next_offset:
                raise OffsetOutOfRange(
                    f"offset {int(chosen[0])} is not above the log's newest offset "
                    f"{self._next_offset - 1}"
                )
            rolled = self._append_locked(messages, chosen, timestamp)
        self._after_append(int(chosen[-1]), rolled)

    def _append_locked(
        self,
        messages: Sequence[bytes | Message],
        offsets: np.ndarray,
        timestamp: int | None,
        *,
        atomic: bool = False,
    ) -> bool:
        self._check_open()
        now = self._clock() if timestamp is None else timestamp
        stamp = max(now, self._last_timestamp)
        batch = encode_batch(messages, offsets, stamp, self.config.max_message_bytes, atomic=atomic)
        # A roll happens before the batch is written, never inside it: a batch (an atomic one
        # included) always lies whole in one segment. The new segment only replaces the active
        # one once the batch is in it and the old one is sealed: a failed append (a full disk, no
        # descriptors) leaves no trace of the roll. Sealing needs the old segment's files (the new
        # one may just have evicted them) and a pending cut done: both can fail, so both happen
        # before the batch is written, and the seal after it cannot fail.
        target, change = self._target_segment(
            len(batch.data), stamp, int(offsets[0]), int(offsets[-1])
        )
        old = self._active
        try:
            if change is _Change.ROLL:
                with old.held_open():
                    old.finish_cut()
                    target.append(batch)
                    old.seal()
            else:
                target.append(batch)
        except BaseException:
            if change is not _Change.NONE:
                target.delete()
            raise
        rolled = self._install(old, target, change)
        newest = int(offsets[-1])
        self._next_offset = newest + 1
        self._last_timestamp = stamp
        if self.config.flush_policy is not FlushPolicy.ALWAYS:
            self._high_watermark = newest
            self._high_watermark_timestamp = stamp
            self._committed.notify_all()
        return rolled

    def _after_append(self, newest: int, rolled: bool) -> None:
        if self.config.flush_policy is FlushPolicy.ALWAYS:
            self._sync_through(newest)  # commits, then notifies
            return
        self._notify(newest)  # committed already: tell readers before any roll sync
        if rolled:
            # The sealed segment, so recovery can trust it. The batch is committed whatever
            # happens here: a failure (a full disk for the recovery point) must not make its
            # append look failed; the segment stays unsynced and the next sync retries it.
            try:
                self._sync_through(newest)
            except (OSError, ResourceExhausted) as error:
                LOG.warning("%s: syncing the segment sealed by a roll failed: %s", self, error)

    def _target_segment(
        self, incoming: int, now: int, next_base: int, last: int
    ) -> tuple[Segment, _Change]:
        """The segment a batch goes to: the active one, or a new one that rolls it or replaces
        it (not yet installed: see ``_install``)."""
        active = self._active
        if not active.count:
            if active.base_offset < next_base:
                # An empty active segment takes the base of the first offset written to it
                # (gap-free naming after ``append_at`` leaves a gap at a segment start).
                return self._new_segment(next_base), _Change.REPLACE
            return active, _Change.NONE
        oldest = active.oldest_timestamp
        too_old = oldest is not None and now - oldest >= self.config.segment_max_age_s * 1e9
        too_far = last - active.base_offset > 0xFFFFFFFF  # relative offsets are u32
        full = active.size + incoming > self.config.segment_max_bytes
        if not (full or too_old or too_far):
            return active, _Change.NONE
        return self._new_segment(next_base), _Change.ROLL

    def _install(self, old: Segment, new: Segment, change: _Change) -> bool:
        """Make ``new`` the active segment instead of ``old`` (lock held; for a roll ``old`` is
        sealed already). Nothing here can fail: returns whether ``old`` stays, sealed."""
        if change is _Change.NONE:
            return False
        self._segments[-1] = new
        self._bases[-1] = new.base_offset
        if change is _Change.REPLACE:
            try:
                old.delete()
            except OSError as error:  # an empty segment left behind: recovery keeps it empty
                LOG.warning("%s: could not remove the replaced segment: %s", self, error)
            return False
        self._segments.insert(-1, old)
        self._bases.insert(-1, old.base_offset)
        self._unsynced_sealed.append(old)
        return True

    def _new_segment(self, base: int) -> Segment:
        """A new, empty active segment with base offset ``base`` (nothing is left on disk if it
        cannot be created)."""
        return Segment.create(
            self.directory,
            base,
            preallocate_bytes=self.config.index_preallocate_bytes,
            cache=self._file_cache,
        )

    def _roll_locked(self, base: int) -> None:
        """Seal the active segment and start a new one at ``base``; if either fails (a full disk,
        no descriptors), the active segment stays as it was and no new one is left."""
        new = self._new_segment(base)
        old = self._active
        try:
            old.seal()
        except BaseException:
            new.delete()
            raise
        self._install(old, new, _Change.ROLL)

    def roll(self) -> None:
        """Seal the active segment now (if it holds anything) and start a new one."""
        with self._lock:
            self._check_open()
            if not self._active.count:
                return
            self._roll_locked(self._next_offset)
            newest = self._next_offset - 1
        self._sync_through(newest)

    def maintain(self, now_ns: int | None = None) -> list[int]:
        """Periodic upkeep: roll an over-age active segment, then apply retention.

        Returns the base offsets of the segments deleted.
        """
        now = self._clock() if now_ns is None else now_ns
        with self._lock:
            self._check_open()
            active = self._active
            oldest = active.oldest_timestamp
            rolled = False
            if oldest is not None and now - oldest >= self.config.segment_max_age_s * 1e9:
                try:
                    self._roll_locked(self._next_offset)
                    rolled = True
                except (OSError, ResourceExhausted) as error:
                    # Retention below is what frees a full disk: it must run all the same.
                    LOG.warning("%s: could not roll the over-age segment: %s", self, error)
            newest = self._next_offset - 1
        if rolled:
            self._sync_through(newest)
        return self.enforce_retention(now)

    # -- durability ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Sync everything appended so far (and, with ``ALWAYS``, commit it)."""
        with self._lock:
            if self._closed:
                return
            newest = self._next_offset - 1
        self._sync_through(newest)

    def _sync_through(self, offset: int) -> None:
        with self._sync_lock:
            with self._lock:
                if self._closed:
                    return
                if self._synced >= offset and not self._unsynced_sealed:
                    return
                target = self._next_offset - 1
                target_timestamp = self._last_timestamp
                sealed, self._unsynced_sealed = self._unsynced_sealed, []
                active = self._active if target > self._synced else None
            try:
                for segment in sealed:
                    segment.sync_all()
                if active is not None:
                    active.sync()
                if sealed:
                    sync_dir(self.directory)
                    write_recovery_point(self.directory, max(s.newest_offset for s in sealed))
            except BaseException as error:
                with self._lock:  # still unsynced: the next sync tries them again
                    again = [s for s in sealed if s in self._segments]
                    self._unsynced_sealed = again + self._unsynced_sealed
                if isinstance(error, ResourceExhausted) and not isinstance(error, SyncFailed):
                    # A recovery point that could not be written, a segment that could not be
                    # reopened: what this sync covers was written all the same.
                    raise SyncFailed(error.resource, error.path, error.reason) from error
                raise
            with self._lock:
                self._synced = max(self._synced, target)
                advanced = (
                    self.config.flush_policy is FlushPolicy.ALWAYS and target > self._high_watermark
                )
                if advanced:
                    self._high_watermark = target
                    self._high_watermark_timestamp = target_timestamp
                    self._committed.notify_all()
        if advanced:
            self._notify(target)

    # -- committed-offset notification -----------------------------------------------------------

    def add_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x != listener]

    def _notify(self, high_watermark: int) -> None:
        for listener in self._listeners:
            listener(high_watermark)

    def wait_for_offset(self, offset: int, timeout: float | None = None) -> bool:
        with self._lock:
            return (
                self._committed.wait_for(
                    lambda: self._closed or self._high_watermark >= offset, timeout
                )
                and not self._closed
            )

    # -- lookups and reads -----------------------------------------------------------------------

    def offset_at_or_after_timestamp(self, timestamp: int) -> int | None:
        with self._lock:
            self._check_open()
            for segment in self._segments:
                newest = segment.newest_timestamp
                if newest is not None and newest >= timestamp:
                    segment = self._checked(segment)
                    offset = segment.offset_at(segment.slot_at_or_after_timestamp(timestamp))
                    return offset if offset <= self._high_watermark else None
            return None

    def offset_at_or_before_timestamp(self, timestamp: int) -> int | None:
        with self._lock:
            self._check_open()
            for segment in reversed(self._segments):
                oldest = segment.oldest_timestamp
                if oldest is not None and oldest <= timestamp:
                    segment = self._checked(segment)
                    offset = segment.offset_at(segment.slot_at_or_before_timestamp(timestamp))
                    # Past the high watermark, the newest committed record is older still.
                    offset = min(offset, self._high_watermark)
                    return offset if offset >= 0 else None
            return None

    def forward_reader(
        self,
        start_offset: int,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
    ) -> ForwardReader:
        return ForwardReader(
            self, start_offset, stop_offset=stop_offset, stop_timestamp=stop_timestamp
        )

    def reverse_reader(
        self,
        start_offset: int | None = None,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
    ) -> ReverseReader:
        return ReverseReader(
            self, start_offset, stop_offset=stop_offset, stop_timestamp=stop_timestamp
        )

    def _checked(self, segment: Segment) -> Segment:
        """``segment``, once its whole index has been checked (lock held).

        Segments trusted at open got an O(1) check only; the first lookup in one validates every
        entry (one numpy pass). A damaged index is rebuilt from the segment file, whose records
        are CRC-checked; if the file is damaged too, reads from the segment raise CorruptRecord
        rather than skip records.
        """
        if segment.verified:
            return segment
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
        return segment

    def read_forward(
        self, start: int, last: int, max_messages: int, max_bytes: int
    ) -> tuple[MessageBatch, int, int]:
        """Committed records with offsets in ``[start, last]``, ascending, from one segment.

        Returns the batch, the high watermark and its record's timestamp at read time.
        """
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("max_messages and max_bytes must be positive")
        with self._lock:
            self._check_open()
            hw, hw_timestamp = self._high_watermark, self._high_watermark_timestamp
            last = min(last, hw)
            if start > last:
                return MessageBatch.empty(), hw, hw_timestamp
            k = max(bisect.bisect_right(self._bases, start) - 1, 0)
            while k < len(self._segments):
                segment = self._checked(self._segments[k])
                slot = segment.slot_at_or_after(start)
                if slot < segment.count:
                    break
                k += 1
            else:
                return MessageBatch.empty(), hw, hw_timestamp
            end = min(segment.slot_at_or_before(last) + 1, slot + max_messages)
            if end <= slot:
                return MessageBatch.empty(), hw, hw_timestamp
            entries = segment.entries(slot, end)
            positions = entries["position"].astype(np.int64)
            sizes = entries["size"].astype(np.int64)
            first_position = int(positions[0])
            ends = positions + sizes - first_position
            keep = max(int(np.searchsorted(ends, max_bytes, side="right")), 1)
            data = segment.read(first_position, int(ends[keep - 1]))
        batch = _verified(segment, data, entries[:keep], first_position)
        return batch, hw, hw_timestamp

    def read_backward(
        self, top: int, lowest: int, max_messages: int, max_bytes: int
    ) -> MessageBatch:
        """Committed records with offsets in ``[lowest, top]``, descending, from one segment."""
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("max_messages and max_bytes must be positive")
        with self._lock:
            self._check_open()
            top = min(top, self._high_watermark)
            if top < lowest:
                return MessageBatch.empty()
            k = bisect.bisect_right(self._bases, top) - 1
            while k >= 0:
                segment = self._checked(self._segments[k])
                slot = segment.slot_at_or_before(top)
                if slot >= 0:
                    break
                k -= 1
            else:
                return MessageBatch.empty()
            first = max(segment.slot_at_or_after(lowest), slot - max_messages + 1)
            if first > slot:
                return MessageBatch.empty()
            entries = segment.entries(first, slot + 1)
            sizes = entries["size"].astype(np.int64)
            keep = max(int(np.searchsorted(np.cumsum(sizes[::-1]), max_bytes, side="right")), 1)
            entries, sizes = entries[-keep:], sizes[-keep:]
            positions = entries["position"].astype(np.int64)
            first_position = int(positions[0])
            data = segment.read(first_position, int(positions[-1] + sizes[-1]) - first_position)
        return _verified(segment, data, entries, first_position).reversed()

    def compact(self, *, step: Step | None = None) -> CompactionReport:
        """Rewrite sealed segments keeping the latest record per key (see ``compaction.py``).

        Records without a key and everything at or above the high watermark stay. The heavy
        work (reading, deciding, writing ``.cleaned`` files) happens outside the log's lock, so
        appends and reads go on; only the file swap takes it. ``step`` is for fault-injection
        tests.
        """
        report = CompactionReport()
        with self._lock:
            self._check_open()
            high_watermark = self._high_watermark
            sealed = [s for s in self._segments[:-1] if s.count]
        if not sealed or high_watermark < 0:
            return report
        latest = latest_offsets(self.forward_reader(0, stop_offset=high_watermark))
        for segment in sealed:
            with self._lock:
                if self._closed or segment not in self._segments:
                    continue
                self._checked(segment)
                entries = segment.entries(0, segment.count)
                data = segment.read(0, segment.size)
            positions = entries["position"].astype(np.int64)
            sizes = entries["size"].astype(np.int64)
            header = verify_records(
                data,
                positions,
                sizes,
                segment.offsets_of(entries),
                entries["timestamp"],
                segment.name,
                0,
            )
            batch = MessageBatch(data, positions, sizes, header)
            keep = keep_mask(batch.offsets.tolist(), batch.keys(), latest, high_watermark)
            if bool(keep.all()):
                continue
            name = segment_name(segment.base_offset)
            _, _, new_entries, new_size = write_cleaned(self.directory, name, data, entries, keep)
            with self._sync_lock, self._lock:
                if self._closed or segment not in self._segments:
                    finish_swaps(self.directory)  # discards the .cleaned files
                    continue
                position = self._segments.index(segment)
                segment.close()
                try:
                    swap_in(self.directory, name, step)
                except BaseException:
                    # The files are mid-swap: only recovery (reopening) may touch them now.
                    self._abandon_locked(self._next_offset)
                    raise
                self._segments[position] = Segment(
                    self.directory,
                    segment.base_offset,
                    count=len(new_entries),
                    size=new_size,
                    active=False,
                    preallocate_bytes=self.config.index_preallocate_bytes,
                    cache=self._file_cache,
                    bounds=new_entries[[0, -1]] if len(new_entries) else None,
                )
                self._unsynced_sealed = [s for s in self._unsynced_sealed if s is not segment]
            report.segments_rewritten += 1
            report.records_removed += int((~keep).sum())
            report.bytes_removed += segment.size - new_size
        if report.segments_rewritten:
            LOG.info(
                "%s: compaction removed %d records (%d bytes) from %d segments",
                self.directory,
                report.records_removed,
                report.bytes_removed,
                report.segments_rewritten,
            )
        return report

    def verify(self) -> int:
        """Read and CRC-check every committed record; return how many there are.

        Raises ``CorruptRecord`` at the first damaged one.
        """
        return sum(len(batch) for batch in self.forward_reader(0))

    # -- retention and lifecycle -----------------------------------------------------------------

    def enforce_retention(self, now_ns: int | None = None) -> list[int]:
        """Delete the sealed segments the retention limits expire; return their base offsets."""
        now = self._clock() if now_ns is None else now_ns
        config = self.config
        with self._sync_lock, self._lock:
            self._check_open()
            summaries = [
                SegmentSummary(s.base_offset, s.size, s.count, s.newest_timestamp)
                for s in self._segments
            ]
            doomed = expired_prefix(
                summaries[:-1],
                summaries[-1],
                retention_bytes=config.retention_bytes,
                retention_messages=config.retention_messages,
                retention_age_s=config.retention_age_s,
                now_ns=now,
            )
            removed = self._segments[:doomed]
            del self._segments[:doomed]
            del self._bases[:doomed]
            self._unsynced_sealed = [s for s in self._unsynced_sealed if s not in removed]
            for segment in removed:
                segment.delete()
        return [s.base_offset for s in removed]

    def close(self) -> None:
        with self._sync_lock, self._lock:
            if self._closed:
                return
            self._oldest_at_close = self._oldest_offset_locked()
            self._closed = True
            self._flusher.unregister(self)
            try:
                for segment in self._segments:
                    if segment.active or segment in self._unsynced_sealed:
                        segment.sync_all()
                try:
                    self._active.seal()
                except (OSError, ResourceExhausted) as error:
                    # The newest segment may stay unsealed (and keep a tail a failed append left):
                    # recovery scans it and cuts such a tail on the next open.
                    LOG.warning("%s: could not seal the active segment on close: %s", self, error)
                sync_dir(self.directory)
                write_recovery_point(self.directory, self._next_offset - 1)
            finally:  # a failed sync (a full disk) still lets go of every file and the lock
                for segment in self._segments:
                    segment.close()
                self._committed.notify_all()
                self._release_lock()

    def _abandon_locked(self, oldest_offset: int) -> None:
        """Close without syncing or writing anything (both locks held)."""
        self._oldest_at_close = oldest_offset
        self._closed = True
        self._flusher.unregister(self)
        for segment in self._segments:
            segment.close()
        self._committed.notify_all()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file >= 0:
            os.close(self._lock_file)
            self._lock_file = -1

    def delete(self) -> None:
        """Close the log and remove its directory."""
        with self._sync_lock, self._lock:
            if not self._closed:
                self._abandon_locked(self._oldest_offset_locked())
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SegmentedLog({str(self.directory)!r}, segments={len(self._segments)})"


def _verified(
    segment: Segment, data: bytes, entries: IndexArray, first_position: int
) -> MessageBatch:
    """The records ``entries`` describe, read as ``data`` from ``first_position`` of
    ``segment``, checked against their CRCs and index entries (no lock needed: all in hand)."""
    positions = entries["position"].astype(np.int64) - first_position
    sizes = entries["size"].astype(np.int64)
    header = verify_records(
        data,
        positions,
        sizes,
        segment.offsets_of(entries),
        entries["timestamp"],
        segment.name,
        first_position,
    )
    return MessageBatch(data, positions, sizes, header)


def open_log(directory: str | os.PathLike[str], config: LogConfig | None = None) -> SegmentedLog:
    """Open (creating if needed, recovering if it crashed) the log in ``directory``."""
    return SegmentedLog(directory, config)


__all__ = ["RecoveryReport", "SegmentedLog", "open_log"]
