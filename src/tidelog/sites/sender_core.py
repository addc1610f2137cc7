"""What every part of a sender (``sender.py``) shares: its settings, the site as it last learned
it, the session's state table (``sync_states.py``), what it gave the site and heard back, and
the wake-up all its waits share.

Invariants: ``_shipped`` (the highest position given to the site) only rises, and with it
:meth:`SenderCore.given_end`; an ack at or past ``given_end`` is never taken as acknowledged
(:class:`AckBeyondEnd` ends the stream); a wait (:meth:`SenderCore._pause`) never cancels a
future it shares with other waiters; and a waiter clears ``_wake`` before it reads what it
waits on, so an ack, an apply or a resync request from then on ends the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from tidelog.security import PLAINTEXT, ClientTls
from tidelog.sites.negotiation import NONE
from tidelog.sites.registry import Site
from tidelog.sites.routed import RoutedColumns
from tidelog.sites.send_queue import SendQueue
from tidelog.sites.sender_link import Link
from tidelog.sites.snapshots import Snapshots
from tidelog.sites.sync_states import SenderSession, SyncEvent, SyncState
from tidelog.sites.windows import SENDER_STEP, SendWindow

FIRST: Final = asyncio.FIRST_COMPLETED
ACK_TIMEOUT_S: Final = 10.0
"""Default wait for a batch's ack before it is sent again (the server's sites_ack_timeout_s)."""


@dataclass(frozen=True, slots=True)
class SenderStatus:
    site_id: str
    state: SyncState
    acked: int
    """The last position the site acknowledged (``NONE``: none yet)."""
    last_ack_s: float | None
    """Unix time of the last ack from the site (None: none since this server started)."""
    reason: str
    """The last negotiation's reason, or the last error."""


SiteChange = Callable[[Callable[[int], Site]], Awaitable[Site]]
"""Runs a change of the registry for one site (given the queue's next offset, returning the
site as changed) with transmits held back, and keeps it (``LocalSite.change_site``)."""


class AckBeyondEnd(ConnectionError):
    """The sink acknowledged a position this queue never gave: the stream ends, and the next
    negotiation refuses that position."""


class SenderCore:
    """The state a sender's parts share, and the small steps they all take."""

    def __init__(
        self,
        queue: SendQueue,
        snapshots: Snapshots,
        site: Site,
        local_site: str,
        *,
        batch_entries: int = 1000,
        window: int = 8,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        max_pause_s: float = 5.0,
        provider_timeout_s: float = 60.0,
        max_resends: int = 2,
        change_site: SiteChange | None = None,
        tls: ClientTls = PLAINTEXT,
        step: int = SENDER_STEP,
    ) -> None:
        """``step``: how far past its ``prev`` a batch may reach (``sender_deltas.py``; below
        the sink's ``max_jump``); ``change_site``: how a change of the site's registry entry is
        made and kept (by default here, in this queue's registry); ``tls``: how this server
        calls other sites (its own certificate as the client's; the site's certificate must
        name the site id, ``sender.py``)."""
        self.queue = queue
        self.tls = tls
        self._change_site = change_site or self._change_here
        self.snapshots = snapshots
        self.provider_timeout_s = provider_timeout_s
        self.max_resends = max_resends
        """Resends of an unacked batch (after ``ack_timeout_s``, then twice as long each time)
        before the session gives up on deltas and starts a snapshot sync."""
        self.site = site
        self.local_site = local_site
        self.batch_entries = batch_entries
        self.step = step
        self.window_batches = window
        self.ack_timeout_s = ack_timeout_s
        self.max_pause_s = max_pause_s
        self.session = SenderSession(site.site_id)
        self.acked = NONE
        self.last_ack_s: float | None = None
        self.reason = "not connected yet"
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        """Set by an ack, a snapshot's apply or a resync request: the session looks again."""
        self._window: SendWindow[RoutedColumns] | None = None
        self._resync_asked: str | None = site.resync or None
        """Why the next negotiation must start a snapshot (None: let it decide)."""
        self._shipped = NONE
        """The highest position this sender gave the site: a delta shipped, or the position a
        snapshot it shipped covers."""

    def given_end(self) -> int:
        """The lowest position this source cannot have given the site: above every position
        of the queue as it was opened (an earlier run gave nothing past it, unless the queue
        lost records) and every one this sender gave since."""
        return max(self.queue.opened_position, self._shipped + 1)

    @property
    def status(self) -> SenderStatus:
        reason = self.reason
        refused = self.site.resync
        if refused and refused != reason:
            reason = f"{refused}; {reason}"  # until the snapshot it is owed is applied
        return SenderStatus(
            self.site.site_id, self.session.state, self.acked, self.last_ack_s, reason
        )

    async def _change_here(self, change: Callable[[int], Site]) -> Site:
        async with self.queue.positions_changing():
            return change(await self.queue.settled_end())

    def _declared(self) -> Site:
        """The site as the registry has it now (what the sender learned may have changed it);
        the one it was started with once it is removed."""
        registry = self.queue.registry
        found = next((s for s in registry.list() if s.site_id == self.site.site_id), None)
        if found is None or (found.number, found.since) != (self.site.number, self.site.since):
            return self.site
        return found

    @property
    def resyncing(self) -> bool:
        """A snapshot sync is asked for (and not applied yet) or under way."""
        return self._resync_asked is not None or self.session.state in (
            SyncState.SNAPSHOT_SYNC,
            SyncState.WAIT_SNAPSHOT_APPLY,
        )

    def request_resync(self, reason: str) -> bool:
        """An operator's resync (``tidelog site resync``): started unless one is asked for or
        under way already (then this one is that one: the state is built and sent once).
        Returns whether it started one."""
        if self.resyncing:
            return False
        self.resync(reason)
        return True

    def resync(self, reason: str = "a resync was requested") -> None:
        """Start a snapshot sync of the site: now if connected, else at the next negotiation."""
        self._resync_asked = reason
        if self.session.state in (
            SyncState.NEGOTIATING,
            SyncState.SNAPSHOT_SYNC,
            SyncState.WAIT_SNAPSHOT_APPLY,
            SyncState.LOG_ENTRY_SYNC,
        ):
            self.session.handle(SyncEvent.RESYNC_REQUEST)
            self.reason = reason
        self._wake.set()

    def _on_ack(self, acked: int) -> None:
        if acked >= self.given_end():
            # Never taken as acknowledged: the stream ends, and the next negotiation refuses it.
            raise AckBeyondEnd(
                f"site {self.site.site_id} acknowledged position {acked}, beyond what this "
                f"source gave it (every position it gave is below {self.given_end()})"
            )
        if self._window is not None:
            self._window.ack(acked)
        self.acked = max(self.acked, acked)
        self.last_ack_s = time.time()
        self._wake.set()

    async def _pause(self, link: Link, *wakers: Awaitable[Any]) -> None:
        """Wait up to a second for one of ``wakers``, a wake-up or the end of the stream;
        raises what ended the stream.

        A waker that is a future already (a commit signal's ``current()``) is shared with every
        other waiter of that partition: it is waited on, never cancelled. Cancelling it would
        leave the partition handing out a done future until its next append, and every waiter,
        this sender's next pause included, would spin. Only the tasks made here for coroutine
        wakers are cancelled."""
        link.check()
        shared = [w for w in wakers if asyncio.isfuture(w)]
        ours = {asyncio.ensure_future(w) for w in wakers if not asyncio.isfuture(w)}
        ours.add(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait({*shared, *ours, link.reader}, timeout=1.0, return_when=FIRST)
        finally:
            for task in ours:
                task.cancel()
        link.check()
