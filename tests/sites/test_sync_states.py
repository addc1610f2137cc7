"""The sender session's state table (``tidelog/sites/sync_states.py``), tested as a table:
every pair in it, every pair missing from it, and the sync-cycle rule that drops stale events."""

from __future__ import annotations

import itertools

import pytest

from tidelog.sites.sync_states import (
    CYCLE_EVENTS,
    TRANSITIONS,
    SenderSession,
    SyncEvent,
    SyncState,
    UnexpectedEvent,
)

S, E = SyncState, SyncEvent


def session_in(state: SyncState) -> SenderSession:
    """A session driven into ``state`` through the table itself."""
    session = SenderSession("b")
    paths = {
        S.INITIALIZED: [],
        S.NEGOTIATING: [E.START],
        S.SNAPSHOT_SYNC: [E.START, E.NEGOTIATED_SNAPSHOT],
        S.WAIT_SNAPSHOT_APPLY: [E.START, E.NEGOTIATED_SNAPSHOT, E.SNAPSHOT_TRANSFER_COMPLETE],
        S.LOG_ENTRY_SYNC: [E.START, E.NEGOTIATED_DELTAS],
        S.ERROR: [E.FAILED],
        S.STOPPED: [E.STOP],
    }
    for event in paths[state]:
        session.handle(event, session.cycle if event in CYCLE_EVENTS else None)
    assert session.state is state
    return session


@pytest.mark.parametrize(
    ("state", "event"), sorted(TRANSITIONS, key=lambda k: (k[0].value, k[1].value))
)
def test_every_transition_in_the_table(state: SyncState, event: SyncEvent) -> None:
    session = session_in(state)
    before = session.cycle
    done = session.handle(event, session.cycle if event in CYCLE_EVENTS else None)
    assert done.applied and (done.before, done.after) == (state, TRANSITIONS[(state, event)])
    assert session.state is TRANSITIONS[(state, event)]
    opens_cycle = done.after in (S.NEGOTIATING, S.SNAPSHOT_SYNC)
    assert session.cycle == before + (1 if opens_cycle else 0)


MISSING = [pair for pair in itertools.product(SyncState, SyncEvent) if pair not in TRANSITIONS]


@pytest.mark.parametrize(("state", "event"), MISSING)
def test_a_pair_missing_from_the_table_is_refused(state: SyncState, event: SyncEvent) -> None:
    session = session_in(state)
    with pytest.raises(UnexpectedEvent, match=event.name):
        session.handle(event, session.cycle if event in CYCLE_EVENTS else None)
    assert session.state is state


def test_stopped_is_final() -> None:
    assert all(state is not S.STOPPED for state, _ in TRANSITIONS)


def test_a_stale_cycle_ack_is_ignored() -> None:
    """A snapshot replaced by a newer one: its late "apply complete" must not start deltas."""
    session = session_in(S.WAIT_SNAPSHOT_APPLY)
    old = session.cycle
    session.handle(E.RESYNC_REQUEST)  # a new snapshot cycle
    assert session.state is S.SNAPSHOT_SYNC and session.cycle == old + 1
    stale = session.handle(E.SNAPSHOT_APPLY_COMPLETE, old)
    assert not stale.applied and session.state is S.SNAPSHOT_SYNC
    stale = session.handle(E.SNAPSHOT_TRANSFER_COMPLETE, old)
    assert not stale.applied and session.state is S.SNAPSHOT_SYNC
    session.handle(E.SNAPSHOT_TRANSFER_COMPLETE, old + 1)
    session.handle(E.SNAPSHOT_APPLY_IN_PROGRESS, old + 1)
    assert session.state is S.WAIT_SNAPSHOT_APPLY and session.cycle == old + 1
    session.handle(E.SNAPSHOT_APPLY_COMPLETE, old + 1)
    assert session.state is S.LOG_ENTRY_SYNC


def test_a_fault_of_an_older_cycle_does_not_restart_the_snapshot() -> None:
    session = session_in(S.LOG_ENTRY_SYNC)
    cycle = session.cycle
    session.handle(E.ACK_TIMEOUT, cycle)
    assert session.state is S.SNAPSHOT_SYNC
    # The same timeout reported twice (two batches of the old cycle): one snapshot, not two.
    assert not session.handle(E.ACK_TIMEOUT, cycle).applied
    assert not session.handle(E.TRIMMED_READ, cycle).applied
    assert session.cycle == cycle + 1


def test_a_lost_connection_negotiates_again_in_a_new_cycle() -> None:
    session = session_in(S.SNAPSHOT_SYNC)
    cycle = session.cycle
    session.handle(E.DISCONNECTED)
    assert session.state is S.INITIALIZED
    session.handle(E.START)
    assert session.state is S.NEGOTIATING and session.cycle == cycle + 1
    assert not session.handle(E.SNAPSHOT_TRANSFER_COMPLETE, cycle).applied


def test_cycle_events_need_their_cycle_and_others_refuse_one() -> None:
    session = session_in(S.NEGOTIATING)
    with pytest.raises(ValueError, match="give its id"):
        session.handle(E.NEGOTIATED_DELTAS)
    with pytest.raises(ValueError, match="does not belong"):
        session.handle(E.STOP, session.cycle)
