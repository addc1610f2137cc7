"""Whole spans stay on lease until their call has sent them (``broker/span_leases.py``).

Subscribers that catch up with whole spans and then stop reading: each one's call queues frames
until its high-water mark, then the handler waits with one more batch in hand. Every whole span
such a subscriber holds, queued or in hand, must be on lease (so together they hold no more than
their calls' queues, their byte budgets and their share of the read-ahead budget), that share
must leave the rest of the budget to other readers, and the leases come back once the frames
have been sent or the subscriptions end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.api.transport.call import HIGH_WATER
from tidelog.broker import StartPosition, StopPosition, SubscribeRequest
from tidelog.broker.span_leases import KEEP_FREE, MAX_HELD
from tidelog.broker.subscription import READAHEAD_BYTES
from tidelog.log import MessageBatch
from tidelog.log.readahead import READAHEAD

VALUE = 100
COUNT = 40_000  # about 5 MB of records: more spans than a stalled subscriber takes
SUBSCRIBERS = 12  # with two spans each, far more than the read-ahead budget


class StalledCall:
    """A call whose peer never reads: it queues frames until its high-water mark, sends none
    until told to (``flush``); ``outbound`` is what the native transport reports."""

    def __init__(self) -> None:
        self.queued: list[MessageBatch] = []
        self.pending = 0
        self.sent = 0
        self.in_hand: MessageBatch | None = None

    def outbound(self) -> tuple[int, int]:
        return self.pending, self.sent

    async def stall(self, batches: AsyncIterator[MessageBatch]) -> None:
        """Take batches as the handler does until ``write`` would wait: one more in hand."""
        while self.pending < HIGH_WATER:
            batch = await anext(batches)
            self.queued.append(batch)
            self.pending += batch.byte_size + 16 * len(batch) + 64  # columns and framing
        self.in_hand = await anext(batches)

    def flush(self) -> None:
        self.sent += self.pending
        self.pending = 0
        self.queued.clear()

    def held(self) -> list[MessageBatch]:
        return [b for b in (*self.queued, self.in_hand) if b is not None]


def whole(batches: list[MessageBatch], budget: int) -> int:
    return sum(b.byte_size for b in batches if b.byte_size > budget)


async def stalled_subscribers(tmp_path: Path) -> None:
    config = broker_config(tmp_path)
    budget = config.subscriber_buffer_bytes
    async with running(config) as broker:
        broker.create_stream("w")
        values = [i.to_bytes(4, "little") * (VALUE // 4) for i in range(COUNT)]
        for first in range(0, COUNT, 5000):
            await broker.publish("w", 0, values[first : first + 5000])
        request = SubscribeRequest(start=StartPosition.EARLIEST, stop=StopPosition.LATEST)
        calls, streams = [], []
        for _ in range(SUBSCRIBERS):
            call = StalledCall()
            subscription = broker.subscribe("w", 0, request)
            subscription.send_whole_spans(call.outbound)
            calls.append(call)
            streams.append(subscription.batches())
        for call, stream in zip(calls, streams, strict=True):
            await call.stall(stream)

        held = [call.held() for call in calls]
        assert any(whole(h, budget) for h in held)  # whole spans did go out
        # Every whole span held, queued or in hand, is on lease; the leases keep to their share.
        assert sum(whole(h, budget) for h in held) <= READAHEAD.leased
        assert READAHEAD.leased <= READAHEAD.budget_bytes - KEEP_FREE
        for h in held:
            assert sum(1 for b in h if b.byte_size > budget) <= MAX_HELD
            # Beyond its leases, a subscriber holds what any other does: its call's queue up
            # to the high-water mark (plus one budget-sized batch) and one batch in hand.
            assert sum(b.byte_size for b in h) - whole(h, budget) <= HIGH_WATER + 2 * budget
        # Other readers keep read-ahead.
        other = READAHEAD.lease(READAHEAD_BYTES)
        assert other is not None
        other.release()

        # Once a call has sent its frames, its next read gives their leases back.
        first = calls[0]
        before = READAHEAD.leased
        first.flush()
        first.in_hand = await anext(streams[0])
        assert READAHEAD.leased < before
        for stream in streams:
            await stream.aclose()
        assert READAHEAD.leased == 0


def test_stalled_subscribers_hold_whole_spans_only_on_lease(tmp_path: Path) -> None:
    asyncio.run(stalled_subscribers(tmp_path))
