"""A page of a stream's messages merged across its partitions: newest first or oldest first.

Order: by broker timestamp, ties by partition number, then offset; newest first is the exact
reverse of oldest first. Each partition's records already lie in that order along its offsets
(timestamps never decrease), so the page is a k-way merge of one reader per partition — reverse
readers for newest first, forward readers for oldest first — and a page reads only as far into
each partition as the merge needs: the newest 50 of a stream never open its older segments.

Theory of the merge, by whole batches. Work in *oriented* keys ``(t, r, o)``: timestamp, partition
and offset, each negated for newest first, so that page order is always ascending. Each partition
holds one buffered batch (ascending in oriented keys); everything it will read later is above its
buffer's last key. So the *frontier* — the smallest last key among partitions that may still read
more — bounds what is safe: every buffered record at or below it precedes everything unread.
One round takes those records from every buffer (numpy ``searchsorted``), orders them with one
``lexsort``, applies the filter mask computed once per batch, and then cuts the round where the
page is full or the scan budget runs out. The partition that set the frontier is emptied, so every
round finishes at least one batch. Per record there is no Python work but for the records that
make the page.

Where a page starts: the newest or oldest record, a time (``start_ns``), an *anchor* — a point
``(t, p, o)`` of the merged order, as a row shows it — or a token. An anchor becomes one offset
per partition through its time index (:func:`anchored_offset`); ``t`` alone could not do it, for
many records share a timestamp (a ``publish_batch`` gives one to a whole request), and a
continuation from a time either repeats or skips the records of that timestamp.

Where the page ends is described by each partition's next offset (``tidelog.wire.browse_token``),
so pages concatenated are exactly the merged order, whatever their sizes and filters. At the live
end an oldest-first read stops at what is committed and still returns a token: the next page
continues with what arrives later. The whole read runs in a worker thread (logs are thread-safe;
readers are not shared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tidelog.broker.browse_filter import BrowseFilter
from tidelog.broker.config import (
    BROWSE_PAGE_BYTES,
    DEFAULT_BROWSE_LIMIT,
    DEFAULT_BROWSE_MAX_SCAN,
    DEFAULT_BROWSE_MAX_SCAN_SECONDS,
)
from tidelog.log import CommitLog, MessageBatch
from tidelog.log.contract import Reader
from tidelog.log.record import Record
from tidelog.wire.browse_token import BrowsePosition, encode_token

IntArray = npt.NDArray[np.intp]

FIRST_READ_MESSAGES = 64
"""A partition's first read: enough for a page of the default size, and cheap."""
MOST_READ_MESSAGES = 4096
"""Reads grow by doubling to this many records (a long scan costs per batch)."""
READ_BYTES_TOTAL = 16 << 20
"""What one browse may hold in buffered batches across partitions (each gets a share)."""
LEAST_READ_BYTES = 64 << 10


LAST_TIMESTAMP = 2**63 - 1
"""The greatest timestamp: an anchor there, oldest first, starts at the live end."""


@dataclass(frozen=True, slots=True)
class BrowseAnchor:
    """A point of the merged order: a message's timestamp, partition and offset. A page from it
    begins just past it in the page's direction, or at it with ``include``."""

    timestamp_ns: int
    partition: int
    offset: int
    include: bool = False


def anchored_offset(
    log: CommitLog, number: int, anchor: BrowseAnchor, newest_first: bool
) -> int | None:
    """Where partition ``number`` starts a page from ``anchor``: oldest first, its first
    committed offset sorting after the anchor (at it, with ``include``), the offset after the
    newest committed one when there is none yet (the live end); newest first, its last offset
    sorting before the anchor (at it, with ``include``), None when there is none.

    Sorting is by (timestamp, partition, offset): a lower partition than the anchor's sorts after
    it from the next timestamp on, a higher one from the same timestamp on, and the anchor's own
    partition from the next offset on (mirrored newest first)."""
    t, p = anchor.timestamp_ns, anchor.partition
    if newest_first:
        if number == p:
            top = anchor.offset if anchor.include else anchor.offset - 1
            return top if top >= max(log.oldest_offset, 0) else None
        if number < p:
            return log.offset_at_or_before_timestamp(t)
        return log.offset_at_or_before_timestamp(t - 1) if t > -LAST_TIMESTAMP else None
    end = log.high_watermark + 1  # read before the index: a record committed later lies past it
    if number == p:
        return min(anchor.offset if anchor.include else anchor.offset + 1, end)
    if number < p:
        found = log.offset_at_or_after_timestamp(t + 1) if t < LAST_TIMESTAMP else None
    else:
        found = log.offset_at_or_after_timestamp(t)
    return end if found is None else found


@dataclass(frozen=True, slots=True)
class BrowseQuery:
    """One page to read. ``start_ns`` (no token): newest first, records at or before it; oldest
    first, at or after it (None: from the newest / the oldest record). ``anchor`` (no token)
    starts at a point of the merged order instead (:func:`anchored_offset`). ``position``
    continues a previous page and overrides both."""

    partitions: tuple[int, ...]
    newest_first: bool = True
    limit: int = DEFAULT_BROWSE_LIMIT
    start_ns: int | None = None
    anchor: BrowseAnchor | None = None
    position: BrowsePosition | None = None
    filter: BrowseFilter = field(default_factory=BrowseFilter)
    max_scan: int = DEFAULT_BROWSE_MAX_SCAN
    max_scan_seconds: float = DEFAULT_BROWSE_MAX_SCAN_SECONDS
    page_bytes: int = BROWSE_PAGE_BYTES


@dataclass(frozen=True, slots=True)
class BrowsedRecord:
    partition: int
    record: Record


@dataclass(frozen=True, slots=True)
class BrowseResult:
    records: list[BrowsedRecord]
    """In page order."""
    position: BrowsePosition
    """Where the next page in the same direction starts (``finished``: nothing more)."""
    scanned: int
    """Records examined (passing the filter or not)."""
    budget_exhausted: bool
    """The scan stopped at its budget (messages or seconds) before the page was full."""
    reached_timestamp: int | None
    """The timestamp of the last record examined (None: none was)."""

    @property
    def next_token(self) -> str | None:
        """The token of the next page in the same direction; None when there is nothing more."""
        return None if self.position.finished else encode_token(self.position)


class _Cursor:
    """One partition's reader and its buffered batch, in oriented keys."""

    __slots__ = (
        "batch",
        "done",
        "exhausted",
        "index",
        "mask",
        "number",
        "offsets",
        "rank",
        "read_bytes",
        "read_messages",
        "reader",
        "stamps",
    )

    def __init__(self, number: int, reader: Reader | None, sign: int, read_bytes: int) -> None:
        self.number = number
        self.rank = sign * number
        self.reader = reader
        self.done = reader is None
        """The reader has nothing more, ever (reverse: past the oldest; forward: past until)."""
        self.exhausted = self.done
        """Nothing more for this page (forward: caught up with the committed records)."""
        self.batch = MessageBatch.empty()
        self.mask: npt.NDArray[np.bool_] | None = None
        self.stamps = np.empty(0, dtype=np.int64)
        self.offsets = np.empty(0, dtype=np.int64)
        self.index = 0
        self.read_messages = FIRST_READ_MESSAGES
        self.read_bytes = read_bytes

    @property
    def buffered(self) -> int:
        return len(self.stamps) - self.index

    def refill(self, sign: int, keep: BrowseFilter) -> None:
        """Read the next batch once the buffer is used up (nothing when exhausted)."""
        while self.buffered == 0 and not self.exhausted:
            assert self.reader is not None
            batch = self.reader.read(self.read_messages, self.read_bytes)
            self.read_messages = min(self.read_messages * 2, MOST_READ_MESSAGES)
            if not batch:
                self.exhausted = True
                self.done = self.reader.done
                return
            self.batch, self.index = batch, 0
            self.stamps = batch.timestamps * sign
            self.offsets = batch.offsets * sign
            self.mask = keep.mask(batch)

    def last_key(self) -> tuple[int, int, int]:
        return int(self.stamps[-1]), self.rank, int(self.offsets[-1])

    def count_through(self, frontier: tuple[int, int, int]) -> int:
        """Buffered records at or below ``frontier`` (a key of another partition, or this one's
        own last key)."""
        stamp, rank, _ = frontier
        if rank == self.rank:
            return self.buffered
        rest = self.stamps[self.index :]
        if self.rank < rank:  # this partition sorts first on a tie of timestamps
            return int(np.searchsorted(rest, stamp, side="right"))
        return int(np.searchsorted(rest, stamp, side="left"))

    def next_offset(self, newest_first: bool) -> int | None:
        """The next offset to read in this direction; None when there is none, ever."""
        if self.buffered:
            return int(self.batch.offsets[self.index])
        if self.done or self.reader is None:
            return None
        offset = self.reader.next_offset
        return offset if offset >= 0 or not newest_first else None


def _reader(
    log: CommitLog, number: int, query: BrowseQuery, offset: int | None, fresh: bool
) -> Reader | None:
    """The partition's reader from ``offset`` (a token's) or, when ``fresh``, from the start."""
    since, until = query.filter.since_ns, query.filter.until_ns
    if fresh and query.anchor is not None:
        return _anchored_reader(log, number, query, query.anchor)
    if query.newest_first:
        if fresh:
            tops = [t for t in (query.start_ns, until) if t is not None]
            if tops:
                offset = log.offset_at_or_before_timestamp(min(tops))
                if offset is None:
                    return None  # every record is newer than the top
        return log.reverse_reader(offset, stop_timestamp=since)
    if fresh:
        bottoms = [t for t in (query.start_ns, since) if t is not None]
        if bottoms:
            found = log.offset_at_or_after_timestamp(max(bottoms))
            # Nothing that late yet: the page is empty, and the token waits at the live end.
            offset = log.high_watermark + 1 if found is None else found
        else:
            offset = log.oldest_offset
    assert offset is not None
    return log.forward_reader(offset, stop_timestamp=until)


def _anchored_reader(
    log: CommitLog, number: int, query: BrowseQuery, anchor: BrowseAnchor
) -> Reader | None:
    """The partition's reader from ``anchor``, within the filter's time range."""
    since, until = query.filter.since_ns, query.filter.until_ns
    offset = anchored_offset(log, number, anchor, query.newest_first)
    if query.newest_first:
        if until is not None and offset is not None:
            last = log.offset_at_or_before_timestamp(until)
            offset = None if last is None else min(offset, last)
        if offset is None:
            return None
        return log.reverse_reader(offset, stop_timestamp=since)
    assert offset is not None
    if since is not None:
        first = log.offset_at_or_after_timestamp(since)
        offset = max(offset, log.high_watermark + 1 if first is None else first)
    return log.forward_reader(offset, stop_timestamp=until)


def browse(
    stream: str,
    logs: dict[int, CommitLog],
    query: BrowseQuery,
    clock: Callable[[], float] = time.monotonic,
) -> BrowseResult:
    """Read one page of ``query`` from ``logs`` (partition number -> its open log, the
    partitions the query names). Blocking: call it in a worker thread."""
    started = clock()
    sign = -1 if query.newest_first else 1
    share = max(READ_BYTES_TOTAL // max(len(logs), 1), LEAST_READ_BYTES)
    starts: dict[int, int | None] = dict(query.position.offsets) if query.position else {}
    cursors: list[_Cursor] = []
    for number in sorted(logs):
        if query.position is None:
            reader = _reader(logs[number], number, query, None, fresh=True)
        elif starts.get(number) is None:
            reader = None
        else:
            reader = _reader(logs[number], number, query, starts[number], fresh=False)
        cursors.append(_Cursor(number, reader, sign, share))

    taken: list[tuple[int, Record]] = []
    page_count = page_bytes = scanned = 0
    reached: int | None = None
    out_of_budget = page_full = False
    while True:
        for cursor in cursors:
            cursor.refill(sign, query.filter)
        live = [c for c in cursors if c.buffered]
        if not live:
            break
        which, local, passed = _round(live)
        cut = min(len(which), query.max_scan - scanned)
        hits = np.flatnonzero(passed[:cut])
        wanted = query.limit - page_count  # >= 1: a full page ends the loop
        if len(hits) >= wanted:
            hits = hits[:wanted]
            cut = int(hits[-1]) + 1
            page_full = True
        if len(hits):
            sizes = np.fromiter(
                (live[k].batch.sizes[i] for k, i in zip(which[hits], local[hits], strict=True)),
                dtype=np.int64,
                count=len(hits),
            )
            over = np.flatnonzero(np.cumsum(sizes) + page_bytes > query.page_bytes)
            if len(over):
                # The page ends before the first record that would overflow it (one record
                # always goes whole).
                keep = max(int(over[0]), 0 if page_count else 1)
                if keep < len(hits):
                    cut = int(hits[keep])
                    hits = hits[:keep]
                    page_full = True
            page_bytes += int(sizes[: len(hits)].sum())
        for k, cursor in enumerate(live):
            chosen = local[hits][which[hits] == k]
            if len(chosen):
                # Copied out now, so the page never pins the batches it came from.
                taken.extend((cursor.number, r) for r in cursor.batch.take(chosen).records())
        # Records of one partition appear in its own order in the round, so the count of each
        # partition's records before the cut is how far its buffer was consumed.
        consumed = np.bincount(which[:cut], minlength=len(live))
        for cursor, n in zip(live, consumed.tolist(), strict=True):
            cursor.index += n
        page_count += len(hits)
        scanned += cut
        if cut:
            k, i = int(which[cut - 1]), int(local[cut - 1])
            reached = int(live[k].batch.timestamps[i])
        if page_full:
            break
        if scanned >= query.max_scan or clock() - started >= query.max_scan_seconds:
            out_of_budget = any(c.buffered or not c.exhausted for c in cursors)
            break

    position = BrowsePosition(
        stream,
        query.newest_first,
        tuple((c.number, c.next_offset(query.newest_first)) for c in cursors),
    )
    return BrowseResult(
        _in_page_order(taken, sign),
        position,
        scanned,
        out_of_budget,
        reached,
    )


def _round(live: list[_Cursor]) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
    """The records of ``live`` (cursors holding some) that are safe to take now, in page order:
    for each, which cursor holds it, its index in that cursor's batch, and whether it passes the
    filter."""
    open_ended = [c for c in live if not c.exhausted]
    frontier = min(c.last_key() for c in open_ended) if open_ended else None
    counts = [c.buffered if frontier is None else c.count_through(frontier) for c in live]
    spans = [(c, c.index, c.index + n) for c, n in zip(live, counts, strict=True)]
    stamps = np.concatenate([c.stamps[a:b] for c, a, b in spans])
    offsets = np.concatenate([c.offsets[a:b] for c, a, b in spans])
    which = np.repeat(np.arange(len(live)), counts)
    order = np.lexsort((offsets, np.array([c.rank for c in live])[which], stamps))
    which = which[order]
    local = (np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts))[order]
    local += np.array([c.index for c in live])[which]
    passed = np.ones(len(order), dtype=np.bool_)
    for k, cursor in enumerate(live):
        if cursor.mask is not None:
            mine = which == k
            passed[mine] = cursor.mask[local[mine]]
    return which, local, passed


def _in_page_order(taken: list[tuple[int, Record]], sign: int) -> list[BrowsedRecord]:
    """The chosen records of every round in page order (a sort of at most one page)."""
    taken.sort(key=lambda pair: (pair[1].timestamp, pair[0], pair[1].offset), reverse=sign < 0)
    return [BrowsedRecord(number, record) for number, record in taken]
