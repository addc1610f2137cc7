"""One sync at a time for a partition's publishes that wait for theirs (``durable``, ack ALL).

Why. Each such publish ran its own ``log.flush`` in a worker thread. The log already lets one
sync cover every append made before it (``LogWriter.sync_through``), so most of those calls
found nothing left to sync; but each still cost a thread hand-off and a wake-up of the event
loop, about 0.4 us a message on a leader taking 1,000-message batches from four publishers
(``docs/performance.md``, "Replication as a stream").

Theory of operation. :meth:`SharedSync.through` waits until the log is synced at least through
an offset. A sync, once started, covers every record appended before it started (the offset
before the log's end then is noted, and counted synced once it returns). A caller whose record
is covered by the sync running now waits for it; one whose record came after waits for the
next, which starts once the running one ends and covers every caller waiting by then. So
under any number of concurrent publishes at most two syncs are outstanding, and each runs once.

Invariants. ``synced`` is never above an offset the log holds synced: a cut (``forget_from``)
lowers it to below the cut (and a sync running across it counts nothing), so a record appended
again at a cut offset waits for a sync of its own.
A failed sync raises in every caller waiting for it and counts nothing; the next caller starts
another. A caller cancelled while waiting does not cancel the sync the others wait for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class SharedSync:
    """The syncs of one log, shared by the publishes that wait for them (module docstring)."""

    def __init__(self, flush: Callable[[], None], newest: Callable[[], int]) -> None:
        """``flush``: syncs everything appended so far (blocking; run in a worker thread).
        ``newest``: the offset of the newest record appended now."""
        self._flush = flush
        self._newest = newest
        self.synced = -1
        """Every record at or below this offset is synced."""
        self._running: asyncio.Task[None] | None = None
        self._cuts = 0
        """Cuts so far: a sync running across one counts nothing synced."""
        self.syncs = 0
        """Syncs run so far (for tests)."""

    async def through(self, offset: int) -> None:
        """Return once every record through ``offset`` is synced."""
        while self.synced < offset:
            running = self._running
            if running is None:
                running = self._running = asyncio.ensure_future(self._sync(self._newest()))
                running.add_done_callback(_retrieve)
            await asyncio.shield(running)

    async def _sync(self, target: int) -> None:
        cuts = self._cuts
        try:
            self.syncs += 1
            await asyncio.to_thread(self._flush)
            if cuts == self._cuts:
                self.synced = max(self.synced, target)
        finally:
            self._running = None

    def forget_from(self, offset: int) -> None:
        """The log was cut at ``offset``: what is appended there again is not synced (nor
        counted synced by a sync that was running across the cut)."""
        self._cuts += 1
        self.synced = min(self.synced, offset - 1)


def _retrieve(task: asyncio.Task[None]) -> None:
    """A sync whose every waiter was cancelled still has its error looked at (no warning)."""
    if not task.cancelled():
        task.exception()
