"""The leader-epoch cache of one partition replica: which leader epoch wrote which offsets.

Theory of operation. Every leader of a partition has an epoch, raised by each election. A
replica records, durably, the offset at which each epoch's records start: an entry
``(epoch, start_offset)`` is added when the replica becomes leader (at its log end, before it
writes anything) and when a follower first appends a record of a new epoch. From that list any
replica can answer "where does epoch E end in your log?" (:meth:`LeaderEpochCache.end_offset_for`):
at the start of the first later epoch, or at the log end for the newest.

A follower that (re)joins a leader asks exactly that for its own newest epoch and truncates its
log to the smaller of the leader's answer and its own end of that epoch
(:func:`truncation_offset`). That removes a tail the follower took from a deposed leader and the
new leader never had, which truncating to the high watermark can keep (a follower whose high
watermark lagged would keep a divergent record) or lose (a follower whose high watermark led
would drop acknowledged records). This is the rule of Kafka's KIP-101 and KIP-279, which
Liftbridge follows; the tests walk their scenarios.

An epoch with no records keeps no entry of its own: the next epoch's entry has the same start
offset and replaces it, and its end is that start offset, which is what asking for it answers.
Sans-IO apart from :meth:`LeaderEpochCache.save`/``load``: a JSON file replaced atomically by
the caller's writer.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

UNDEFINED: Final = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """The answer to "where does epoch E end": the largest epoch at most E that this replica
    knows, and the offset after its last record (``UNDEFINED`` twice: it knows none so old)."""

    epoch: int
    end_offset: int


class LeaderEpochCache:
    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._entries: list[EpochEntry] = []
        for entry in entries or []:
            self.assign(entry.epoch, entry.start_offset)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` writes from ``start_offset`` on. Entries it contradicts (a
        later or equal epoch, or a start at or after ``start_offset``) are dropped: they belong
        to a history this replica's log no longer follows."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(
                f"an epoch entry needs epoch and offset >= 0, got {epoch}, {start_offset}"
            )
        latest = self._entries[-1] if self._entries else None
        if latest is not None and latest.epoch == epoch and latest.start_offset <= start_offset:
            return  # the epoch is known; its start does not move later
        self._entries = [
            e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset
        ]
        self._entries.append(EpochEntry(epoch, start_offset))

    def end_offset_for(self, epoch: int, log_end: int) -> EpochEnd:
        """Where ``epoch`` ends in a log whose next offset is ``log_end``."""
        if not self._entries or epoch < self._entries[0].epoch:
            return EpochEnd(UNDEFINED, UNDEFINED)
        if epoch >= self._entries[-1].epoch:
            return EpochEnd(self._entries[-1].epoch, log_end)
        epochs = [e.epoch for e in self._entries]
        after = bisect.bisect_right(epochs, epoch)  # the first epoch later than ``epoch``
        return EpochEnd(self._entries[after - 1].epoch, self._entries[after].start_offset)

    def truncate_from_end(self, log_end: int) -> bool:
        """The log was cut to end at ``log_end``: entries starting there or later go. Returns
        whether any did (the caller saves the cache then)."""
        kept = [e for e in self._entries if e.start_offset < log_end]
        changed = kept != self._entries
        self._entries = kept
        return changed

    def truncate_from_start(self, oldest: int) -> bool:
        """Retention removed the offsets before ``oldest``: entries wholly below it go, and the
        one covering it starts there (as Kafka's ``truncateFromStart``). A replica subscribes
        it to its partition's start listener (``Partition.add_start_listener``). Returns
        whether anything changed (the caller saves the cache then)."""
        kept = [e for e in self._entries if e.start_offset >= oldest]
        covering = [e for e in self._entries if e.start_offset < oldest]
        if covering and (not kept or kept[0].start_offset > oldest):
            kept.insert(0, EpochEntry(covering[-1].epoch, oldest))
        changed = kept != self._entries
        self._entries = kept
        return changed

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "entries": [[e.epoch, e.start_offset] for e in self._entries]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaderEpochCache:
        if data.get("version") != 1:
            raise ValueError(f"leader-epoch cache version {data.get('version')!r} is not 1")
        entries = [EpochEntry(int(epoch), int(start)) for epoch, start in data["entries"]]
        cache = cls(entries)
        if cache.entries != entries:
            raise ValueError("leader-epoch cache entries are not increasing")
        return cache

    def save(self, path: Path, replace: Callable[[Path, Any], None]) -> None:
        """Write the cache with ``replace`` (an atomic replace, e.g.
        ``tidelog.durable.replace_json``)."""
        replace(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()


def truncation_offset(
    follower: LeaderEpochCache, follower_log_end: int, leader_answer: EpochEnd
) -> int | None:
    """Where a follower cuts its log after asking the leader for the end of its newest epoch
    (``leader_answer``); None when the leader knows no epoch so old (the follower then
    truncates to its high watermark, the best it can know)."""
    if leader_answer.epoch == UNDEFINED:
        return None
    own = follower.end_offset_for(leader_answer.epoch, follower_log_end)
    if own.epoch == UNDEFINED:
        return None
    return min(leader_answer.end_offset, own.end_offset, follower_log_end)
