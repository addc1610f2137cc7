"""ISR replication of one partition, both ends, without the transport: what a leader answers a
replica fetch with, and what a follower does with the answer.

Theory of operation (``docs/cluster.md``; Kafka's and Liftbridge's ISR protocol):

- The **leader** appends as today. Each follower fetches from the offset after its last record,
  naming the leader epoch it believes current. A fetch with another epoch is refused
  (:class:`StaleEpoch`): a deposed leader's follower, or a follower that has not yet heard of a
  new election, must refresh before it may read. A fetch also tells the leader how far the
  follower's log reaches, and the **high watermark** is the smallest log end among the in-sync
  replicas (the leader included): the offset below which every ISR member holds every record.
  It never moves back, and it does not move while the ISR is smaller than ``min_isr``.
- A fetch answer carries the records exactly as the leader stored them (offsets, timestamps,
  flags and CRCs: the follower checks the CRCs and writes the bytes as they are), the high
  watermark, and the leader's epoch entries for the records it returns, so the follower's
  leader-epoch cache names the epoch that *wrote* each record, not the one it fetched under.
- A **follower** that starts following a leader (after its own start, or a leader change) first
  asks the leader where its own newest epoch ends, and truncates its log to that
  (``leader_epochs.truncation_offset``; to its high watermark when the leader knows no epoch so
  old). Only then does it fetch; it appends what it gets with the leader's offsets and
  timestamps, and keeps the high watermark it is told (never above its own log end).
- Epochs find where a follower's log left its leader's only when the two differ in *which epoch*
  wrote a record. A record the follower holds that no leader wrote (kept from a restart, a bug,
  a disk) can sit in the leader's current epoch with no sign in the epochs. So every fetch also
  names the CRC of the follower's record before ``fetch_offset`` (the CRC covers the offset, the
  timestamp and the bytes: equal CRCs, the same record); the leader compares it with its own
  record there and, when they differ, answers ``diverged`` and nothing else, before the fetch
  counts as the follower's log end. The follower then cuts back, one record first and twice as
  many at each further ``diverged`` (a few round trips find any divergence point), and fetches
  again from there.

Both ends are plain objects over a partition's log: the follower's fetch loop (``follower.py``)
and the leader's answers to it (``serving.py``) drive them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tidelog.broker import Partition
from tidelog.cluster.fetch_cache import SentRecords, record_offsets
from tidelog.cluster.leader_epochs import (
    UNDEFINED,
    EpochEnd,
    EpochEntry,
    LeaderEpochCache,
    truncation_offset,
)
from tidelog.cluster.stored import StoredRecords, crc_at, stored_bytes
from tidelog.durable import replace_json
from tidelog.errors import StaleEpoch

FETCH_MAX_RECORDS = 10_000
FETCH_MAX_BYTES = 4 << 20
"""A fetch answers at most this many record bytes (at least one record, whatever its size)."""


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    leader_epoch: int
    high_watermark: int
    records: StoredRecords
    epochs: Sequence[EpochEntry]
    """The leader's epoch entries covering ``records`` (oldest first)."""
    log_start: int = 0
    """The leader's oldest offset (a follower releases its whole segments below it)."""
    diverged: bool = False
    """The follower's record before the fetch offset is not the leader's record there."""


@dataclass(slots=True)
class _Follower:
    log_end: int = 0
    """The offset after the follower's newest record, as its last fetch said."""
    caught_up_s: float = field(default_factory=time.monotonic)
    """The last time it held everything the leader held (Kafka's rule: a fetch from the
    leader's log end at the previous fetch means the follower had caught up by then)."""
    last_fetch_s: float = 0.0
    leader_end_at_last_fetch: int = -1
    waiting: int = 0
    """Its fetches held at the leader's log end now (:meth:`LeaderReplica.hold`): while one
    waits, the follower has everything the leader has."""
    sent: tuple[int, int] = (-1, 0)
    """(offset, CRC) of the last record this leader sent it: a fetch from the next offset
    naming that CRC holds this leader's record there (a leader never rewrites its log)."""

    def current(self, now: float, max_lag_s: float) -> bool:
        """Caught up within ``max_lag_s`` of ``now``, or waiting at the log end."""
        return self.waiting > 0 or now - self.caught_up_s <= max_lag_s


def _cache_path(partition: Partition) -> Path:
    return partition.directory / "leader-epochs.json"


def load_epochs(partition: Partition) -> LeaderEpochCache:
    return LeaderEpochCache.load(_cache_path(partition))


def save_epochs(partition: Partition, cache: LeaderEpochCache) -> None:
    cache.save(_cache_path(partition), replace_json)


class LeaderReplica:
    def __init__(
        self,
        partition: Partition,
        broker_id: str,
        leader_epoch: int,
        isr: Sequence[str],
        *,
        high_watermark: int = -1,
        min_isr: int = 1,
        clock: Callable[[], float] = time.monotonic,
        on_advance: Callable[[int], None] | None = None,
    ) -> None:
        """``high_watermark``: what this replica knew as a follower (it never moves back).
        ``on_advance(high_watermark)``: called each time the high watermark rises, once it
        is set (the role releases the publishes waiting for it)."""
        self._on_advance = on_advance
        self.partition = partition
        self.broker_id = broker_id
        self.leader_epoch = leader_epoch
        self.isr = set(isr) | {broker_id}
        self.min_isr = min_isr
        self._clock = clock
        self._followers: dict[str, _Follower] = {}
        self._sent = SentRecords()
        """What the last fetch was sent, for the other followers' fetches (``fetch_cache``)."""
        log = partition.log
        self.epochs = load_epochs(partition)
        self.epochs.truncate_from_start(log.oldest_offset)  # a trim a restart lost
        # A new leader's epoch starts at its log end, before it writes anything (durably: a
        # follower asking about older epochs must get the same answer after a restart).
        self.epochs.assign(leader_epoch, log.next_offset)
        save_epochs(partition, self.epochs)
        self.high_watermark = min(high_watermark, log.committed_offset)
        log.set_commit_limit(self.high_watermark)
        self.advance()

    def set_isr(self, isr: Sequence[str], min_isr: int | None = None) -> None:
        """The ISR as the metadata store now holds it (after a shrink or an expand)."""
        self.isr = set(isr) | {self.broker_id}
        if min_isr is not None:
            self.min_isr = min_isr
        self.advance()

    def advance(self) -> int:
        """Raise the high watermark to the smallest ISR log end (not while the ISR is below
        ``min_isr``), and let readers of the leader's log see that far; returns it. Called on
        every fetch and every local commit (a leader alone in its ISR has no fetches)."""
        if len(self.isr) >= self.min_isr:
            floor = self._hw_floor()
            if floor > self.high_watermark:
                self.high_watermark = floor
                self.partition.log.set_commit_limit(floor)
                if self._on_advance is not None:
                    self._on_advance(floor)
        return self.high_watermark

    @property
    def epoch_start(self) -> int:
        """The offset this leader's epoch starts at (its log end when it became leader)."""
        return self.epochs.entries[-1].start_offset

    @property
    def log_end(self) -> int:
        """The offset after the leader's newest committed record."""
        return self.partition.log.committed_offset + 1

    def follower_ends(self) -> dict[str, int]:
        """Each follower's log end as its last fetch said."""
        return {member: state.log_end for member, state in self._followers.items()}

    def _hw_floor(self) -> int:
        """What the high watermark may be at most now: the smallest ISR log end, less one."""
        log = self.partition.log
        ends = [log.committed_offset + 1]
        for member in self.isr - {self.broker_id}:
            ends.append(self._followers.get(member, _Follower()).log_end)
        return min(ends) - 1

    def fetch(
        self,
        follower: str,
        leader_epoch: int,
        from_offset: int,
        max_records: int = FETCH_MAX_RECORDS,
        *,
        again: bool = False,
        previous_crc: int | None = None,
    ) -> FetchAnswer:
        """What a follower's fetch from ``from_offset`` gets. ``again``: the same fetch, held at
        the log end, looked at once more; it is not a new fetch, so it tells the leader nothing
        of the follower (a follower counts caught up by its fetches' arrivals, as in Kafka, and
        while one is held: :meth:`hold`). ``previous_crc``: the CRC of the follower's record at
        ``from_offset - 1`` (None: not told, or it holds none); when the leader's record there
        differs the answer is ``diverged``, and the fetch says nothing of the follower's log."""
        if leader_epoch != self.leader_epoch:
            raise StaleEpoch(leader_epoch, self.leader_epoch)
        log = self.partition.log
        if (
            previous_crc is not None
            and not again
            and self._followers.get(follower, _Follower()).sent != (from_offset - 1, previous_crc)
            and self._diverges(from_offset, previous_crc)
        ):
            # It holds a record no leader wrote: not in sync, whatever it held before, until it
            # has cut it and caught up again (it must not be elected while it re-copies).
            state = self._followers.setdefault(follower, _Follower())
            state.caught_up_s = -math.inf
            state.leader_end_at_last_fetch = -1
            return FetchAnswer(
                self.leader_epoch,
                self.high_watermark,
                StoredRecords(),
                [],
                log.oldest_offset,
                diverged=True,
            )
        if not again:
            self.acknowledge(follower, from_offset)
        return self.send(follower, from_offset, max_records)

    def acknowledge(
        self, follower: str, log_end: int, *, caught_up_at: float | None = None
    ) -> None:
        """``follower``'s log ends at ``log_end`` now, as a fetch from there (or a replication
        stream's acknowledgement) says: its progress and whether it has caught up, and the high
        watermark moved by them. ``caught_up_at``: a time (:meth:`now`) at which the leader's
        log ended at or before ``log_end`` (a stream knows when it sent all the leader had)."""
        committed = self.partition.log.committed_offset
        state = self._followers.setdefault(follower, _Follower())
        state.log_end = log_end
        now = self._clock()
        if log_end > committed:
            state.caught_up_s = now
        elif log_end >= state.leader_end_at_last_fetch >= 0:
            # Not at the end now (the leader keeps appending), but it has everything the
            # leader had when it last fetched: it was caught up then.
            state.caught_up_s = max(state.caught_up_s, state.last_fetch_s)
        if caught_up_at is not None:
            state.caught_up_s = max(state.caught_up_s, caught_up_at)
        state.last_fetch_s = now
        state.leader_end_at_last_fetch = committed + 1
        self.advance()

    def now(self) -> float:
        """This leader's clock, which the followers' catching up is timed by."""
        return self._clock()

    def send(
        self,
        follower: str,
        from_offset: int,
        max_records: int = FETCH_MAX_RECORDS,
        max_bytes: int = FETCH_MAX_BYTES,
    ) -> FetchAnswer:
        """The committed records from ``from_offset`` on for ``follower`` (at most
        ``max_records`` and ``max_bytes``, at least one record): an answer that tells the leader
        nothing of the follower (:meth:`acknowledge` does)."""
        log = self.partition.log
        # A follower behind the leader's oldest record (retention, or the owner's releases,
        # removed what it lacks) is sent what the leader holds: its log keeps the gap, as
        # every replica's does, and it releases its own older segments (``log_start``).
        start = max(from_offset, log.oldest_offset)
        records = self._read(start, log.committed_offset, max_records, max_bytes)
        self._keep_sent(follower, records)
        if records:
            last_at = len(records.data) - int(records.sizes[-1])
            self._followers.setdefault(follower, _Follower()).sent = (
                records.offset_range()[1],
                crc_at(records.data, last_at),
            )
        return FetchAnswer(
            self.leader_epoch,
            self.high_watermark,
            records,
            self._epochs_for(records),
            log.oldest_offset,
        )

    def _read(self, start: int, committed: int, max_records: int, max_bytes: int) -> StoredRecords:
        """The stored records from ``start`` through at most ``committed``: first those the
        leader sent another follower last (``fetch_cache``), then the log's."""
        last = min(committed, start + max_records - 1)
        if start > last:
            return StoredRecords()
        sent = self._sent.take(start, max_records, max_bytes)
        parts: list[bytes] = []
        sizes: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        budget = max_bytes
        count = max_records
        if sent:
            parts.append(sent.data)
            sizes.append(sent.sizes)
            offsets.append(record_offsets(sent))
            budget -= len(sent.data)
            count -= len(sent)
            start = int(offsets[0][-1]) + 1
        if start <= last and budget > 0 and count > 0:
            reader = self.partition.log.forward_reader(start, stop_offset=last, past_limit=True)
            while budget > 0 and count > 0 and (batch := reader.read(count, budget)):
                parts.append(stored_bytes(batch.data, batch.positions, batch.sizes))
                sizes.append(batch.sizes)
                offsets.append(batch.offsets)
                budget -= batch.byte_size
                count -= len(batch)
        if not parts:
            return StoredRecords()
        if len(parts) == 1:
            return StoredRecords(parts[0], sizes[0].astype(np.int64, copy=False), offsets[0])
        return StoredRecords(
            b"".join(parts), np.concatenate(sizes).astype(np.int64), np.concatenate(offsets)
        )

    def _keep_sent(self, follower: str, records: StoredRecords) -> None:
        """Keep what was just sent while another follower may still ask for it (its log end,
        as its last fetch said, not past it); drop the cache once none may."""
        newest = records.offset_range()[1] if records else self._sent.last_offset
        behind = any(
            state.log_end <= newest
            for member, state in self._followers.items()
            if member != follower and member in self.isr
        )
        if not behind:
            self._sent.clear()
        elif records:
            self._sent.put(records)

    def _diverges(self, from_offset: int, previous_crc: int) -> bool:
        """Whether a follower whose record at ``from_offset - 1`` has ``previous_crc`` holds a
        record this leader does not: one it lacks (past its log end), or another one there. A
        record below the leader's oldest cannot be compared, and counts as the same."""
        log = self.partition.log
        offset = from_offset - 1
        if offset < 0 or offset < log.oldest_offset:
            return False
        if offset > log.committed_offset:
            return True
        mine = self._sent.crc_at(offset)
        if mine is None:
            mine = record_crc(self.partition, offset)
        return mine is not None and mine != previous_crc

    def _epochs_for(self, records: StoredRecords) -> list[EpochEntry]:
        if not records:
            return []
        first, last = records.offset_range()
        entries = self.epochs.entries
        covering = [
            e
            for i, e in enumerate(entries)
            if e.start_offset <= last
            and (i + 1 == len(entries) or entries[i + 1].start_offset > first)
        ]
        return covering

    def end_offset_for(self, epoch: int) -> EpochEnd:
        """Where ``epoch`` ends in this leader's log (the follower's truncation question)."""
        return self.epochs.end_offset_for(epoch, self.partition.log.next_offset)

    def hold(self, follower: str) -> None:
        """A fetch of ``follower`` found nothing to send and waits at the log end: it counts
        caught up until :meth:`release`, however long the wait."""
        self._followers.setdefault(follower, _Follower()).waiting += 1

    def release(self, follower: str) -> None:
        """The waiting fetch is answered. Its lag counts from that fetch's arrival again, so a
        follower that stopped while held (killed, paused, cut off) leaves the ISR
        ``max_lag_s`` after its last fetch, as if it had not been held."""
        state = self._followers.setdefault(follower, _Follower())
        state.waiting = max(state.waiting - 1, 0)

    def caught_up(self, member: str, max_lag_s: float) -> bool:
        """Whether ``member`` (in the ISR or not) has caught up within ``max_lag_s``."""
        state = self._followers.get(member)
        return state is not None and state.current(self._clock(), max_lag_s)

    def lagging(self, max_lag_s: float) -> set[str]:
        """ISR followers that have not been caught up for ``max_lag_s``: candidates to leave
        the ISR (the controller shrinks it, by compare-and-set in etcd)."""
        now = self._clock()
        return {
            member
            for member in self.isr - {self.broker_id}
            if not self._followers.setdefault(member, _Follower(caught_up_s=now)).current(
                now, max_lag_s
            )
        }


class FollowerReplica:
    def __init__(self, partition: Partition, broker_id: str) -> None:
        self.partition = partition
        self.broker_id = broker_id
        self.epochs = load_epochs(partition)
        self.epochs.truncate_from_start(partition.log.oldest_offset)  # a trim a restart lost
        self.high_watermark = -1
        self.leader_epoch = UNDEFINED
        self.last_crc: int | None = None
        """The CRC of the newest record of this replica's log (None: it holds none), which
        every fetch names (``previous_crc``)."""
        self._step_back = 1
        """How many records the next ``diverged`` answer cuts (doubled at each in a row)."""
        self.divergences = 0
        """``diverged`` answers taken so far (for tests and the log)."""

    def follow(self, leader_epoch: int, leader_end_offset_for: Callable[[int], EpochEnd]) -> int:
        """Start following a leader of ``leader_epoch``: truncate what it never had. Returns
        the offset the log now ends at (the first to fetch)."""
        log = self.partition.log
        answer = leader_end_offset_for(self.epochs.latest_epoch)
        cut = truncation_offset(self.epochs, log.next_offset, answer)
        if cut is None:
            cut = max(self.high_watermark + 1, log.oldest_offset)
        if cut < log.next_offset:
            self._truncate(cut)
        self.leader_epoch = leader_epoch
        self._step_back = 1
        self.last_crc = record_crc(self.partition, log.next_offset - 1)
        return log.next_offset

    def _truncate(self, cut: int) -> None:
        log = self.partition.log
        self.partition.truncate_to(cut)  # the producer table is cut with it
        self.epochs.truncate_from_end(cut)
        save_epochs(self.partition, self.epochs)
        # What it held above the cut is not known to be committed any more.
        self.high_watermark = min(self.high_watermark, log.next_offset - 1)
        log.set_commit_limit(self.high_watermark)

    def apply(self, answer: FetchAnswer) -> int:
        """Append a fetch answer; returns the next offset to fetch."""
        if answer.leader_epoch != self.leader_epoch:
            raise StaleEpoch(answer.leader_epoch, self.leader_epoch)
        log = self.partition.log
        if answer.diverged:
            # Its newest record is not the leader's: cut it and, if the one before differs too
            # (the next answer says), twice as many, until the logs agree. Never below the high
            # watermark it knows (the leader has those records) until a record there differs
            # too: only a damaged log has a committed record its leader does not.
            cut = max(log.next_offset - self._step_back, log.oldest_offset)
            floor = self.high_watermark + 1
            if log.next_offset > floor:
                cut = max(cut, floor)
            if log.newest_offset >= log.oldest_offset and cut < log.next_offset:
                self._truncate(cut)
            else:  # nothing left to cut that the leader could compare: start afresh
                self._truncate(log.oldest_offset)
            self._step_back *= 2
            self.divergences += 1
            self.last_crc = record_crc(self.partition, log.next_offset - 1)
            return log.next_offset
        self._step_back = 1
        records = answer.records
        if answer.log_start > log.next_offset:
            # Behind the leader's oldest record (it released or retained away what comes next):
            # start afresh at its log start, as Kafka's followers truncate fully. Older records
            # kept here would read as held where every other replica has none, and the epochs
            # cached for them would misplace where the next epochs begin.
            if log.newest_offset >= log.oldest_offset:
                self.partition.truncate_to(log.oldest_offset)
            self.epochs = LeaderEpochCache()
            save_epochs(self.partition, self.epochs)
            self.last_crc = None
        if records:
            first, _ = records.offset_range()
            changed = False
            for entry in answer.epochs:
                before = self.epochs.entries
                self.epochs.assign(entry.epoch, max(entry.start_offset, first))
                changed = changed or self.epochs.entries != before
            if changed:
                save_epochs(self.partition, self.epochs)  # before the records it describes
            # CRCs checked, bytes as they are; the producer table reads their __producer headers
            self.partition.append_stored(records.data, records.sizes)
            self.last_crc = crc_at(records.data, len(records.data) - int(records.sizes[-1]))
        self.high_watermark = max(
            self.high_watermark, min(answer.high_watermark, log.next_offset - 1)
        )
        log.set_commit_limit(self.high_watermark)  # ReadISRReplica readers see up to it
        return log.next_offset


def record_crc(partition: Partition, offset: int) -> int | None:
    """The stored CRC of the record at ``offset`` of ``partition``'s log (committed or not), or
    None when it holds none there (below its oldest, past its newest, or in a gap)."""
    log = partition.log
    if offset < 0 or offset < log.oldest_offset or offset > log.committed_offset:
        return None
    batch = log.forward_reader(offset, stop_offset=offset, past_limit=True).read(1, 1)
    if not batch or int(batch.offsets[0]) != offset:
        return None
    return crc_at(batch.data, int(batch.positions[0]))
