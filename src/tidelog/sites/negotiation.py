"""Negotiation: from what a sink reports for one source site, how the sender goes on.

A sink persists, per source site, four positions (:class:`SinkProgress`): the id of the last
snapshot it saw start, the last one it received whole (its end marker), the last one it applied,
and the last delta position it processed. Positions are offsets in the source's shared delta
queue; a snapshot id is the sync cycle that sent it. :func:`negotiate` is a pure function of that
report and of the oldest position the source still holds:

1. nothing replicated yet (no snapshot applied, no delta processed) → snapshot sync: the sink
   needs the application's state from before replication began;
2. a snapshot started but never received whole → snapshot sync (a new one: the transfer is not
   resumed);
3. a snapshot received whole but not applied → wait for its apply;
4. the source still holds every record for this site after the record of the last position
   processed → resume deltas there;
5. otherwise the source trimmed entries the sink never processed → snapshot sync.

Before that, the sender checks what the sink reports against what this queue gave
(:func:`judge_learned`, ``positions.py``): a position from an older queue of this site (its data
was lost) is learned from, never taken as this queue's.

What the source holds is told per site (``TagIndex.held_from``): a record trimmed after every
site acknowledged it does not send a site that had nothing in it into a snapshot. Records
trimmed before the index was built (before this server started, when the index is rebuilt from
the queue) may have been for any site: rule 5 then assumes they were, as a snapshot is always
safe where a skipped delta is silent loss. A sink processes a record's entries for it whole, so
comparing record offsets is exact.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.sites.envelope import split_position
from tidelog.sites.positions import plausible

NONE = -1
"""No position / no snapshot."""


@dataclass(frozen=True, slots=True)
class SinkProgress:
    """What a sink persisted for one source site (``NONE`` where nothing happened yet)."""

    snapshot_started: int = NONE
    snapshot_transferred: int = NONE
    snapshot_applied: int = NONE
    last_processed: int = NONE
    """The delta queue position of the last entry applied (a snapshot's covered position after
    its apply)."""


class Outcome(enum.Enum):
    DELTAS = "deltas"
    SNAPSHOT = "snapshot"
    APPLY_PENDING = "apply_pending"


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: str
    """Why, in words an operator reads in ``tidelog site status`` and the log."""
    resume_after: int = NONE
    """With ``DELTAS``: ship the entries after this position."""


def _plain_record(at: int) -> int:
    return split_position(at)[0]


class Learned(enum.Enum):
    """What a sink's reported position says about this queue (:func:`judge_learned`)."""

    NOTHING_NEW = "nothing_new"
    """Nothing, or a position this queue gave the site: negotiate as usual."""
    LIFT = "lift"
    """A site not heard since it was declared knows a position at or past its first one here:
    it was sent it by an older queue of this site, whose data was lost. Its entries are lifted
    above it (``Positions.lifted``)."""
    BEYOND_END = "beyond_end"
    """A site heard before reports a position this source cannot have given it: refused (not
    an ack), the floor raised past it and a snapshot sync, as the entries stored since the
    loss may sit at positions it processed for others."""
    IMPLAUSIBLE = "implausible"
    """A position past what a source is believed to give (``positions.MAX_LEARNED``): not
    believed, nothing learned or sent."""


def judge_learned(heard: bool, learned: int, first_position: int, given_end: int) -> Learned:
    """What a sink reporting it processed ``learned`` tells the source, for a site ``heard``
    since it was declared or not, whose first entry here takes ``first_position`` at the
    least, when every position this source can have given the site is below ``given_end``
    (``Sender.given_end``: not the queue's next position, which a new queue may have pushed
    past an older queue's positions before the sender heard the sink)."""
    if learned < 0:
        return Learned.NOTHING_NEW
    if not plausible(learned):
        return Learned.IMPLAUSIBLE
    if not heard:
        return Learned.LIFT if learned >= first_position else Learned.NOTHING_NEW
    return Learned.BEYOND_END if learned >= given_end else Learned.NOTHING_NEW


def negotiate(
    sink: SinkProgress, held_from: int, record_of: Callable[[int], int] = _plain_record
) -> Decision:
    """How to go on with a sink that reports ``sink``, when the source holds every record for
    the sink's site from record offset ``held_from`` on. ``record_of``: the record offset a
    position of the site belongs to (``Positions.record_of``; positions not lifted by
    default)."""
    if sink.snapshot_started > max(sink.snapshot_transferred, NONE):
        return Decision(
            Outcome.SNAPSHOT, f"snapshot {sink.snapshot_started} was never received whole"
        )
    if sink.snapshot_transferred > max(sink.snapshot_applied, NONE):
        return Decision(
            Outcome.APPLY_PENDING, f"snapshot {sink.snapshot_transferred} is received, not applied"
        )
    if sink.snapshot_applied == NONE and sink.last_processed == NONE:
        return Decision(Outcome.SNAPSHOT, "nothing was replicated to this site yet")
    if held_from <= record_of(sink.last_processed) + 1:
        return Decision(
            Outcome.DELTAS,
            f"resuming after position {sink.last_processed}",
            resume_after=sink.last_processed,
        )
    return Decision(
        Outcome.SNAPSHOT,
        f"the source trimmed entries for this site after position {sink.last_processed} "
        f"(it holds them from record {held_from})",
    )
