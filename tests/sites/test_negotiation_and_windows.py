"""Negotiation and the two transfer windows (``tidelog/sites/negotiation.py``, ``windows.py``):
pure rules, driven without I/O; the apply window also by hypothesis, over any arrival order
with duplicates."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.sites.envelope import position
from tidelog.sites.negotiation import NONE, Outcome, SinkProgress, negotiate
from tidelog.sites.windows import AckTimeout, ApplyWindow, Framed, SendWindow

# -- negotiation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sink", "held", "outcome", "resume_after"),
    [
        (SinkProgress(), 0, Outcome.SNAPSHOT, NONE),  # nothing replicated yet
        (SinkProgress(snapshot_started=3), 0, Outcome.SNAPSHOT, NONE),  # never received whole
        (
            SinkProgress(snapshot_started=3, snapshot_transferred=2, snapshot_applied=2),
            0,
            Outcome.SNAPSHOT,
            NONE,
        ),
        (
            SinkProgress(snapshot_started=3, snapshot_transferred=3, snapshot_applied=2),
            0,
            Outcome.APPLY_PENDING,
            NONE,
        ),
        # "held" is the record offset from which the source holds every record for the site
        (SinkProgress(3, 3, 3, last_processed=41), 1, Outcome.DELTAS, 41),  # next record held
        (SinkProgress(3, 3, 3, last_processed=41), 0, Outcome.DELTAS, 41),
        (SinkProgress(3, 3, 3, last_processed=41), 2, Outcome.SNAPSHOT, NONE),  # trimmed past
        (SinkProgress(last_processed=5), 0, Outcome.DELTAS, 5),  # deltas only, never trimmed
        # the sink processed record 7 whole (its last entry for the site is index 3): a trimmed
        # record 7 lost nothing for it, a trimmed record 8 may have
        (SinkProgress(last_processed=position(7, 3)), 8, Outcome.DELTAS, position(7, 3)),
        (SinkProgress(last_processed=position(7, 3)), 9, Outcome.SNAPSHOT, NONE),
        # a snapshot of an empty queue covers position -1: deltas from the first record
        (SinkProgress(4, 4, 4, last_processed=NONE), 0, Outcome.DELTAS, NONE),
    ],
)
def test_negotiation(sink: SinkProgress, held: int, outcome: Outcome, resume_after: int) -> None:
    decision = negotiate(sink, held)
    assert (decision.outcome, decision.resume_after) == (outcome, resume_after)
    assert decision.reason


# -- the sink's apply window -----------------------------------------------------------------------


def test_in_order_batches_apply_at_once() -> None:
    window: ApplyWindow[str] = ApplyWindow()
    ready = window.offer(Framed(NONE, 4, "a"))
    assert [(r.batch.entries, r.skip_through) for r in ready] == [("a", NONE)]
    assert [r.batch.entries for r in window.offer(Framed(4, 9, "b"))] == ["b"]
    assert window.last_applied == 9


def test_early_batches_wait_for_the_gap_and_duplicates_are_dropped() -> None:
    window: ApplyWindow[str] = ApplyWindow()
    assert window.offer(Framed(9, 12, "c")) == []  # early: (4, 9] is missing
    assert window.offer(Framed(4, 9, "b")) == []
    assert window.waiting == 2
    ready = window.offer(Framed(NONE, 4, "a"))
    assert [r.batch.entries for r in ready] == ["a", "b", "c"]
    assert window.offer(Framed(4, 9, "b")) == [] and window.duplicates == 1  # a resend
    assert window.last_applied == 12 and window.waiting == 0


def test_an_overlapping_batch_skips_what_was_applied() -> None:
    window: ApplyWindow[str] = ApplyWindow(last_applied=7)
    (ready,) = window.offer(Framed(4, 9, "b"))
    assert ready.skip_through == 7 and window.last_applied == 9


def test_early_batches_beyond_the_bound_are_dropped_for_a_resend() -> None:
    window: ApplyWindow[int] = ApplyWindow(capacity=2)
    window.offer(Framed(10, 11, 1))
    window.offer(Framed(11, 12, 2))
    window.offer(Framed(12, 13, 3))
    assert window.waiting == 2 and window.dropped_early == 1


def test_a_window_that_applied_nothing_opens_at_the_senders_first_prev() -> None:
    """A site declared after the source stored entries: its sender starts after the last
    position before the site's ``since``, so its first batch's ``prev`` is not ``NONE``."""
    start = position(3, 0) - 1
    held: ApplyWindow[str] = ApplyWindow()
    assert held.offer(Framed(start, position(3, 0), "a")) == []  # without the opening: early
    window: ApplyWindow[str] = ApplyWindow()
    assert window.open_at(start)
    (ready,) = window.offer(Framed(start, position(3, 0), "a"))
    assert (ready.batch.entries, window.last_applied) == ("a", position(3, 0))
    assert not window.open_at(position(5, 0)), "once anything is applied the window stays"
    assert window.last_applied == position(3, 0)


@pytest.mark.parametrize("prev", [NONE, -7])
def test_opening_at_none_changes_nothing(prev: int) -> None:
    window: ApplyWindow[str] = ApplyWindow()
    assert not window.open_at(prev) and window.last_applied == NONE


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_arrival_order_applies_each_entry_once_in_order(data: st.DataObject) -> None:
    positions = sorted(data.draw(st.sets(st.integers(0, 200), min_size=1, max_size=40)))
    cuts: set[int] = set()
    if len(positions) > 1:
        cuts = data.draw(st.sets(st.integers(1, len(positions) - 1)))
    bounds = [0, *sorted(cuts), len(positions)]
    batches = []
    for a, b in itertools.pairwise(bounds):
        prev = positions[a - 1] if a else NONE
        batches.append(Framed(prev, positions[b - 1], positions[a:b]))
    # The network reorders and repeats; the sender resends whatever was not applied.
    arrivals = data.draw(st.lists(st.sampled_from(batches), max_size=3 * len(batches)))
    window: ApplyWindow[list[int]] = ApplyWindow(capacity=data.draw(st.integers(1, 8)))
    applied: list[int] = []
    for batch in [*arrivals, *batches]:
        for ready in window.offer(batch):
            applied += [p for p in ready.batch.entries if p > ready.skip_through]
    assert applied == positions


# -- the sender's resend window --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_acks_evict_cumulatively_and_the_window_bounds_what_is_in_flight() -> None:
    window: SendWindow[str] = SendWindow(capacity=2, clock=Clock())
    window.sent(Framed(NONE, 3, "a"))
    window.sent(Framed(3, 5, "b"))
    assert not window.has_room
    with pytest.raises(ValueError, match="full"):
        window.sent(Framed(5, 6, "c"))
    assert window.ack(4) == 1  # covers "a" only
    assert window.ack(2) == 0  # an older ack changes nothing
    window.sent(Framed(5, 6, "c"))
    assert window.ack(6) == 2 and window.in_flight == 0 and window.last_sent == 6


def test_a_batch_must_follow_the_last_one_sent() -> None:
    window: SendWindow[str] = SendWindow(clock=Clock())
    window.sent(Framed(NONE, 3, "a"))
    with pytest.raises(ValueError, match="does not follow"):
        window.sent(Framed(4, 5, "gap"))


def test_unacked_batches_are_resent_with_backoff_then_time_out() -> None:
    clock = Clock()
    window: SendWindow[str] = SendWindow(resend_after_s=1.0, max_resends=2, clock=clock)
    window.sent(Framed(NONE, 3, "a"))
    assert window.due() == []
    clock.now = 1.0
    assert [b.entries for b in window.due()] == ["a"]  # next wait: 2 s
    clock.now = 2.5
    assert window.due() == []
    clock.now = 3.0
    assert [b.entries for b in window.due()] == ["a"]  # next wait: 4 s
    clock.now = 7.0
    with pytest.raises(AckTimeout, match="after 2 resends"):
        window.due()


def test_an_ack_restarts_the_timer_of_the_oldest_batch_left() -> None:
    clock = Clock()
    window: SendWindow[str] = SendWindow(resend_after_s=1.0, clock=clock)
    window.sent(Framed(NONE, 3, "a"))
    window.sent(Framed(3, 5, "b"))
    clock.now = 0.9
    window.ack(3)
    clock.now = 1.5
    assert window.due() == []  # "b" waits 1 s from the ack
    clock.now = 1.9
    assert [b.entries for b in window.due()] == ["b"]
