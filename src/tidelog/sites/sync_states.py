"""The sender session's state machine: how one source site keeps one remote site in sync.

Theory of operation. For each remote site the source runs one *sender session*. It starts
INITIALIZED; once connected it is NEGOTIATING: the sink reports how far it got (see
``negotiation.py``), and the outcome is one of three. The sink can *resume deltas* from its
last processed position (LOG_ENTRY_SYNC); a snapshot it received whole still has to be applied
(WAIT_SNAPSHOT_APPLY); or deltas alone cannot catch it up (SNAPSHOT_SYNC: nothing replicated
yet, a transfer that never finished, or the source trimmed past the sink's position). A
snapshot sync has the source application transmit its full state between a start and an end
marker; once the sink has the end marker the session waits for the sink to apply it, then
ships deltas from the position the snapshot covers.

Every snapshot sync, and every negotiation, opens a new *sync cycle* with a larger id. Events
that belong to a cycle (transfer complete, apply progress, an ack timeout, a read that hit a
trim, a send error) carry its id, and an event of an older cycle is dropped: a late "apply
complete" of a snapshot that was since replaced must not start deltas from the old snapshot's
position. Events that come from outside any cycle (start, a forced resync, stop, a lost
connection) carry none.

A snapshot sync starts on a negotiation that says so, on a read of a trimmed position, on a send
error or an ack timeout (the sink may have lost track: a full sync is always safe), and on
request (``tidelog site resync``). A lost connection goes back to INITIALIZED, to negotiate
again once reconnected: the sink's persisted positions decide what follows. ERROR is for what
retrying cannot fix by itself (the remote site answers that it is not the site expected); it
leaves on START, when the operator has fixed it. STOPPED is final (the site was removed).

The states and events are one table, :data:`TRANSITIONS`; a pair missing from it is a bug, and
:meth:`SenderSession.handle` refuses it loudly rather than guess.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


class SyncState(enum.Enum):
    INITIALIZED = "initialized"
    NEGOTIATING = "negotiating"
    SNAPSHOT_SYNC = "snapshot_sync"
    WAIT_SNAPSHOT_APPLY = "wait_snapshot_apply"
    LOG_ENTRY_SYNC = "log_entry_sync"
    ERROR = "error"
    STOPPED = "stopped"


class SyncEvent(enum.Enum):
    # from outside any cycle
    START = "start"
    """Connected to the sink (or restarted after ERROR): negotiate."""
    RESYNC_REQUEST = "resync_request"
    """An operator or the application asks for a snapshot sync."""
    DISCONNECTED = "disconnected"
    STOP = "stop"
    """The site was removed."""
    # outcomes of a negotiation (carry its cycle)
    NEGOTIATED_DELTAS = "negotiated_deltas"
    NEGOTIATED_SNAPSHOT = "negotiated_snapshot"
    NEGOTIATED_APPLY_PENDING = "negotiated_apply_pending"
    # snapshot progress (carry the snapshot's cycle)
    SNAPSHOT_TRANSFER_COMPLETE = "snapshot_transfer_complete"
    SNAPSHOT_APPLY_IN_PROGRESS = "snapshot_apply_in_progress"
    SNAPSHOT_APPLY_COMPLETE = "snapshot_apply_complete"
    # faults while syncing (carry the cycle they happened in)
    TRIMMED_READ = "trimmed_read"
    SEND_ERROR = "send_error"
    ACK_TIMEOUT = "ack_timeout"
    FAILED = "failed"
    """Not fixable by retrying (e.g. the remote is not the site expected)."""


S, E = SyncState, SyncEvent

_SYNCING = (S.SNAPSHOT_SYNC, S.WAIT_SNAPSHOT_APPLY, S.LOG_ENTRY_SYNC)
_CONNECTED = (S.NEGOTIATING, *_SYNCING)

TRANSITIONS: Final[Mapping[tuple[SyncState, SyncEvent], SyncState]] = {
    (S.INITIALIZED, E.START): S.NEGOTIATING,
    (S.ERROR, E.START): S.NEGOTIATING,
    (S.NEGOTIATING, E.NEGOTIATED_DELTAS): S.LOG_ENTRY_SYNC,
    (S.NEGOTIATING, E.NEGOTIATED_SNAPSHOT): S.SNAPSHOT_SYNC,
    (S.NEGOTIATING, E.NEGOTIATED_APPLY_PENDING): S.WAIT_SNAPSHOT_APPLY,
    (S.SNAPSHOT_SYNC, E.SNAPSHOT_TRANSFER_COMPLETE): S.WAIT_SNAPSHOT_APPLY,
    (S.WAIT_SNAPSHOT_APPLY, E.SNAPSHOT_APPLY_IN_PROGRESS): S.WAIT_SNAPSHOT_APPLY,
    (S.WAIT_SNAPSHOT_APPLY, E.SNAPSHOT_APPLY_COMPLETE): S.LOG_ENTRY_SYNC,
    (S.LOG_ENTRY_SYNC, E.TRIMMED_READ): S.SNAPSHOT_SYNC,
    # a resync request or a fault while connected: a new snapshot cycle
    **{(state, E.RESYNC_REQUEST): S.SNAPSHOT_SYNC for state in _CONNECTED},
    **{(state, E.SEND_ERROR): S.SNAPSHOT_SYNC for state in _SYNCING},
    **{(state, E.ACK_TIMEOUT): S.SNAPSHOT_SYNC for state in _SYNCING},
    # not connected: a resync waits for the next negotiation, which asks the sink anyway
    (S.INITIALIZED, E.RESYNC_REQUEST): S.INITIALIZED,
    (S.ERROR, E.RESYNC_REQUEST): S.ERROR,
    **{(state, E.DISCONNECTED): S.INITIALIZED for state in _CONNECTED},
    (S.INITIALIZED, E.DISCONNECTED): S.INITIALIZED,
    (S.ERROR, E.DISCONNECTED): S.ERROR,
    **{(state, E.FAILED): S.ERROR for state in (S.INITIALIZED, *_CONNECTED)},
    **{(state, E.STOP): S.STOPPED for state in SyncState if state is not S.STOPPED},
}
"""(state, event) -> next state. STOPPED has no way out."""

CYCLE_EVENTS: Final = frozenset(
    {
        E.NEGOTIATED_DELTAS,
        E.NEGOTIATED_SNAPSHOT,
        E.NEGOTIATED_APPLY_PENDING,
        E.SNAPSHOT_TRANSFER_COMPLETE,
        E.SNAPSHOT_APPLY_IN_PROGRESS,
        E.SNAPSHOT_APPLY_COMPLETE,
        E.TRIMMED_READ,
        E.SEND_ERROR,
        E.ACK_TIMEOUT,
    }
)
"""Events that belong to a sync cycle: they carry its id, and a stale one is dropped."""

NEW_CYCLE: Final = frozenset({S.NEGOTIATING, S.SNAPSHOT_SYNC})
"""Entering these states opens a new cycle (a snapshot restarted from SNAPSHOT_SYNC too)."""


class UnexpectedEvent(Exception):
    """An event the table has no transition for in the current state: a bug in the caller."""


@dataclass(frozen=True, slots=True)
class Transition:
    """What :meth:`SenderSession.handle` did: ``applied`` False means a stale event, dropped."""

    applied: bool
    before: SyncState
    after: SyncState
    cycle: int
    """The session's cycle after the event (a new one when the event opened one)."""


class SenderSession:
    """The state of one source → remote-site session, with no I/O: the caller feeds events and
    acts on the transitions (start a snapshot, ship deltas, renegotiate)."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.state = SyncState.INITIALIZED
        self.cycle = 0
        """Id of the current sync cycle; raised by every negotiation and snapshot start."""

    def handle(self, event: SyncEvent, cycle: int | None = None) -> Transition:
        """Apply ``event``. A cycle event must name its cycle; one of an older (or a future)
        cycle is dropped and reported with ``applied=False``. Raises :class:`UnexpectedEvent`
        for a pair missing from the table."""
        before = self.state
        if event in CYCLE_EVENTS:
            if cycle is None:
                raise ValueError(f"{event.name} belongs to a sync cycle: give its id")
            if cycle != self.cycle:
                return Transition(False, before, before, self.cycle)
        elif cycle is not None:
            raise ValueError(f"{event.name} does not belong to a sync cycle")
        after = TRANSITIONS.get((before, event))
        if after is None:
            raise UnexpectedEvent(
                f"site {self.site!r}: no transition for {event.name} in state {before.name}"
            )
        if after in NEW_CYCLE:
            self.cycle += 1
        self.state = after
        return Transition(True, before, after, self.cycle)
