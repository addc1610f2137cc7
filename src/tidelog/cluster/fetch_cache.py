"""The records a leader last sent to a follower, kept for the other followers' fetches.

Why. With three replicas both followers fetch the same records from their leader, usually from
the same offset and moments apart. Each fetch read them from the log, checked every record's
CRC and copied them into an answer: the same work twice, on the leader's event loop, the busiest
of the cluster under ack ALL (``docs/performance.md``, "Replication that keeps up"). A fetch
that starts inside the records sent last takes them from here, and reads from the log only what
lies past them.

Invariants. The cache holds one run of records exactly as the leader's log stores them (read
with their CRCs checked), none above the leader's committed offset when they were read. A
leader only appends in its epoch (a ``LeaderReplica`` is made for one epoch and never cuts its
log; retention and releases remove whole segments from the start, below which a follower is sent
nothing it does not get from the log as well), so a cached record is the record its offset holds
in the leader's log. Offsets are read from the records' own headers: a gap in the log (a
compacted range, a gap a replica keeps) is never filled. The cache is dropped once no other
follower may ask for its records, so an idle partition holds none.

Bound. A cache holds up to a fetch's bytes (``replication.FETCH_MAX_BYTES``, 4 MiB) while another
in-sync follower lags, per led partition: thousands of partitions would hold gigabytes. So its
bytes are leased from one process budget (:data:`FETCH_CACHE`, :data:`FETCH_CACHE_BYTES`), as
forward readers lease what they read ahead (``tidelog.log.readahead``). A run the budget has no
room for is not kept (each follower then reads it from the log, as before the cache); a cache
gives its lease back when it is replaced or cleared, or dropped with its leader. Invariant: the
caches of a process hold at most :data:`FETCH_CACHE_BYTES` of records together.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog.broker import Lease, ReadAheadBudget
from tidelog.cluster.stored import OFFSET_AT, StoredRecords

FETCH_CACHE_BYTES: Final = 64 << 20
"""At most this many record bytes kept over all the led partitions' caches of a process (16
full fetches; a partition whose followers keep pace holds far less than a full one)."""

FETCH_CACHE: Final = ReadAheadBudget(FETCH_CACHE_BYTES)
"""The budget every :class:`SentRecords` of this process leases from unless given another."""

_OFFSET_BYTES = np.arange(OFFSET_AT, OFFSET_AT + 8, dtype=np.int64)


def record_offsets(records: StoredRecords) -> npt.NDArray[np.int64]:
    """The offset of every record of ``records``: as its reader gave them, else from their
    stored headers."""
    if records.offsets is not None:
        return records.offsets.astype(np.int64, copy=False)
    if not len(records):
        return np.empty(0, dtype=np.int64)
    starts = np.cumsum(records.sizes) - records.sizes
    raw = np.frombuffer(records.data, dtype=np.uint8)
    offsets: npt.NDArray[np.int64] = (
        raw[starts[:, None] + _OFFSET_BYTES].copy().view("<i8").reshape(-1).astype(np.int64)
    )
    return offsets


class SentRecords:
    """The run of records a leader sent last (empty at first), for the next fetch from inside
    it (module docstring)."""

    def __init__(self, budget: ReadAheadBudget | None = None) -> None:
        """``budget``: what the kept bytes are leased from (None: :data:`FETCH_CACHE`)."""
        self._budget = FETCH_CACHE if budget is None else budget
        self._lease: Lease | None = None
        self._records = StoredRecords()
        self._offsets: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._starts: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self.hits = 0
        """Fetches served (in part) from here: for tests and the benchmark's profile."""
        self.refused = 0
        """Runs not kept because the budget had no room for them."""

    @property
    def last_offset(self) -> int:
        """The newest cached record's offset (-1: none)."""
        return int(self._offsets[-1]) if len(self._offsets) else -1

    def put(self, records: StoredRecords) -> None:
        """Keep ``records`` (just read from the log, or served from here) instead, if the
        budget has room for them once the run kept now is given back; else keep none."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if records:
            self._lease = self._budget.lease(len(records.data))
            if self._lease is None:
                self.refused += 1
                records = StoredRecords()
        self._records = records
        self._offsets = record_offsets(records)
        self._starts = np.cumsum(records.sizes) - records.sizes

    def clear(self) -> None:
        self.put(StoredRecords())

    def take(self, start: int, max_records: int, max_bytes: int) -> StoredRecords:
        """The cached records from the first one at or after offset ``start`` on: at most
        ``max_records`` and ``max_bytes`` (at least one record, whatever its size, unless none is
        asked for). Empty when ``start`` is not inside the cached run (before its first offset,
        or past its last)."""
        offsets = self._offsets
        if (
            max_records <= 0
            or not len(offsets)
            or start < int(offsets[0])
            or start > int(offsets[-1])
        ):
            return StoredRecords()
        first = int(np.searchsorted(offsets, start))
        ends = self._starts[first:] + self._records.sizes[first:]
        base = int(self._starts[first])
        fits = int(np.searchsorted(ends - base, max_bytes, side="right"))
        count = max(1, min(max_records, fits, len(offsets) - first))
        end = int(ends[count - 1])
        self.hits += 1
        return StoredRecords(
            self._records.data[base:end]
            if (base, end) != (0, len(self._records.data))
            else self._records.data,
            self._records.sizes[first : first + count],
            offsets[first : first + count],
        )

    def crc_at(self, offset: int) -> int | None:
        """The stored CRC of the cached record at ``offset`` (None: not cached)."""
        offsets = self._offsets
        if not len(offsets) or offset < int(offsets[0]) or offset > int(offsets[-1]):
            return None
        at = int(np.searchsorted(offsets, offset))
        if int(offsets[at]) != offset:
            return None
        position = int(self._starts[at])
        return int.from_bytes(self._records.data[position : position + 4], "little")
