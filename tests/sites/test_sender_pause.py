"""The sender's pause (``tidelog/sites/sender.py``): it waits on the partition's shared commit
signal without ever cancelling it, so an idle sender sleeps instead of spinning."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from tidelog.broker.partition import CommitSignal
from tidelog.sites.registry import Site
from tidelog.sites.sender import Sender


class _QuietLink:
    """A stream that stays open and says nothing."""

    def __init__(self) -> None:
        self.reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def check(self) -> None:
        pass


def _sender() -> Sender:
    return Sender(cast(Any, None), cast(Any, None), Site("b", "h:1", 0, 0), "a")


def test_a_pause_leaves_the_shared_commit_signal_pending() -> None:
    async def main() -> None:
        signal = CommitSignal(asyncio.get_running_loop())
        sender, link = _sender(), _QuietLink()
        shared = signal.current()
        pausing = asyncio.create_task(sender._pause(cast(Any, link), shared))
        await asyncio.sleep(0.01)
        sender._wake.set()  # an ack ends the pause, not the signal
        await pausing
        assert not shared.done(), "a cancelled signal wakes every other waiter at once"
        assert signal.current() is shared
        signal.fire()
        assert shared.done() and not shared.cancelled()

    asyncio.run(main())


def test_an_idle_sender_wakes_about_once_a_second() -> None:
    """The delta loop's idle wait: take the signal, pause on it. After one pause ended by an ack,
    a sender spinning on a cancelled signal runs thousands of rounds in the time given; one whose
    signal stays pending waits for it (or for its one-second timeout)."""

    async def main() -> None:
        signal = CommitSignal(asyncio.get_running_loop())
        sender, link = _sender(), _QuietLink()
        rounds = 0

        async def idle_loop() -> None:
            nonlocal rounds
            while True:
                rounds += 1
                sender._wake.clear()
                await sender._pause(cast(Any, link), signal.current())

        looping = asyncio.create_task(idle_loop())
        await asyncio.sleep(0.05)
        sender._wake.set()  # one ack: the first round ends early
        await asyncio.sleep(0.3)
        looping.cancel()
        await asyncio.gather(looping, return_exceptions=True)
        assert rounds <= 3, f"{rounds} rounds in 0.35 s with nothing to do"

    asyncio.run(main())
