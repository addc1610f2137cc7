"""``LocalLog``: the segments of one log directory, the log's end, and the lookups over them.

Invariants. ``segments`` are ordered by base offset and ``bases`` mirrors them one to one; the last
segment is the only active one (it may be empty). ``next_offset`` is one past the newest record
written (at least the active segment's base) and ``last_timestamp`` the newest record's timestamp,
which never decreases. ``unsynced_sealed`` holds the sealed segments not yet synced since they
were sealed. Every method runs with ``lock`` held unless its docstring says otherwise; ``sync_lock``
is always taken before ``lock`` (see ``segmented.py``).

This is the set of segments and nothing more: what is committed (the high watermark) is the
writer's (``writer.py``), reads are ``reads.py``'s, and maintenance is ``maintenance.py``'s.
"""

from __future__ import annotations

import enum
import logging
import threading
from pathlib import Path

from tidelog.errors import LogClosed
from tidelog.log.config import LogConfig
from tidelog.log.filecache import FileCache
from tidelog.log.recovery import verify_index
from tidelog.log.segment import Segment

LOG = logging.getLogger("tidelog.log")


class SegmentChange(enum.Enum):
    """What an append does to the segment list before its batch is written."""

    NONE = "none"
    ROLL = "roll"
    """A new segment after the active one, which is sealed."""
    REPLACE = "replace"
    """A new segment instead of the empty active one (a gap at the segment start)."""


class LocalLog:
    """The segments of one directory, under one lock (see the module's invariants)."""

    def __init__(
        self, directory: Path, config: LogConfig, file_cache: FileCache, segments: list[Segment]
    ) -> None:
        self.directory = directory
        self.config = config
        self.file_cache = file_cache
        self.lock = threading.Lock()
        self.sync_lock = threading.Lock()
        self.committed = threading.Condition(self.lock)
        """Notified whenever the high watermark moves and on close."""
        self.segments = segments
        if not self.segments:
            self.segments.append(self.new_segment(0))
        self.bases = [s.base_offset for s in self.segments]
        self.unsynced_sealed: list[Segment] = []
        self.closed = False
        self.oldest_at_close = 0
        newest = self.newest_written
        self.next_offset = max(newest + 1, self.active.base_offset)
        self.last_timestamp = max(
            (s.newest_timestamp for s in self.segments if s.newest_timestamp is not None),
            default=0,
        )

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def newest_written(self) -> int:
        """The newest offset any segment holds (the active base - 1 when none holds one)."""
        return max(
            (s.newest_offset for s in self.segments if s.count),
            default=self.active.base_offset - 1,
        )

    def check_open(self) -> None:
        if self.closed:
            raise LogClosed(f"log {self.directory} is closed")

    def oldest_offset(self) -> int:
        if self.closed:
            return self.oldest_at_close
        return next((s.oldest_offset for s in self.segments if s.count), self.next_offset)

    def checked(self, segment: Segment) -> Segment:
        """``segment``, once its whole index has been checked (``recovery.verify_index``)."""
        if not segment.verified:
            verify_index(segment)
        return segment

    # -- structure -------------------------------------------------------------------------------

    def new_segment(self, base: int) -> Segment:
        """A new, empty active segment with base offset ``base`` (nothing is left on disk if it
        cannot be created). Needs no lock: it is not in the list yet."""
        return Segment.create(
            self.directory,
            base,
            preallocate_bytes=self.config.index_preallocate_bytes,
            cache=self.file_cache,
        )

    def install(self, old: Segment, new: Segment, change: SegmentChange) -> bool:
        """Make ``new`` the active segment instead of ``old`` (for a roll ``old`` is sealed
        already). Nothing here can fail: returns whether ``old`` stays, sealed and unsynced."""
        if change is SegmentChange.NONE:
            return False
        self.segments[-1] = new
        self.bases[-1] = new.base_offset
        if change is SegmentChange.REPLACE:
            try:
                old.delete()
            except OSError as error:  # an empty segment left behind: recovery keeps it empty
                LOG.warning("%s: could not remove the replaced segment: %s", self, error)
            return False
        self.segments.insert(-1, old)
        self.bases.insert(-1, old.base_offset)
        self.unsynced_sealed.append(old)
        return True

    def roll(self, base: int) -> None:
        """Seal the active segment and start a new one at ``base``; if either fails (a full disk,
        no descriptors), the active segment stays as it was and no new one is left."""
        new = self.new_segment(base)
        old = self.active
        try:
            old.seal()
        except BaseException:
            new.delete()
            raise
        self.install(old, new, SegmentChange.ROLL)

    def replace(self, old: Segment, new: Segment) -> None:
        """Put ``new`` (a rewritten copy) where the sealed segment ``old`` was."""
        self.segments[self.segments.index(old)] = new
        self.unsynced_sealed = [s for s in self.unsynced_sealed if s is not old]

    def drop_oldest(self, count: int) -> list[Segment]:
        """Take the ``count`` oldest segments out of the log and delete their files."""
        removed = self.segments[:count]
        del self.segments[:count]
        del self.bases[:count]
        self.unsynced_sealed = [s for s in self.unsynced_sealed if s not in removed]
        for segment in removed:
            segment.delete()
        return removed

    def drop_newest(self, count: int) -> list[Segment]:
        """Take the ``count`` newest segments out of the log and delete their files, the newest
        first (a crash in between leaves a prefix of the log)."""
        removed = self.segments[len(self.segments) - count :]
        del self.segments[len(self.segments) - count :]
        del self.bases[len(self.bases) - count :]
        self.unsynced_sealed = [s for s in self.unsynced_sealed if s not in removed]
        for segment in reversed(removed):
            segment.delete()
        return removed

    def close_files(self) -> None:
        """Let go of every segment's files (closing; nothing is written)."""
        for segment in self.segments:
            segment.close()

    def __repr__(self) -> str:
        return f"SegmentedLog({str(self.directory)!r}, segments={len(self.segments)})"
