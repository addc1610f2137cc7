"""``SegmentedLog``: the commit log on disk, a directory of segments (see ``docs/format.md``).

The log is put together from pieces, one concern each (Kafka's split of ``LogSegment`` /
``LocalLog`` / ``UnifiedLog`` / ``LogLoader`` / ``LogCleaner`` is the model):

- ``segment.py`` — one segment: its log file and index, appends, ``pread``, lookups;
- ``local.py`` — ``LocalLog``: the set of segments, the log's end, structure changes;
- ``writer.py`` — ``LogWriter``: appends, rolls, group commit and the high watermark;
- ``reads.py`` — the two read primitives and the time lookups (``reader.py`` builds cursors on
  them);
- ``recovery.py`` — opening after a crash, and index repair on first use;
- ``maintenance.py`` — the over-age roll, retention, releases and compaction, driven from
  outside.

This class is the ``CommitLog`` the broker types against: it opens the pieces, holds the
directory lock, and answers each call by taking the log's lock and handing it to the piece that
owns the concern. Concurrency: one lock guards the segment list and counters (appends, reads and
structural changes hold it briefly; CRC work runs outside it); syncs run under a second lock,
always taken first, so appenders keep writing into the page cache while an fsync is in flight.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tidelog import durable
from tidelog.errors import LogLocked, ResourceExhausted
from tidelog.log import maintenance, reads
from tidelog.log.batch import MessageBatch
from tidelog.log.compaction import CompactionReport, Step, sync_dir
from tidelog.log.config import FlushPolicy, LogConfig
from tidelog.log.contract import AppendGuard
from tidelog.log.filecache import DEFAULT_FILE_CACHE, FileCache
from tidelog.log.flush import DEFAULT_FLUSHER, Flusher
from tidelog.log.local import LOG, LocalLog
from tidelog.log.newest import serving
from tidelog.log.reader import ForwardReader, ReverseReader
from tidelog.log.record import Int64Array, NewRecord, stored_batches
from tidelog.log.recovery import RecoveryReport, open_segments, write_recovery_point
from tidelog.log.writer import LogWriter

T = TypeVar("T")


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
        commit_limit: int | None = None,
    ) -> None:
        """``file_cache``: keeps the segments' files open, bounded (shared by every log of the
        process by default; see ``filecache.py``). ``lock_directory``: hold an ``flock`` on
        ``<directory>/.lock`` (one descriptor) while open, so a second open of the directory
        raises ``LogLocked``; pass False when the caller already guarantees that (the broker,
        which locks its whole data directory). ``commit_limit``: readers see no record above
        it from the open on (:meth:`set_commit_limit` can only raise it), for a replica whose
        records above what it last knew committed must stay unseen."""
        self.directory = Path(directory)
        config = config or LogConfig()
        self._clock = clock
        self._flusher = flusher
        durable.make_dirs(self.directory)
        self._lock_file = -1
        if lock_directory:
            self._lock_file = durable.open_fd(self.directory / ".lock", os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_file)
                raise LogLocked(
                    f"{self.directory} is open in another log object or process"
                ) from None
        try:
            segments, self.recovery_report = open_segments(self.directory, config, file_cache)
            self._local = LocalLog(self.directory, config, file_cache, segments)
        except BaseException:
            self._release_lock()  # releases the flock: a failed open leaves nothing held
            raise
        self._writer = LogWriter(self._local, clock, commit_limit)
        self._start_listeners: list[Callable[[int], None]] = []
        if config.flush_policy is FlushPolicy.INTERVAL:
            self._flusher.register(self, config.flush_interval_s)

    # -- state -----------------------------------------------------------------------------------

    @property
    def config(self) -> LogConfig:
        return self._local.config

    @config.setter
    def config(self, config: LogConfig) -> None:
        """A new configuration (limits, retention) from the next operation on; the flush policy
        chosen at open stays."""
        self._local.config = config

    @property
    def oldest_offset(self) -> int:
        with self._local.lock:
            return self._local.oldest_offset()

    @property
    def newest_offset(self) -> int:
        with self._local.lock:
            return self._local.next_offset - 1

    @property
    def next_offset(self) -> int:
        with self._local.lock:
            return self._local.next_offset

    @property
    def high_watermark(self) -> int:
        with self._local.lock:
            return self._writer.high_watermark

    @property
    def committed_offset(self) -> int:
        """The newest committed record, above the high watermark while a commit limit holds
        readers back (what a replica may copy)."""
        with self._local.lock:
            return self._writer.committed

    def set_commit_limit(self, limit: int | None) -> None:
        """Readers see no record above ``limit`` (None: no limit, the default): a replicated
        partition's leader holds its high watermark at the offset every in-sync replica has.
        Raising it wakes readers and listeners."""
        self._writer.set_limit(limit)

    @property
    def segment_count(self) -> int:
        with self._local.lock:
            return len(self._local.segments)

    @property
    def size_bytes(self) -> int:
        """Bytes of record data held (index files not counted)."""
        with self._local.lock:
            return sum(s.size for s in self._local.segments)

    @property
    def message_count(self) -> int:
        with self._local.lock:
            return sum(s.count for s in self._local.segments)

    # -- appending and durability (writer.py) ----------------------------------------------------

    def append(
        self,
        messages: Sequence[bytes | NewRecord],
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
        return self.append_stamped(
            messages,
            timestamp=timestamp,
            expected_offset=expected_offset,
            atomic=atomic,
            guard=guard,
        )[0]

    def append_stamped(
        self,
        messages: Sequence[bytes | NewRecord],
        *,
        timestamp: int | None = None,
        expected_offset: int | None = None,
        atomic: bool = False,
        guard: AppendGuard | None = None,
    ) -> tuple[range, int]:
        """``append``, also returning the timestamp the batch's records were stored with (an
        empty batch: the newest timestamp)."""
        return self._writer.append(
            messages,
            timestamp=timestamp,
            expected_offset=expected_offset,
            atomic=atomic,
            guard=guard,
        )

    def append_at(
        self,
        messages: Sequence[bytes | NewRecord],
        offsets: Sequence[int],
        *,
        timestamp: int | None = None,
    ) -> None:
        """Append with caller-chosen offsets: for replicas and compaction, which keep the offsets
        records had elsewhere. ``offsets`` must strictly increase from above ``newest_offset``; any
        gaps they leave stay gaps (readers skip them)."""
        self._writer.append_at(messages, offsets, timestamp)

    def append_stored(self, data: bytes, sizes: Int64Array) -> MessageBatch:
        """Append whole stored records (``data``, ``sizes[i]`` bytes each) byte for byte, a run
        of one timestamp per batch: a replica copying its leader. CRCs are checked first
        (``CorruptRecord``, nothing written); offsets must rise above ``newest_offset`` and
        timestamps not go back (``OffsetOutOfRange``). Returns the records, headers as checked."""
        checked = stored_batches(data, sizes, f"{self.directory} (stored records to append)")
        for batch in checked.batches:
            self._writer.append_stored(batch)
        return MessageBatch(data, checked.positions, checked.sizes, checked.header)

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset``: a replica cutting a tail its new leader
        never had (``tidelog.cluster.leader_epochs``). The next append goes at ``offset`` (or
        after the newest record left, when the cut falls in a gap). Crash-safe: the recovery
        point moves below the cut first, whole segments go newest first, and the segment the
        cut falls in becomes the active one again, cut and synced. Raises
        ``OffsetOutOfRange`` below the oldest offset. Callers must not read above the cut
        while it runs (a follower serves reads only up to the replicated high watermark, which a
        cut never passes)."""
        self._writer.truncate_to(offset)

    def roll(self) -> None:
        """Seal the active segment now (if it holds anything) and start a new one."""
        self._writer.roll()

    def flush(self) -> None:
        """Sync everything appended so far (and, with ``ALWAYS``, commit it)."""
        self._writer.flush()

    def add_listener(self, listener: Callable[[int], None]) -> None:
        self._writer.add_listener(listener)

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        self._writer.remove_listener(listener)

    def wait_for_offset(self, offset: int, timeout: float | None = None) -> bool:
        return self._writer.wait_for_offset(offset, timeout)

    def add_start_listener(self, listener: Callable[[int], None]) -> None:
        """``listener(oldest_offset)`` after segments leave the start (``CommitLog``'s rules)."""
        with self._local.lock:
            self._start_listeners = [*self._start_listeners, listener]

    def remove_start_listener(self, listener: Callable[[int], None]) -> None:
        with self._local.lock:
            self._start_listeners = [x for x in self._start_listeners if x != listener]

    def _moving_start(self, change: Callable[[], T]) -> T:
        """``change`` (deleting segments from the start), then the start listeners if needed."""
        before = self.oldest_offset
        result = change()
        oldest = self.oldest_offset
        if oldest > before:
            for listener in self._start_listeners:
                listener(oldest)
        return result

    # -- lookups and reads (reads.py) ------------------------------------------------------------

    def offset_at_or_after_timestamp(self, timestamp: int) -> int | None:
        with self._local.lock:
            self._local.check_open()
            return reads.offset_at_or_after_timestamp_locked(
                self._local, timestamp, self._writer.high_watermark
            )

    def offset_at_or_before_timestamp(self, timestamp: int) -> int | None:
        with self._local.lock:
            self._local.check_open()
            return reads.offset_at_or_before_timestamp_locked(
                self._local, timestamp, self._writer.high_watermark
            )

    def forward_reader(
        self,
        start_offset: int,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
        past_limit: bool = False,
        readahead_bytes: int = 0,
    ) -> ForwardReader:
        """``past_limit``: read every committed record, above a commit limit too (replicas
        copying the leader's log). ``readahead_bytes``: see :class:`ForwardReader`."""
        bounds = {"stop_offset": stop_offset, "stop_timestamp": stop_timestamp}
        return ForwardReader(
            self, start_offset, **bounds, past_limit=past_limit, readahead_bytes=readahead_bytes
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

    def read_forward(
        self, start: int, last: int, max_messages: int, max_bytes: int, past_limit: bool = False
    ) -> tuple[MessageBatch, int, int]:
        """Committed records with offsets in ``[start, last]``, ascending, from one segment.

        Returns the batch, the high watermark and its record's timestamp at read time (with
        ``past_limit``: the newest committed record and its timestamp, ignoring the limit). The
        read of exactly the newest batch written gets it from memory (``newest.py``).
        """
        reads.check_limits(max_messages, max_bytes)
        with self._local.lock:
            self._local.check_open()
            writer = self._writer
            if past_limit:
                hw, hw_timestamp = writer.committed, self._local.last_timestamp
            else:
                hw, hw_timestamp = writer.high_watermark, writer.high_watermark_timestamp
            local, top = self._local, min(last, hw)
            newest = serving(writer.newest, local, start, top, max_messages, max_bytes)
            if newest is None:
                piece = reads.forward_locked(local, start, top, max_messages, max_bytes)
        if newest is not None:  # the batch just written, from memory
            return newest.batch(), hw, hw_timestamp
        return reads.verified(piece), hw, hw_timestamp

    def read_backward(
        self, top: int, lowest: int, max_messages: int, max_bytes: int
    ) -> MessageBatch:
        """Committed records with offsets in ``[lowest, top]``, descending, from one segment."""
        reads.check_limits(max_messages, max_bytes)
        with self._local.lock:
            self._local.check_open()
            top = min(top, self._writer.high_watermark)
            piece = reads.backward_locked(self._local, top, lowest, max_messages, max_bytes)
        return reads.verified(piece).reversed()

    def verify(self) -> int:
        """Count the committed records, each read from its file and CRC-checked (CorruptRecord)."""
        return reads.verify_all(self._local, lambda: self._writer.high_watermark)

    # -- maintenance (maintenance.py) ------------------------------------------------------------

    def maintain(self, now_ns: int | None = None) -> list[int]:
        """Periodic upkeep: roll an over-age active segment, then apply retention.

        Returns the base offsets of the segments deleted.
        """
        now = self._clock() if now_ns is None else now_ns
        maintenance.roll_if_over_age(self._writer, now)
        return self.enforce_retention(now)

    def enforce_retention(self, now_ns: int | None = None) -> list[int]:
        """Delete the sealed segments the retention limits expire; return their base offsets."""
        now = self._clock() if now_ns is None else now_ns
        return self._moving_start(lambda: maintenance.enforce_retention(self._local, now))

    def release_before(self, offset: int) -> list[int]:
        """Delete the sealed segments holding only offsets below ``offset`` (exclusive) and at or
        below the high watermark; return their base offsets. The active segment stays."""
        return self._moving_start(
            lambda: maintenance.release_before(self._local, offset, self._writer.high_watermark)
        )

    def compact(self, *, step: Step | None = None) -> CompactionReport:
        """Rewrite sealed segments keeping the latest record per key (``maintenance.compact``);
        ``step`` is for fault-injection tests."""
        local = self._local
        return maintenance.compact(
            local,
            lambda: self._writer.high_watermark,
            lambda hw: self.forward_reader(0, stop_offset=hw),
            lambda: self._abandon_locked(local.next_offset),
            step,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        local = self._local
        with local.sync_lock, local.lock:
            if local.closed:
                return
            local.oldest_at_close = local.oldest_offset()
            local.closed = True
            self._flusher.unregister(self)
            try:
                for segment in local.segments:
                    if segment.active or segment in local.unsynced_sealed:
                        segment.sync_all()
                try:
                    local.active.seal()
                except (OSError, ResourceExhausted) as error:
                    # Left unsealed: recovery cuts a failed append's tail on the next open.
                    LOG.warning("%s: could not seal the active segment on close: %s", self, error)
                sync_dir(self.directory)
                write_recovery_point(self.directory, local.next_offset - 1)
            finally:  # a failed sync (a full disk) still lets go of every file and the lock
                local.close_files()
                local.committed.notify_all()
                self._release_lock()

    def _abandon_locked(self, oldest_offset: int) -> None:
        """Close without syncing or writing anything (both locks held)."""
        local = self._local
        local.oldest_at_close = oldest_offset
        local.closed = True
        self._flusher.unregister(self)
        local.close_files()
        local.committed.notify_all()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file >= 0:
            os.close(self._lock_file)
            self._lock_file = -1

    def delete(self) -> None:
        """Close the log and remove its directory."""
        local = self._local
        with local.sync_lock, local.lock:
            if not local.closed:
                self._abandon_locked(local.oldest_offset())
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._local)


def open_log(directory: str | os.PathLike[str], config: LogConfig | None = None) -> SegmentedLog:
    """Open (creating if needed, recovering if it crashed) the log in ``directory``."""
    return SegmentedLog(directory, config)


__all__ = ["RecoveryReport", "SegmentedLog", "open_log"]
