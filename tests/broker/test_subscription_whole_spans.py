"""Whole read-ahead spans as batches (``Subscription.send_whole_spans``, what ``SubscribeBatches``
asks for when its subscriber leaves the batch size to the broker): a catch-up's batches may exceed
the subscription's byte budget, up to ``READAHEAD_BYTES``, only on a lease of the process-wide
read-ahead budget, given back once its frame has been sent (here at once) or the subscription
ends; with that budget spent the batches are the byte budget's size again. Every message arrives
once, in order, whatever the batches' sizes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import BrokerConfig, StartPosition, StopPosition, SubscribeRequest
from tidelog.broker.subscription import READAHEAD_BYTES
from tidelog.log.readahead import READAHEAD

VALUE = 100
COUNT = 30_000  # about 4 MB of records: several spans


def to_latest() -> SubscribeRequest:
    return SubscribeRequest(start=StartPosition.EARLIEST, stop=StopPosition.LATEST)


async def catch_up(config: BrokerConfig, *, whole: bool, spend: int = 0) -> list[int]:
    """The record bytes of every batch of a catch-up over ``COUNT`` messages (checked: each
    offset once, in order), with ``spend`` bytes of the read-ahead budget leased elsewhere; and
    that every lease is back when the subscription has ended."""
    sizes: list[int] = []
    held = READAHEAD.lease(spend) if spend else None
    try:
        async with running(config) as broker:
            broker.create_stream("w")
            values = [i.to_bytes(4, "little") * (VALUE // 4) for i in range(COUNT)]
            for first in range(0, COUNT, 5000):
                await broker.publish("w", 0, values[first : first + 5000])
            subscription = broker.subscribe("w", 0, to_latest())
            if whole:
                subscription.send_whole_spans(lambda: (0, 0))  # sent at once
            offsets: list[int] = []
            try:
                async for batch in subscription.batches():
                    sizes.append(batch.byte_size)
                    offsets += batch.offsets.tolist()
                    assert batch.values() == values[batch.first_offset : batch.last_offset + 1]
            except Exception as end:  # StopReached: the stop offset was delivered
                assert type(end).__name__ == "StopReached"
            assert offsets == list(range(COUNT))
            del subscription
    finally:
        if held is not None:
            held.release()
    assert READAHEAD.leased == 0
    return sizes


def test_whole_spans_go_out_as_one_batch_each(tmp_path: Path) -> None:
    config = broker_config(tmp_path)
    sizes = asyncio.run(catch_up(config, whole=True))
    budget = config.subscriber_buffer_bytes
    assert max(sizes) > budget
    assert max(sizes) <= READAHEAD_BYTES
    assert len(sizes) < COUNT * (VALUE + 32) // budget  # fewer batches than pieces would be


def test_without_it_batches_keep_to_the_budget(tmp_path: Path) -> None:
    config = broker_config(tmp_path)
    sizes = asyncio.run(catch_up(config, whole=False))
    assert max(sizes) <= config.subscriber_buffer_bytes


def test_with_the_read_ahead_budget_spent_batches_keep_to_the_budget(tmp_path: Path) -> None:
    config = broker_config(tmp_path)
    spend = READAHEAD.budget_bytes - READAHEAD_BYTES + 1  # no room for one more span
    sizes = asyncio.run(catch_up(config, whole=True, spend=spend))
    assert max(sizes) <= config.subscriber_buffer_bytes
