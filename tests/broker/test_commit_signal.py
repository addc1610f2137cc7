"""The partition's commit signal is one future shared by every waiter: a waiter that cancels it
(a task awaiting it directly, then cancelled) must not leave the others spinning on a done
future, and the views' followers wait on it without cancelling it when they stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import ViewKind, ViewSpec
from tidelog.broker.partition import CommitSignal


def test_a_cancelled_signal_future_is_replaced_not_handed_out_done() -> None:
    async def main() -> None:
        signal = CommitSignal(asyncio.get_running_loop())
        shared = signal.current()
        waiter = asyncio.ensure_future(shared)  # the same future: cancelling it cancels it
        waiter.cancel()
        await asyncio.sleep(0)
        assert shared.cancelled()
        fresh = signal.current()
        assert fresh is not shared and not fresh.done(), "a done future makes waiters spin"
        signal.fire()
        assert fresh.done()

    asyncio.run(main())


def test_stopping_a_views_follower_leaves_the_partitions_signal_alone(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            stream = broker.create_stream("s")
            partition = stream.partitions[0]
            await broker.declare_view("s", ViewSpec("latest", ViewKind.TABLE))
            await asyncio.sleep(0.05)  # the follower waits on the signal now
            shared = partition.signal.current()
            await broker.drop_view("s", "latest")
            assert not shared.cancelled(), "dropping the view cancelled every waiter's future"

    asyncio.run(main())
