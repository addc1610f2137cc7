"""The tag index: for each destination site, the send-queue records that hold entries for it.

A sender for site X reads only the records listed under X's number, so catching X up costs
O(records for X), not O(every record of the queue). The index is materialised from the queue, as
the cursor index is from ``__cursors``: :meth:`TagIndex.add` is called for each record appended
(with how many of its entries are for each site, ``envelope.site_counts``), and after a
restart it is rebuilt from a snapshot (:meth:`TagIndex.snapshot`, which says up to which offset
it covers) plus the records after it. Retention trims it from the front (:meth:`trim`); a
removed site's list is dropped (:meth:`forget_site`).

Invariants: offsets under one site strictly increase; ``covers`` is the last offset added
(``-1``: none), and every record up to it is either listed under each of its sites or trimmed.
Sans-IO: the caller reads the log and persists the snapshot.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from typing import Any

from tidelog.sites.envelope import MAX_SITES


class TagIndex:
    def __init__(self) -> None:
        self._offsets: dict[int, list[int]] = {}
        """Site number -> record offsets, increasing."""
        self._totals: dict[int, list[int]] = {}
        """Site number -> entries for it in its records up to each one (running totals)."""
        self._start: dict[int, int] = {}
        """Site number -> how many leading offsets are trimmed (compacted lazily)."""
        self.covers = -1
        self.oldest = 0
        """Records below this offset were trimmed."""
        self.base = 0
        """Records below this offset were trimmed before the index was built: which sites they
        were for is not known."""
        self._lost: dict[int, int] = {}
        """Site number -> the newest record for it that was trimmed since the index was built."""

    def add(self, offset: int, entries: Mapping[int, int]) -> None:
        """Record ``offset`` under every site in ``entries`` (site number -> how many of the
        record's entries are for it)."""
        if offset <= self.covers:
            raise ValueError(f"record {offset} is not after the last one indexed ({self.covers})")
        if not entries or not all(0 <= n < MAX_SITES and c > 0 for n, c in entries.items()):
            raise ValueError("a record needs at least one destination, site numbers below 64")
        for number, count in entries.items():
            offsets = self._offsets.setdefault(number, [])
            totals = self._totals.setdefault(number, [])
            offsets.append(offset)
            totals.append((totals[-1] if totals else 0) + count)
        self.covers = offset

    def entries_for(self, site: int, from_offset: int) -> int:
        """How many entries for ``site`` the records at or after ``from_offset`` hold."""
        offsets = self._offsets.get(site)
        if not offsets:
            return 0
        totals = self._totals[site]
        lo = max(bisect.bisect_left(offsets, from_offset), self._start.get(site, 0))
        if lo >= len(offsets):
            return 0
        before = totals[lo - 1] if lo else 0
        return totals[-1] - before

    def records_for(self, site: int, from_offset: int, limit: int) -> list[int]:
        """Up to ``limit`` offsets of records for ``site``, from ``from_offset`` on."""
        offsets = self._offsets.get(site)
        if not offsets:
            return []
        lo = max(bisect.bisect_left(offsets, from_offset), self._start.get(site, 0))
        return offsets[lo : lo + limit]

    def trim(self, oldest: int) -> None:
        """Retention removed every record below ``oldest``."""
        if oldest <= self.oldest:
            return
        self.oldest = oldest
        for site, offsets in self._offsets.items():
            start = bisect.bisect_left(offsets, oldest)
            if start > self._start.get(site, 0):
                self._lost[site] = offsets[start - 1]
            if start > len(offsets) // 2:  # compact once half is dead: amortised O(1)
                totals = self._totals[site]
                base = totals[start - 1] if start else 0  # running totals start again at 0
                del offsets[:start]
                self._totals[site] = [t - base for t in totals[start:]]
                start = 0
            self._start[site] = start

    def held_from(self, site: int) -> int:
        """The oldest record offset from which every record for ``site`` is still held: a
        site that processed the record before it can resume with deltas."""
        return max(self.base, self._lost.get(site, -1) + 1)

    def trims(self) -> tuple[int, dict[int, int]]:
        """What the index knows of records no longer held: ``base`` and each site's newest
        trimmed record (for keeping where a snapshot of the lists is not kept)."""
        return self.base, dict(self._lost)

    def assume_trims(self, base: int, lost: Mapping[int, int]) -> None:
        """Take over :meth:`trims` kept by an earlier index of the same queue, whose front was
        at least this one's: each site is then held from where that index held it (or later)
        instead of from this index's front."""
        self.base = base
        for site, offset in lost.items():
            self._lost[site] = max(offset, self._lost.get(site, -1))

    def forget_site(self, site: int) -> None:
        self._lost.pop(site, None)
        self._offsets.pop(site, None)
        self._totals.pop(site, None)
        self._start.pop(site, None)

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able copy; restore it with :meth:`restore`, then ``add`` the records after
        ``covers``."""
        return {
            "covers": self.covers,
            "oldest": self.oldest,
            "base": self.base,
            "lost": {str(site): offset for site, offset in self._lost.items()},
            "sites": {
                str(site): offsets[self._start.get(site, 0) :]
                for site, offsets in self._offsets.items()
            },
            "totals": {str(site): self._kept_totals(site) for site in self._totals},
        }

    def _kept_totals(self, site: int) -> list[int]:
        """The running totals of the records not trimmed, counted from the first of them."""
        start = self._start.get(site, 0)
        totals = self._totals[site]
        base = totals[start - 1] if start else 0
        return [t - base for t in totals[start:]]

    @classmethod
    def restore(cls, data: dict[str, Any]) -> TagIndex:
        index = cls()
        index.covers = int(data["covers"])
        index.oldest = int(data["oldest"])
        index.base = int(data.get("base", index.oldest))
        index._lost = {int(site): int(offset) for site, offset in data.get("lost", {}).items()}
        for site, offsets in data["sites"].items():
            listed = [int(o) for o in offsets]
            if any(b <= a for a, b in itertools.pairwise(listed)):
                raise ValueError(f"tag index snapshot: offsets of site {site} do not increase")
            totals = [int(t) for t in data["totals"][site]]
            if len(totals) != len(listed):
                raise ValueError(f"tag index snapshot: site {site} has offsets and totals apart")
            index._offsets[int(site)] = listed
            index._totals[int(site)] = totals
        return index
