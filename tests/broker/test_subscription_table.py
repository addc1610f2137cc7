"""The subscription's state table, checked as a table, and a seekable subscription driven
through it event by event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StartPosition, SubscribeRequest
from tidelog.broker.subscription import TRANSITIONS, EndReason, Event, SubscriberState
from tidelog.errors import InvalidArgument, PartitionPaused

R, L, S, F = (
    SubscriberState.RESUMING,
    SubscriberState.LIVE,
    SubscriberState.STOPPED,
    SubscriberState.FAILED,
)


def test_failed_is_final_and_only_a_seek_leaves_stopped() -> None:
    for (state, event), after in TRANSITIONS.items():
        if state is F:
            assert after is F, (state, event)
        if state is S and after is not S:
            assert (event, after) in ((Event.SEEK, R), (Event.FAIL, F)), (state, event)


def test_every_active_state_answers_every_event() -> None:
    """A subscription that is reading or waiting can receive any event; none is a KeyError."""
    for state in (R, L):
        for event in Event:
            assert (state, event) in TRANSITIONS, (state, event)


def test_reading_and_waiting() -> None:
    assert TRANSITIONS[(R, Event.CAUGHT_UP)] is L
    assert TRANSITIONS[(L, Event.DATA)] is R
    assert TRANSITIONS[(L, Event.END)] is S
    assert TRANSITIONS[(L, Event.CANCEL)] is S
    assert TRANSITIONS[(R, Event.FAIL)] is F


def test_seekable_subscription_through_the_table(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            await broker.publish("s", 0, [b"%d" % i for i in range(5)])
            reverse_latest = SubscribeRequest(start=StartPosition.LATEST, reverse=True)
            sub = broker.consume("s", 0, reverse_latest, max_messages=2)
            batches = sub.batches()
            waiting = asyncio.ensure_future(anext(batches))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # no permits yet: nothing is read
            sub.grant(3)
            first = await asyncio.wait_for(waiting, 5)
            assert first.offsets.tolist() == [4, 3]
            second = await asyncio.wait_for(anext(batches), 5)
            assert second.offsets.tolist() == [2]  # the grant bounds the read
            sub.grant(10)
            third = await asyncio.wait_for(anext(batches), 5)
            assert third.offsets.tolist() == [1, 0]
            end = await asyncio.wait_for(anext(batches), 5)
            assert not end and sub.end_reason is EndReason.OLDEST
            assert sub.state is S
            sub.seek(
                SubscribeRequest(start=StartPosition.OFFSET, start_offset=1, reverse=True),
                epoch=7,
                permits=1,
            )
            assert sub.state is R
            again = await asyncio.wait_for(anext(batches), 5)
            assert again.offsets.tolist() == [1] and sub.batch_epoch == 7
            with pytest.raises(InvalidArgument):
                broker.subscribe("s", 0, reverse_latest).grant(1)
            broker.pause("s", None, resume_all=False)
            with pytest.raises(PartitionPaused):
                await asyncio.wait_for(anext(batches), 5)
            assert sub.state is F

    asyncio.run(body())
