"""The commit log contract: what every implementation promises, bound by bound.

Vocabulary (``docs/glossary.md``): an *offset* numbers a message within one log; a *position* is a
byte location within one segment file. Offsets are assigned densely by :meth:`CommitLog.append`,
but a log may hold gaps (compaction, replicated appends, retention at the start); every method
below is correct over gaps. Broker timestamps are ns since the Unix epoch and never decrease
along offsets.

*Committed* means at or below the high watermark: the newest offset durable under the log's flush
policy. Every read and lookup here sees committed records only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from tidelog.log.batch import MessageBatch
from tidelog.log.compaction import CompactionReport
from tidelog.log.config import LogConfig
from tidelog.log.record import Int64Array, NewRecord


class Reader(Protocol):
    """A cursor over one log in one direction. Readers are not thread-safe; logs are."""

    @property
    def done(self) -> bool:
        """True once the reader has passed its stop bound (or, reverse, the oldest record)."""
        ...

    @property
    def next_offset(self) -> int:
        """Where the next read starts: the lowest offset it may return (forward) or the highest
        (reverse)."""
        ...

    def read(self, max_messages: int = 1000, max_bytes: int = 1 << 20) -> MessageBatch:
        """The next committed records in this reader's direction, from one segment.

        At most ``max_messages`` records and at most ``max_bytes`` bytes, except that one record is
        always returned whole even if larger. An empty batch means nothing is available now
        (forward: caught up; check ``done``) or the reader is done.
        """
        ...

    def __iter__(self) -> Iterator[MessageBatch]:
        """Batches until the reader is caught up or done (never blocks)."""
        ...


class AppendGuard(Protocol):
    """A caller's check and bookkeeping run under the log's lock around one append, so that no
    other append can come between the check, the write and the record of it (the broker's
    producer table uses it to append a producer's batch at most once)."""

    def check(self, next_offset: int) -> None:
        """Before anything is written: raise to write nothing (the exception reaches the
        appender). ``next_offset`` is the offset the batch's first message would get."""
        ...

    def written(self, offsets: range) -> None:
        """After the whole batch is written (not necessarily committed yet); must not raise."""
        ...


class CommitLog(Protocol):
    """An append-only, segmented, durable sequence of records."""

    @property
    def oldest_offset(self) -> int:
        """The first retained offset; equals ``next_offset`` when the log holds no record."""
        ...

    @property
    def newest_offset(self) -> int:
        """The last appended offset, committed or not; ``next_offset - 1`` when the log holds no
        record (-1 for a log that never held one)."""
        ...

    @property
    def next_offset(self) -> int:
        """The offset the next appended message receives."""
        ...

    @property
    def high_watermark(self) -> int:
        """The newest committed offset (-1 while none is): readers see offsets <= this."""
        ...

    @property
    def config(self) -> LogConfig:
        """The limits, retention and flush policy the log runs with."""
        ...

    @config.setter
    def config(self, config: LogConfig) -> None:
        """New limits and retention from the next operation on (the flush policy of the open
        stays)."""
        ...

    @property
    def size_bytes(self) -> int:
        """Bytes of record data held (index files not counted)."""
        ...

    def append(
        self,
        messages: Sequence[bytes | NewRecord],
        *,
        timestamp: int | None = None,
        expected_offset: int | None = None,
        atomic: bool = False,
        guard: AppendGuard | None = None,
    ) -> range:
        """Append ``messages`` as one batch (one write) and return the offsets they received.

        All or nothing: a message over ``max_messages_bytes`` raises ``MessageTooLarge`` and nothing
        is written. Returns once the batch is committed under the flush policy. An empty sequence
        returns an empty range. A batch never spans segments and is never visible to readers in
        part. ``atomic`` also makes it all or nothing across a crash: recovery keeps all of its
        records or none (without it, a torn write keeps the records written before the tear).
        ``timestamp`` replaces the clock (never below the newest timestamp); ``expected_offset``
        appends only if the first message would get that offset (else ``IncorrectOffset``);
        ``guard`` runs under the log's lock around the write.
        """
        ...

    def append_stamped(
        self,
        messages: Sequence[bytes | NewRecord],
        *,
        timestamp: int | None = None,
        expected_offset: int | None = None,
        atomic: bool = False,
        guard: AppendGuard | None = None,
    ) -> tuple[range, int]:
        """``append``, also returning the timestamp (ns) every record of the batch was stored
        with: what an acknowledgement reports, so a client can position a subscription by it.
        An empty sequence returns the newest timestamp (0 for an empty log)."""
        ...

    def append_at(
        self,
        messages: Sequence[bytes | NewRecord],
        offsets: Sequence[int],
        *,
        timestamp: int | None = None,
    ) -> None:
        """Append with caller-chosen offsets, strictly increasing from above the newest (a
        replica keeps its leader's offsets)."""
        ...

    def append_stored(self, data: bytes, sizes: Int64Array) -> MessageBatch:
        """Append records exactly as another log stored them (a replica copying its leader),
        after checking their CRCs; ``sizes[i]``: the bytes of record ``i`` in ``data``. Returns
        the records appended (their headers as checked)."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset`` (a replica cutting a divergent tail)."""
        ...

    def flush(self) -> None:
        """Sync everything appended so far (with ``always``, that commits it)."""
        ...

    def offset_at_or_after_timestamp(self, timestamp: int) -> int | None:
        """The first committed offset whose timestamp is >= ``timestamp``; None if there is none."""
        ...

    def offset_at_or_before_timestamp(self, timestamp: int) -> int | None:
        """The last committed offset whose timestamp is <= ``timestamp``; None if there is none."""
        ...

    def forward_reader(
        self,
        start_offset: int,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
        past_limit: bool = False,
        readahead_bytes: int = 0,
    ) -> Reader:
        """Read ascending offsets from ``start_offset`` (inclusive; below the oldest: from the
        oldest; inside a gap: from the next record) up to ``stop_offset`` and the last record with
        timestamp <= ``stop_timestamp`` (both inclusive; None: no bound). ``past_limit``: up to
        the newest committed record, above a commit limit too. ``readahead_bytes``: read and
        verify up to this many bytes at once and hand them out in the pieces asked for."""
        ...

    def reverse_reader(
        self,
        start_offset: int | None = None,
        *,
        stop_offset: int | None = None,
        stop_timestamp: int | None = None,
    ) -> Reader:
        """Read descending offsets from ``start_offset`` (inclusive; None or beyond the high
        watermark: from the high watermark) down to ``stop_offset`` and the first record with
        timestamp >= ``stop_timestamp`` (both inclusive), ending after the oldest record."""
        ...

    def wait_for_offset(self, offset: int, timeout: float | None = None) -> bool:
        """Block until ``offset`` is committed (True) or the timeout passes / the log closes."""
        ...

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(committed)`` after every commit and every raise of the commit limit
        (the argument is the newest committed offset; readers see it once the limit allows),
        from the thread that did it, outside the log's locks."""
        ...

    @property
    def committed_offset(self) -> int:
        """The newest committed record; above the high watermark while a commit limit holds."""
        ...

    def set_commit_limit(self, limit: int | None) -> None:
        """Readers (the high watermark) see no record above ``limit``; None: no limit."""
        ...

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        """Stop calling ``listener``."""
        ...

    def add_start_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(oldest_offset)`` each time segments are deleted from the start and the
        oldest offset moves up (retention, :meth:`release_before`: Kafka's log start offset),
        from the thread that deleted them, outside the log's locks. Compaction, which can empty
        old segments without deleting them, and a cut at the end (:meth:`truncate_to`) never
        call it."""
        ...

    def remove_start_listener(self, listener: Callable[[int], None]) -> None:
        """Stop calling ``listener``."""
        ...

    def maintain(self, now_ns: int | None = None) -> list[int]:
        """Roll an over-age active segment, then apply retention; the base offsets deleted."""
        ...

    def release_before(self, offset: int) -> list[int]:
        """Delete the whole sealed segments whose records all lie below ``offset`` (exclusive)
        and are committed: the owner needs none of them. The active segment and any segment
        holding an offset at or above ``offset`` stay, so the log may keep records below it.
        Returns the deleted segments' base offsets (empty when none qualifies)."""
        ...

    def compact(self) -> CompactionReport:
        """Keep the latest record per key in the sealed segments (below the high watermark)."""
        ...

    def close(self) -> None:
        """Sync, trim and close; further calls raise ``LogClosed``. Idempotent."""
        ...

    def delete(self) -> None:
        """Close without writing and remove the log's directory."""
        ...
