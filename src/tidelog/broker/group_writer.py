"""Saving the consumer groups off the event loop, many changes per write.

Before this, every membership change rewrote and fsynced ``groups.json`` on the event loop: a
flood of joins stalled every other call of the broker (other clients' publishes went from 2 ms
to ~100 ms at the median, over a second at peaks). Now a change only bumps a counter here.

Theory of operation. ``changed()`` (called by the coordinator after each membership change, on
the loop) numbers the change and starts the writer task unless it runs. The task loops: it takes
the latest number and the coordinator's document and checkpoint (on the loop, so they agree),
writes the document in a worker thread, and on success marks every change up to that number
durable, releasing their ``saved()`` waiters. Changes made while a write runs wait for the next
one, which carries them all: a flood of N joins costs about two writes, not N. A failed write
reverts the coordinator to the last durable checkpoint (every change since is undone, as a save
on the spot would have undone its own) and fails every waiter with the error; a later change
tries again. Invariant: the file always holds a state the coordinator was in, and a join or
leave is answered only once a write holding it (or its failure) is known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tidelog.broker.groups import GroupCoordinator

LOG = logging.getLogger("tidelog.broker")


class GroupWriter:
    """Saves ``coordinator`` with ``write`` (blocking; run in a thread), attached to it."""

    def __init__(
        self, coordinator: GroupCoordinator, write: Callable[[dict[str, Any]], None]
    ) -> None:
        self._coordinator = coordinator
        self._write = write
        self._changes = 0
        """Number of the latest change."""
        self._durable = 0
        """Every change up to this number is on disk (or was undone)."""
        self._good = coordinator.checkpoint()
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.writes = 0
        """Writes started (for tests: a flood must coalesce)."""
        coordinator.changed = self.changed

    def restart(self) -> None:
        """The coordinator's groups were replaced (restored at start): they are the durable
        state to go back to."""
        self._good = self._coordinator.checkpoint()

    def changed(self) -> None:
        self._changes += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="groups writer")

    async def saved(self) -> None:
        """Return once every change made so far is durable; raise what its write raised."""
        if self._durable >= self._changes:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((self._changes, waiter))
        await waiter

    async def flush(self) -> None:
        """Wait for the writer to finish (close): nothing is left unsaved that can be saved."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    async def _run(self) -> None:
        while self._durable < self._changes:
            target = self._changes
            document = self._coordinator.document()
            checkpoint = self._coordinator.checkpoint()
            self.writes += 1
            try:
                await asyncio.to_thread(self._write, document)
            except Exception as error:
                self._coordinator.revert(self._good)
                self._durable = self._changes  # undone: nothing of them is pending any more
                LOG.warning("consumer-group changes undone, they could not be saved: %s", error)
                self._settle(error)
                continue
            self._good = checkpoint
            self._durable = target
            self._settle(None)

    def _settle(self, error: Exception | None) -> None:
        waiting = []
        for number, waiter in self._waiters:
            if number > self._durable:
                waiting.append((number, waiter))
            elif not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)
        self._waiters = waiting
