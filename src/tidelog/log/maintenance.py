"""Maintenance of a log, driven from outside it: the over-age roll, retention, releases and
compaction.

The decisions are pure functions elsewhere (``retention.expired_prefix``, ``compaction.keep_mask``);
this module applies them to a log's :class:`LocalLog` under its locks. Invariants: only sealed
segments are ever deleted or rewritten (never the active one, never anything at or above the high
watermark for compaction), retention deletes a prefix so the log stays contiguous, and a
compaction swap that fails half-way leaves the files to recovery (the log is closed without
writing, and the next open finishes or undoes the swap).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np

from tidelog.errors import ResourceExhausted
from tidelog.log.batch import MessageBatch
from tidelog.log.compaction import (
    CompactionReport,
    Step,
    finish_swaps,
    keep_mask,
    latest_offsets,
    swap_in,
    write_cleaned,
)
from tidelog.log.local import LocalLog
from tidelog.log.reads import Slice, verified
from tidelog.log.retention import SegmentSummary, expired_prefix, released_prefix
from tidelog.log.segment import Segment, segment_name
from tidelog.log.writer import LogWriter

LOG = logging.getLogger("tidelog.log")


def roll_if_over_age(writer: LogWriter, now: int) -> None:
    """Roll the active segment once its oldest record is older than ``segment_max_age_s``.

    A failed roll (a full disk) is logged, not raised: retention, which frees space, must run
    after it all the same."""
    local = writer.local
    with local.lock:
        local.check_open()
        oldest = local.active.oldest_timestamp
        if oldest is None or now - oldest < local.config.segment_max_age_s * 1e9:
            return
        try:
            local.roll(local.next_offset)
        except (OSError, ResourceExhausted) as error:
            LOG.warning("%s: could not roll the over-age segment: %s", local, error)
            return
        newest = local.next_offset - 1
    writer.sync_through(newest)


def enforce_retention(local: LocalLog, now: int) -> list[int]:
    """Delete the sealed segments the retention limits expire; return their base offsets."""
    config = local.config
    with local.sync_lock, local.lock:
        local.check_open()
        summaries = [
            SegmentSummary(s.base_offset, s.size, s.count, s.newest_timestamp)
            for s in local.segments
        ]
        doomed = expired_prefix(
            summaries[:-1],
            summaries[-1],
            retention_bytes=config.retention_bytes,
            retention_messages=config.retention_messages,
            retention_age_s=config.retention_age_s,
            now_ns=now,
        )
        removed = local.drop_oldest(doomed)
    return [s.base_offset for s in removed]


def release_before(local: LocalLog, offset: int, high_watermark: int) -> list[int]:
    """Delete the sealed segments whose records all lie below ``offset`` (and at or below the
    high watermark); return their base offsets. The same prefix deletion as retention, under
    the same locks."""
    with local.sync_lock, local.lock:
        local.check_open()
        below = min(offset, high_watermark + 1)
        removed = local.drop_oldest(released_prefix(local.bases, below))
    return [s.base_offset for s in removed]


def compact(
    local: LocalLog,
    high_watermark: Callable[[], int],
    committed: Callable[[int], Iterable[MessageBatch]],
    abandon: Callable[[], None],
    step: Step | None = None,
) -> CompactionReport:
    """Rewrite sealed segments keeping the latest record per key (see ``compaction.py``).

    ``committed(high_watermark)`` reads the log forward up to it; ``abandon`` closes the log
    without writing (both locks held) when a swap fails. Records without a key and everything at
    or above the high watermark stay. The heavy work (reading, deciding, writing ``.cleaned``
    files) happens outside the log's lock, so appends and reads go on; only the swap takes it.
    """
    report = CompactionReport()
    with local.lock:
        local.check_open()
        hw = high_watermark()
        sealed = [s for s in local.segments[:-1] if s.count]
    if not sealed or hw < 0:
        return report
    latest = latest_offsets(committed(hw))
    for segment in sealed:
        with local.lock:
            if local.closed or segment not in local.segments:
                continue
            local.checked(segment)
            entries = segment.entries(0, segment.count)
            data = segment.read(0, segment.size)
        batch = verified(Slice(segment, data, entries, 0))
        keep = keep_mask(batch.offsets.tolist(), batch.keys(), latest, hw)
        if bool(keep.all()):
            continue
        new_size = _swap(local, segment, data, entries, keep, abandon, step)
        if new_size is None:
            continue
        report.segments_rewritten += 1
        report.records_removed += int((~keep).sum())
        report.bytes_removed += segment.size - new_size
    if report.segments_rewritten:
        LOG.info(
            "%s: compaction removed %d records (%d bytes) from %d segments",
            local.directory,
            report.records_removed,
            report.bytes_removed,
            report.segments_rewritten,
        )
    return report


def _swap(
    local: LocalLog,
    segment: Segment,
    data: bytes,
    entries: np.ndarray,
    keep: np.ndarray,
    abandon: Callable[[], None],
    step: Step | None,
) -> int | None:
    """Write ``segment``'s kept records as ``.cleaned`` files and swap them in; returns the new
    size, or None when the segment went away meanwhile (its cleaned files are discarded)."""
    name = segment_name(segment.base_offset)
    _, _, new_entries, new_size = write_cleaned(local.directory, name, data, entries, keep)
    with local.sync_lock, local.lock:
        if local.closed or segment not in local.segments:
            finish_swaps(local.directory)  # discards the .cleaned files
            return None
        segment.close()
        try:
            swap_in(local.directory, name, step)
        except BaseException:
            # The files are mid-swap: only recovery (reopening) may touch them now.
            abandon()
            raise
        rewritten = Segment(
            local.directory,
            segment.base_offset,
            count=len(new_entries),
            size=new_size,
            active=False,
            preallocate_bytes=local.config.index_preallocate_bytes,
            cache=local.file_cache,
            bounds=new_entries[[0, -1]] if len(new_entries) else None,
        )
        local.replace(segment, rewritten)
    return new_size
