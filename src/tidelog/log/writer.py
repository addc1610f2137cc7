"""``LogWriter``: the write path of a log: appends, rolls, group commit and the high watermark.

Invariants. Offsets are assigned under the log's lock, densely by ``append`` and strictly
increasing by ``append_at``; a batch is written whole into one segment or not at all (a roll
happens before its write, never inside it). The high watermark never decreases and never passes
what is written: with ``FlushPolicy.ALWAYS`` it is the newest synced offset, otherwise the newest
written one (in the OS, it survives a process crash). Every advance notifies the lock's condition
and then the listeners. Syncs run under ``sync_lock`` (taken before the lock), outside the lock,
so appenders keep writing while an fsync is in flight; whoever holds it syncs everything written
so far, and appenders waiting for a sync share it (group commit).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence

import numpy as np

from tidelog.errors import IncorrectOffset, OffsetOutOfRange, ResourceExhausted, SyncFailed
from tidelog.log.compaction import sync_dir
from tidelog.log.config import FlushPolicy
from tidelog.log.contract import AppendGuard
from tidelog.log.local import LocalLog, SegmentChange
from tidelog.log.newest import NEWEST_MAX_BYTES, NewestBatch
from tidelog.log.record import EncodedBatch, NewRecord, encode_batch
from tidelog.log.recovery import read_recovery_point, write_recovery_point
from tidelog.log.segment import Segment

LOG = logging.getLogger("tidelog.log")


class LogWriter:
    """Appends to a :class:`LocalLog` and commits what it wrote (see the module's invariants)."""

    def __init__(self, local: LocalLog, clock: Callable[[], int], limit: int | None = None) -> None:
        """``limit``: the commit limit from the start (a replica reopened after a restart:
        what it last knew every in-sync replica held), so readers never see more before its
        partition's role is known."""
        self.local = local
        self.clock = clock
        newest = local.next_offset - 1
        self.high_watermark = newest if limit is None else min(newest, limit)
        """What readers see: the committed offset, held at ``limit`` when one is set."""
        held = self.high_watermark < newest
        self.high_watermark_timestamp = 0 if held else local.last_timestamp
        """The high watermark record's timestamp, or (while held by ``limit``) a lower bound
        of it: every record above the high watermark is at least this new."""
        self.committed = newest
        """The newest record committed here (written, and synced under ``ALWAYS``), whatever
        the limit: what a replica of this log may copy."""
        self.limit: int | None = limit
        """Set by a replicated partition: readers see nothing above it (the offset every
        in-sync replica holds). None: the high watermark is the committed offset."""
        self.synced = newest
        self.listeners: list[Callable[[int], None]] = []
        self.newest: NewestBatch | None = None
        """The newest batch this writer encoded, for the reader at the log's end (``newest.py``);
        None after a write of stored records (bytes the caller owns) or a truncation."""

    # -- appending -------------------------------------------------------------------------------

    def append(
        self,
        messages: Sequence[bytes | NewRecord],
        *,
        timestamp: int | None,
        expected_offset: int | None,
        atomic: bool,
        guard: AppendGuard | None,
    ) -> tuple[range, int]:
        """See ``SegmentedLog.append_stamped``."""
        local = self.local
        if not messages:
            with local.lock:
                local.check_open()
                return range(local.next_offset, local.next_offset), local.last_timestamp
        with local.lock:
            first = local.next_offset
            if guard is not None:
                local.check_open()
                guard.check(first)
            if expected_offset is not None and expected_offset != first:
                local.check_open()
                raise IncorrectOffset(expected_offset, first)
            offsets = np.arange(first, first + len(messages), dtype=np.int64)
            rolled, stamp = self._append_locked(messages, offsets, timestamp, atomic=atomic)
            if guard is not None:
                guard.written(range(first, first + len(messages)))
        self._after_append(first + len(messages) - 1, rolled)
        return range(first, first + len(messages)), stamp

    def append_at(
        self, messages: Sequence[bytes | NewRecord], offsets: Sequence[int], timestamp: int | None
    ) -> None:
        """See ``SegmentedLog.append_at``."""
        if len(offsets) != len(messages):
            raise ValueError(f"{len(messages)} messages but {len(offsets)} offsets")
        if not messages:
            return
        chosen = np.asarray(offsets, dtype=np.int64)
        if len(chosen) > 1 and not bool((np.diff(chosen) > 0).all()):
            raise OffsetOutOfRange("offsets passed to append_at must strictly increase")
        local = self.local
        with local.lock:
            if int(chosen[0]) < local.next_offset:
                raise OffsetOutOfRange(
                    f"offset {int(chosen[0])} is not above the log's newest offset "
                    f"{local.next_offset - 1}"
                )
            rolled, _ = self._append_locked(messages, chosen, timestamp)
        self._after_append(int(chosen[-1]), rolled)

    def _append_locked(
        self,
        messages: Sequence[bytes | NewRecord],
        offsets: np.ndarray,
        timestamp: int | None,
        *,
        atomic: bool = False,
    ) -> tuple[bool, int]:
        """Write one batch; returns whether the active segment changed, and the batch's
        timestamp (every record of a batch has the same one)."""
        local = self.local
        local.check_open()
        config = local.config
        now = self.clock() if timestamp is None else timestamp
        stamp = max(now, local.last_timestamp)
        batch = encode_batch(messages, offsets, stamp, config.max_message_bytes, atomic=atomic)
        rolled = self._write_locked(batch)
        if len(batch.data) <= NEWEST_MAX_BYTES:  # the encoder's own array: kept as written
            self.newest = NewestBatch(local.active, batch)
        return rolled, stamp

    def append_stored(self, batch: EncodedBatch) -> None:
        """See ``SegmentedLog.append_stored``: ``batch`` is already encoded (one timestamp)."""
        if not len(batch.sizes):
            return
        local = self.local
        with local.lock:
            local.check_open()
            if int(batch.offsets[0]) < local.next_offset:
                raise OffsetOutOfRange(
                    f"offset {int(batch.offsets[0])} is not above the log's newest offset "
                    f"{local.next_offset - 1}"
                )
            if batch.timestamp < local.last_timestamp:
                raise OffsetOutOfRange(
                    f"timestamp {batch.timestamp} of offset {int(batch.offsets[0])} is older than "
                    f"the log's newest, {local.last_timestamp}"
                )
            rolled = self._write_locked(batch)
        self._after_append(int(batch.offsets[-1]), rolled)

    def _write_locked(self, batch: EncodedBatch) -> bool:
        """Write an encoded batch; returns whether the active segment changed."""
        local = self.local
        self.newest = None
        config = local.config
        offsets = batch.offsets
        stamp = batch.timestamp
        # A roll happens before the batch is written, never inside it: a batch (an atomic one
        # included) always lies whole in one segment. The new segment only replaces the active
        # one once the batch is in it and the old one is sealed: a failed append (a full disk, no
        # descriptors) leaves no trace of the roll. Sealing needs the old segment's files (the new
        # one may just have evicted them) and a pending cut done: both can fail, so both happen
        # before the batch is written, and the seal after it cannot fail.
        target, change = self._target_segment(
            len(batch.data), stamp, int(offsets[0]), int(offsets[-1])
        )
        old = local.active
        try:
            if change is SegmentChange.ROLL:
                with old.held_open():
                    old.finish_cut()
                    target.append(batch)
                    old.seal()
            else:
                target.append(batch)
        except BaseException:
            if change is not SegmentChange.NONE:
                target.delete()
            raise
        rolled = local.install(old, target, change)
        newest = int(offsets[-1])
        local.next_offset = newest + 1
        local.last_timestamp = stamp
        if config.flush_policy is not FlushPolicy.ALWAYS:
            self._commit_locked(newest, stamp)
        return rolled

    def _commit_locked(self, newest: int, stamp: int) -> bool:
        """Commit through ``newest`` (whose timestamp is ``stamp``); True when readers may see
        more. Holds ``local.lock``."""
        self.committed = max(self.committed, newest)
        return self._show_locked(stamp)

    def _show_locked(self, stamp: int) -> bool:
        visible = self.committed if self.limit is None else min(self.committed, self.limit)
        if visible <= self.high_watermark:
            return False
        self.high_watermark = visible
        if visible == self.committed:
            self.high_watermark_timestamp = stamp
        self.local.committed.notify_all()
        return True

    def set_limit(self, limit: int | None) -> None:
        """See ``SegmentedLog.set_commit_limit``."""
        local = self.local
        with local.lock:
            if local.closed:
                return
            self.limit = limit
            shown = self._show_locked(local.last_timestamp)
            committed = self.committed
        if shown:
            self.notify(committed)

    def _after_append(self, newest: int, rolled: bool) -> None:
        if self.local.config.flush_policy is FlushPolicy.ALWAYS:
            self.sync_through(newest)  # commits, then notifies
            return
        self.notify(newest)  # committed already: tell readers before any roll sync
        if rolled:
            # The sealed segment, so recovery can trust it. The batch is committed whatever
            # happens here: a failure (a full disk for the recovery point) must not make its
            # append look failed; the segment stays unsynced and the next sync retries it.
            try:
                self.sync_through(newest)
            except (OSError, ResourceExhausted) as error:
                LOG.warning("%s: syncing the segment sealed by a roll failed: %s", self, error)

    def _target_segment(
        self, incoming: int, now: int, next_base: int, last: int
    ) -> tuple[Segment, SegmentChange]:
        """The segment a batch goes to: the active one, or a new one that rolls it or replaces
        it (not yet installed: see ``LocalLog.install``)."""
        local = self.local
        active = local.active
        if not active.count:
            if active.base_offset < next_base:
                # An empty active segment takes the base of the first offset written to it
                # (gap-free naming after ``append_at`` leaves a gap at a segment start).
                return local.new_segment(next_base), SegmentChange.REPLACE
            return active, SegmentChange.NONE
        config = local.config
        oldest = active.oldest_timestamp
        too_old = oldest is not None and now - oldest >= config.segment_max_age_s * 1e9
        too_far = last - active.base_offset > 0xFFFFFFFF  # relative offsets are u32
        full = active.size + incoming > config.segment_max_bytes
        if not (full or too_old or too_far):
            return active, SegmentChange.NONE
        return local.new_segment(next_base), SegmentChange.ROLL

    def roll(self) -> None:
        """Seal the active segment now (if it holds anything) and start a new one."""
        local = self.local
        with local.lock:
            local.check_open()
            if not local.active.count:
                return
            local.roll(local.next_offset)
            newest = local.next_offset - 1
        self.sync_through(newest)

    # -- durability ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Sync everything appended so far (and, with ``ALWAYS``, commit it)."""
        local = self.local
        with local.lock:
            if local.closed:
                return
            newest = local.next_offset - 1
        self.sync_through(newest)

    def sync_through(self, offset: int) -> None:
        local = self.local
        with local.sync_lock:
            with local.lock:
                if local.closed:
                    return
                if self.synced >= offset and not local.unsynced_sealed:
                    return
                target = local.next_offset - 1
                target_timestamp = local.last_timestamp
                sealed, local.unsynced_sealed = local.unsynced_sealed, []
                active = local.active if target > self.synced else None
            try:
                for segment in sealed:
                    segment.sync_all()
                if active is not None:
                    active.sync()
                if sealed:
                    sync_dir(local.directory)
                    write_recovery_point(local.directory, max(s.newest_offset for s in sealed))
            except BaseException as error:
                with local.lock:  # still unsynced: the next sync tries them again
                    again = [s for s in sealed if s in local.segments]
                    local.unsynced_sealed = again + local.unsynced_sealed
                if isinstance(error, ResourceExhausted) and not isinstance(error, SyncFailed):
                    # A recovery point that could not be written, a segment that could not be
                    # reopened: what this sync covers was written all the same.
                    raise SyncFailed(error.resource, error.path, error.reason) from error
                raise
            with local.lock:
                self.synced = max(self.synced, target)
                advanced = (
                    local.config.flush_policy is FlushPolicy.ALWAYS
                    and target > self.committed
                    and self._commit_locked(target, target_timestamp)
                )
        if advanced:
            self.notify(target)

    def truncate_to(self, offset: int) -> None:
        """See ``SegmentedLog.truncate_to``."""
        local = self.local
        with local.sync_lock, local.lock:
            local.check_open()
            if offset >= local.next_offset:
                return
            self.newest = None
            oldest = local.oldest_offset()
            if offset < oldest:
                raise OffsetOutOfRange(
                    f"cannot truncate to offset {offset}: the log starts at {oldest}"
                )
            # First, nothing at or above the cut may count as synced after a crash.
            if read_recovery_point(local.directory) >= offset:
                write_recovery_point(local.directory, offset - 1)
            # The segment the cut falls in: the newest one starting below it that keeps a
            # record (the first one always stays, emptied when the cut is the oldest offset).
            keep = max(bisect.bisect_left(local.bases, offset), 1)
            while True:
                slot = local.checked(local.segments[keep - 1]).slot_at_or_after(offset)
                if slot or keep == 1:
                    break
                keep -= 1
            try:
                local.drop_newest(len(local.segments) - keep)
                cut = local.active
                cut.unseal()
                local.unsynced_sealed = [s for s in local.unsynced_sealed if s is not cut]
                cut.truncate(slot)
                cut.sync_all()
                sync_dir(local.directory)
            finally:  # a failure part-way (no descriptor, a full disk) leaves a shorter log
                local.next_offset = max(local.newest_written + 1, local.active.base_offset)
                local.last_timestamp = max(
                    (t for s in local.segments if (t := s.newest_timestamp) is not None),
                    default=0,
                )
                newest = local.next_offset - 1
                self.committed = min(self.committed, newest)
                if self.high_watermark > newest:
                    self.high_watermark = newest
                    self.high_watermark_timestamp = local.last_timestamp
                self.synced = min(self.synced, newest)

    # -- committed-offset notification -----------------------------------------------------------

    def add_listener(self, listener: Callable[[int], None]) -> None:
        with self.local.lock:
            self.listeners = [*self.listeners, listener]

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        with self.local.lock:
            self.listeners = [x for x in self.listeners if x != listener]

    def notify(self, high_watermark: int) -> None:
        for listener in self.listeners:
            listener(high_watermark)

    def wait_for_offset(self, offset: int, timeout: float | None = None) -> bool:
        local = self.local
        with local.lock:
            return (
                local.committed.wait_for(
                    lambda: local.closed or self.high_watermark >= offset, timeout
                )
                and not local.closed
            )

    def __repr__(self) -> str:
        return repr(self.local)
