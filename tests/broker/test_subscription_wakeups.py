"""A live subscriber's wake-up costs one read: a tailing subscription whose read reached the
high watermark is caught up without the read that would return nothing (issue 27, live latency).
Subscriptions with a stop bound, reverse or seekable ones still read until a read is empty, so
their ends are found exactly as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import Partition0, broker_config, running, settle

from tidelog.broker import StartPosition, StopPosition, SubscribeRequest
from tidelog.broker.subscription import SubscriberState, Subscription
from tidelog.errors import StopReached
from tidelog.log import MessageBatch


def _count_reads(subscription: Subscription) -> list[int]:
    """Wrap the subscription's reader: the returned list gets each read's message count."""
    reader = subscription._reader
    assert reader is not None
    read = reader.read
    counts: list[int] = []

    def counted(max_messages: int = 1000, max_bytes: int = 1 << 20) -> MessageBatch:
        batch = read(max_messages, max_bytes)
        counts.append(len(batch))
        return batch

    reader.read = counted  # type: ignore[method-assign]
    return counts


def test_a_live_wake_up_reads_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            part = Partition0(broker, "s")
            part.append([0])
            subscription = broker.subscribe("s", 0, SubscribeRequest(StartPosition.NEW_ONLY))
            counts = _count_reads(subscription)
            seen: list[list[int]] = []

            async def consume() -> None:
                async for batch in subscription.batches():
                    seen.append(batch.offsets.tolist())

            task = asyncio.create_task(consume())
            await settle(task, subscription)
            assert counts == [0]  # nothing new yet: one empty read, then live
            for k in range(5):
                part.append([1 + 2 * k, 2 + 2 * k])
                await settle(task, subscription)
                assert subscription.state is SubscriberState.LIVE
            assert seen == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
            assert counts == [0, 2, 2, 2, 2, 2]  # one read per commit, none empty
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(body())


def test_a_read_short_of_the_high_watermark_reads_on(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            part = Partition0(broker, "s")
            part.append([0, 1, 2, 3, 4])
            request = SubscribeRequest(StartPosition.EARLIEST)
            subscription = broker.subscribe("s", 0, request, max_messages=2)
            counts = _count_reads(subscription)
            seen: list[list[int]] = []

            async def consume() -> None:
                async for batch in subscription.batches():
                    seen.append(batch.offsets.tolist())

            task = asyncio.create_task(consume())
            await settle(task, subscription)
            assert seen == [[0, 1], [2, 3], [4]]
            assert counts == [2, 2, 1]  # the last read reached the watermark: no empty read
            assert subscription.state is SubscriberState.LIVE
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(body())


def test_a_stop_at_the_high_watermark_still_ends(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1, 2])
            request = SubscribeRequest(StartPosition.EARLIEST, stop=StopPosition.LATEST)
            subscription = broker.subscribe("s", 0, request)
            seen: list[list[int]] = []
            with pytest.raises(StopReached):
                async for batch in subscription.batches():
                    seen.append(batch.offsets.tolist())
            assert seen == [[0, 1, 2]]
            assert subscription.state is SubscriberState.STOPPED

    asyncio.run(body())
