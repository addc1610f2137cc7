"""Positions: where the delta queue's entries stand, for every site, never repeating.

An entry's position is ``(record offset + lift) * 65,536 + its index in the record``. The lift is
0 until the source learns from a sink that an older queue of this site gave out higher positions;
it then only grows.

Why. Positions are how a sink keeps its place (its apply window, the ``__position`` of its
receive queues) and what an application may deduplicate on. A source that lost its data
directory starts its queue again at offset 0: with plain ``offset * 65,536 + index`` its new
entries would take positions its sinks already processed, and they would drop them as
duplicates while acknowledging past the source's end. Only the sinks remember how far the old
queue went; each reports it when a sender says hello (``SinkProgress.last_processed``), and the
sender learns from it (``negotiation.judge_learned``, a *position floor learned at negotiation*):

- A site this queue has not heard since it was declared (``Site.heard``) that reports a position
  at or past the first one of its own entries knew an older queue of this site. Its entries
  stored since its ``since`` (before the source could know) are **lifted** for it: they travel at
  positions above both what it reported and every position given so far, and every record from
  the queue's end on takes at least that lift, for every site (:meth:`Positions.lifted`). The
  range the site's lifted entries take is given to no other record, so a position is unique
  across the whole source, not only per site.
- A site heard before that reports a position this source cannot have given it is refused: the
  floor rises past it (:meth:`Positions.raised`) and the site gets a snapshot sync, since entries
  stored after the loss may sit at positions it processed for other entries. What the source can
  have given a site is below the queue's next position when it was opened
  (``SendQueue.opened_position``: a run gives nothing before it opens) or at most what its sender
  shipped since; comparing with the queue's next position *now* would miss a sink whose old
  position the new queue passed before its sender heard it.

Where the queue's end went back (the delta queue lost with the registry kept, a power loss that
cut an unsynced tail, a failover that cut records above the high watermark), numbers given past
the new end are unknown but for what was kept: the segments that start past it and the
acknowledgements the upkeep saved. A change made at an ``end`` drops the segments at or past it
and starts the new one above every lifted number known given (:meth:`Positions.given_floor`).
The site's registry fits itself to the queue's end at open, before any transmit
(``SiteRegistry.fit_queue_end``), and the sender's check above covers what nothing kept.

The lifts are *segments*: from a record offset on, offsets are lifted by ``by`` records, ``by``
never smaller than the segment's before. A site lifted at its first contact has its own lift for
its records below the segment its lift began (``Site.lift``, ``Site.lifted_below``) and the
global segments from there (:meth:`Positions.for_site`). The registry keeps a segment starting at
every lifted site's ``lifted_below``, with a lift at least its own (a change at an ``end`` below
it moves its ``lifted_below`` to ``end``).

Room: positions stay below 2**62 (:data:`MAX_RECORD` lifted records). A sink's report is
believed only below :data:`MAX_LEARNED`, a quarter of that: the floor is the highest report,
not a sum of them, so three quarters of the room stay for the queue's own records. A change
that would still leave no room raises :class:`PositionsExhausted`.

Sans-IO: the registry keeps the segments and each site's lift (``registry.py``); the sender
decides when to learn (``sender.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Final

from tidelog.sites.envelope import MAX_ENTRIES, position

MAX_RECORD: Final = 1 << 46
"""Lifted record numbers stay below this: positions below 2**62, far inside an int64."""
MAX_LEARNED: Final = MAX_RECORD // 4
"""A sink's reported position is believed only if its record is below this."""


class PositionsExhausted(ValueError):
    """A lift or a raised floor would take positions past 2**62."""


class Positions:
    """Record offsets to positions and back, through lift segments ``(start, by)``: records at
    ``start`` and after (up to the next segment) are lifted by ``by``. Before the first segment
    the lift is 0. Starts increase, ``by`` never decreases, so positions rise with offsets."""

    __slots__ = ("_bys", "_first", "_starts")

    def __init__(self, segments: Sequence[tuple[int, int]] = (), *, first: int = 0) -> None:
        """``first``: the first record offset that counts (a site's ``since``): a position
        below its first record's is "before everything" for :meth:`record_of`."""
        starts = [int(s) for s, _ in segments]
        bys = [int(b) for _, b in segments]
        if any(s < 0 for s in starts) or any(b < 0 for b in bys):
            raise ValueError(f"lift segments are non-negative, got {list(segments)}")
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"lift segments must start at increasing offsets, got {segments}")
        if any(b < a for a, b in itertools.pairwise(bys)):
            raise ValueError(f"a lift never shrinks from one segment to the next: {segments}")
        self._starts = starts
        self._bys = bys
        self._first = first

    @property
    def segments(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._bys, strict=True))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Positions) and (self.segments, self._first) == (
            other.segments,
            other._first,
        )

    def __hash__(self) -> int:
        return hash((tuple(self.segments), self._first))

    def __repr__(self) -> str:
        return f"Positions({self.segments}, first={self._first})"

    def lift_at(self, offset: int) -> int:
        """The lift of the record at ``offset``."""
        at = bisect.bisect_right(self._starts, offset) - 1
        return self._bys[at] if at >= 0 else 0

    def position(self, offset: int, index: int = 0) -> int:
        """The position of entry ``index`` of the record at ``offset``."""
        return position(offset + self.lift_at(offset), index)

    def record_of(self, at: int) -> int:
        """The offset of the last record whose first position is at or below ``at``: every
        entry of a later record is after ``at``, and a sink that processed ``at`` processed this
        record's entries for it whole. A position in the gap a lift leaves belongs to the
        record before the gap; one below the first record that counts gives the record before
        it (``first - 1``); ``NONE`` (or any negative) gives -1."""
        if at < 0:
            return -1
        lifted = at // MAX_ENTRIES
        found = -1
        # Segment k covers offsets [start_k, start_k+1) at lifted numbers [start_k + by_k, ...);
        # before the first segment, offsets [0, start_0) are not lifted.
        bounds = [(0, 0), *zip(self._starts, self._bys, strict=True)]
        for k, (start, by) in enumerate(bounds):
            if start + by > lifted:
                break
            end = bounds[k + 1][0] if k + 1 < len(bounds) else None
            offset = lifted - by
            found = offset if end is None or offset < end else end - 1
        return max(found, self._first - 1)

    def given_floor(self, end: int) -> int:
        """The lifted record number above every one given so far, the queue's next offset being
        ``end``: the next record's, or, where segments start past ``end`` (their records were
        lost), above the first number each of them gave."""
        return max([end + self.lift_at(end), *(s + b for s, b in self.segments)])

    def for_site(self, since: int, lift: int = 0, lifted_below: int = 0) -> Positions:
        """The positions one site sees: a site with its own ``lift`` (from its first contact)
        has its records below ``lifted_below`` lifted by it, and the global segments from
        there; records below ``since`` are never its own. From ``lifted_below`` on, a lift is
        never below its own: the registry keeps it so (module docstring), and a registry that
        did not (the previous version's, after a floor raised below the segment) still gives
        the site positions that rise."""
        if not lift:
            return Positions(self.segments, first=since)
        own = [(0, lift)] if lifted_below > 0 else []  # none below 0: nothing was lifted
        later = [(lifted_below, max(lift, self.lift_at(lifted_below)))]
        later += [(s, max(lift, b)) for s, b in self.segments if s > lifted_below]
        return Positions([*own, *later], first=since)

    def lifted(self, since: int, learned: int, end: int) -> tuple[Positions, int]:
        """The segments after a site declared at ``since``, not heard before, reported having
        processed position ``learned`` of an older queue, the queue's next offset being
        ``end``; and the site's own lift. The site's records in ``[since, end)`` move to lifted
        numbers from above both ``learned``'s record and every lifted number given so far
        (:meth:`given_floor`); the new segment at ``end`` starts right above them, and
        replaces any at or past ``end``. A ``since`` past ``end`` (the queue lost records) has
        no record below ``end``: its records take the segment's numbers, from the floor up."""
        floor = max(_record(learned) + 1, self.given_floor(end))
        by = floor - min(since, end)
        _check_room(end + by)
        kept = [(s, b) for s, b in self.segments if s < end]
        return Positions([*kept, (end, by)]), by

    def raised(self, learned: int, end: int) -> Positions:
        """The segments after the floor rose past position ``learned`` for the records from
        ``end`` on (a heard site reported what the queue never gave: nothing new may repeat
        it), and above every lifted number given so far (:meth:`given_floor`: segments at or
        past ``end`` are replaced); unchanged when the floor is there already."""
        floor = max(_record(learned) + 1, self.given_floor(end))
        kept = [(s, b) for s, b in self.segments if s < end]
        if floor == end + self.lift_at(end) and len(kept) == len(self._starts):
            return self
        _check_room(floor)
        return Positions([*kept, (end, floor - end)])


def plausible(learned: int) -> bool:
    """Whether a sink's reported position can be learned from (below :data:`MAX_LEARNED`)."""
    return _record(learned) < MAX_LEARNED


def _record(at: int) -> int:
    return at // MAX_ENTRIES


def _check_room(lifted_end: int) -> None:
    if lifted_end >= MAX_RECORD:
        raise PositionsExhausted(
            f"a lift to record {lifted_end} leaves positions no room below 2**62"
        )
