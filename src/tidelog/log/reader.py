"""Forward and reverse readers: cursors that pull verified batches from a log.

They are separate classes on purpose (no direction flag on the hot path) and share nothing but the
log's two read primitives, ``read_forward`` and ``read_backward``, each one index lookup and one
``pread`` per batch. Stop bounds are inclusive and applied with inequalities over whole batches, so
a bound that falls inside an offset gap ends the read correctly.

A forward reader may *read ahead* (``readahead_bytes``): one log read of that many bytes,
verified at once (``record.verify_records``: every record's CRC in one native call,
``crcs.py``), handed out in the pieces its caller asks for, each cut to
its own bytes. What is read ahead was committed when it was read, so handing it out later
delivers nothing a direct read would not; ``next_offset`` and ``done`` describe what has been
handed out. The bytes held ahead are leased from a process-wide budget (``readahead.py``): with
the budget spent, a reader reads piece by piece, so idle readers cannot hold memory without bound.

A forward reader that has caught up returns empty batches; ``wait()`` blocks until the log commits
its next offset (the log's condition variable, no polling), and an asyncio caller can use the log's
listeners instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import numpy as np

from tidelog.errors import CorruptRecord, OffsetOutOfRange, TidelogWarning
from tidelog.log.batch import MessageBatch
from tidelog.log.readahead import READAHEAD, Lease
from tidelog.log.record import Record

if TYPE_CHECKING:
    from tidelog.log.segmented import SegmentedLog

_NO_LIMIT: Final = 2**63 - 1
DEFAULT_MAX_MESSAGES: Final = 1000
DEFAULT_MAX_BYTES: Final = 1 << 20


def _warn_swapped(what: str) -> None:
    warnings.warn(
        f"{what}: swapped bounds read nothing (direction is in the reader's name)",
        TidelogWarning,
        stacklevel=4,
    )


def _check_offset(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise OffsetOutOfRange(f"{name} must be >= 0, got {value}")


class ForwardReader:
    """Ascending offsets from ``start_offset`` through the stop bounds (inclusive).

    ``readahead_bytes`` (0: none): read up to that many bytes from the log at once, and at most
    as many records as the pieces asked for would hold (module docstring).
    """

    def __init__(
        self,
        log: SegmentedLog,
        start_offset: int,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
        past_limit: bool = False,
        readahead_bytes: int = 0,
    ) -> None:
        _check_offset("start_offset", start_offset)
        _check_offset("stop_offset", stop_offset)
        self._log = log
        self._past_limit = past_limit
        self._readahead_bytes = readahead_bytes
        self._ahead = MessageBatch.empty()
        """The last read ahead (ascending, verified); records from ``_at`` on are not handed
        out yet."""
        self._at = 0
        self._lease: Lease | None = None
        """The budget's bytes ``_ahead`` holds (``readahead.py``); dropped with the reader."""
        self._next = start_offset
        self._stop_offset = _NO_LIMIT if stop_offset is None else stop_offset
        self._stop_timestamp = stop_timestamp
        self._done = self._next > self._stop_offset
        if self._done:
            _warn_swapped(f"forward read from {start_offset} stops at {stop_offset}, below it")

    @property
    def next_offset(self) -> int:
        """The lowest offset the next read may return."""
        return int(self._ahead.offsets[self._at]) if self._at < len(self._ahead) else self._next

    @property
    def done(self) -> bool:
        return self._done and self._at >= len(self._ahead)

    def read(
        self, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> MessageBatch:
        if self._at < len(self._ahead):
            return self._hand_out(max_messages, max_bytes)
        if self._readahead_bytes > max_bytes:
            lease = READAHEAD.lease(self._readahead_bytes)
            if lease is not None:  # else the process holds its budget ahead: read a piece
                try:
                    self._ahead = self._read_log(
                        max_messages * -(-self._readahead_bytes // max_bytes),
                        self._readahead_bytes,
                    )
                except CorruptRecord:
                    # A damaged record in the span must not hold back the good ones before it:
                    # read piece by piece from here on, which hands them out and then raises
                    # at the damaged record, exactly as a reader without read-ahead does.
                    self._readahead_bytes = 0
                    return self._read_log(max_messages, max_bytes)
                self._at, self._lease = 0, lease
                return self._hand_out(max_messages, max_bytes)
        return self._read_log(max_messages, max_bytes)

    def _hand_out(self, max_messages: int, max_bytes: int) -> MessageBatch:
        """The next records read ahead that fit the limits (at least one), cut to their bytes."""
        span, at = self._ahead, self._at
        if at >= len(span):  # the read ahead found nothing: hold no lease while waiting
            self._drop_ahead()
            return MessageBatch.empty()
        ends = np.cumsum(span.sizes[at : at + max_messages])
        end = at + max(int(np.searchsorted(ends, max_bytes, side="right")), 1)
        piece = span.cut(at, end)
        if end >= len(span):
            self._drop_ahead()
        else:
            self._at = end
        return piece

    def _drop_ahead(self) -> None:
        """Forget the span read ahead (all handed out) and give its lease back."""
        self._ahead, self._at = MessageBatch.empty(), 0
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def _read_log(self, max_messages: int, max_bytes: int) -> MessageBatch:
        if self._done:
            return MessageBatch.empty()
        batch, high_watermark, newest_timestamp = self._log.read_forward(
            self._next, self._stop_offset, max_messages, max_bytes, self._past_limit
        )
        if not batch:
            # Nothing in [next, stop] now. If the committed log already reaches past a stop bound,
            # nothing ever will: the rest of the range is a gap, or every later record is newer
            # (timestamps never decrease).
            past_stop = high_watermark >= self._stop_offset or (
                self._stop_timestamp is not None and newest_timestamp > self._stop_timestamp
            )
            if past_stop:
                self._done = True
            return batch
        if self._stop_timestamp is not None:
            keep = int(np.searchsorted(batch.timestamps, self._stop_timestamp, side="right"))
            if keep < len(batch):
                self._done = True
                if keep == 0:
                    return MessageBatch.empty()
                batch = batch.head(keep)
        self._next = batch.last_offset + 1
        if self._next > self._stop_offset:
            self._done = True
        return batch

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the next offset is committed; False on timeout, close or when done."""
        if self._at < len(self._ahead):
            return True
        if self._done:
            return False
        return self._log.wait_for_offset(self._next, timeout)

    def __iter__(self) -> Iterator[MessageBatch]:
        while batch := self.read():
            yield batch

    def records(self) -> Iterator[Record]:
        """Every record available now, one at a time (convenient, slower than batches)."""
        for batch in self:
            yield from batch.records()


class ReverseReader:
    """Descending offsets from ``start_offset`` (default: the high watermark) through the stops."""

    def __init__(
        self,
        log: SegmentedLog,
        start_offset: int | None = None,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
    ) -> None:
        _check_offset("start_offset", start_offset)
        _check_offset("stop_offset", stop_offset)
        self._log = log
        self._top = _NO_LIMIT if start_offset is None else start_offset
        self._lowest = 0 if stop_offset is None else stop_offset
        self._stop_timestamp = stop_timestamp
        self._done = self._top < self._lowest
        if self._done:
            _warn_swapped(f"reverse read from {start_offset} stops at {stop_offset}, above it")

    @property
    def next_offset(self) -> int:
        """The highest offset the next read may return."""
        return self._top

    @property
    def done(self) -> bool:
        return self._done

    def read(
        self, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> MessageBatch:
        if self._done:
            return MessageBatch.empty()
        batch = self._log.read_backward(self._top, self._lowest, max_messages, max_bytes)
        if not batch:
            self._done = True  # nothing committed at or below the top: past the oldest record
            return batch
        if self._stop_timestamp is not None:
            keep = int(np.count_nonzero(batch.timestamps >= self._stop_timestamp))
            if keep < len(batch):
                self._done = True
                if keep == 0:
                    return MessageBatch.empty()
                batch = batch.head(keep)
        self._top = batch.last_offset - 1
        if self._top < self._lowest:
            self._done = True
        return batch

    def __iter__(self) -> Iterator[MessageBatch]:
        while batch := self.read():
            yield batch

    def records(self) -> Iterator[Record]:
        """Every remaining record, newest first, one at a time."""
        for batch in self:
            yield from batch.records()
