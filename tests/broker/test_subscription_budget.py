"""The per-subscription byte budget (``subscriber_buffer_bytes``): a subscription never holds a
batch larger than its budget, whatever batch size its subscriber asked for, except that one
message larger than the budget is delivered alone; every message still arrives once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import BrokerConfig, StartPosition, StopPosition, SubscribeRequest

VALUE = 1000


def to_latest() -> SubscribeRequest:
    return SubscribeRequest(start=StartPosition.EARLIEST, stop=StopPosition.LATEST)


async def batch_sizes(
    config: BrokerConfig, values: list[bytes], max_bytes: int | None = None
) -> list[tuple[int, int]]:
    """(records, record bytes) of every batch a subscription to the latest offset delivers."""
    sizes: list[tuple[int, int]] = []
    async with running(config) as broker:
        broker.create_stream("b")
        for first in range(0, len(values), 500):
            await broker.publish("b", 0, values[first : first + 500])
        subscription = broker.subscribe("b", 0, to_latest(), max_bytes=max_bytes)
        offsets: list[int] = []
        try:
            async for batch in subscription.batches():
                sizes.append((len(batch), batch.byte_size))
                offsets += batch.offsets.tolist()
        except Exception as end:  # StopReached: the stop offset was delivered
            assert type(end).__name__ == "StopReached"
        assert offsets == list(range(len(values)))
    return sizes


@pytest.mark.parametrize("asked", [None, 4 << 20])
def test_batches_stay_within_the_default_budget(tmp_path: Path, asked: int | None) -> None:
    values = [b"v" * VALUE] * 3000  # ~3 MB
    sizes = asyncio.run(batch_sizes(broker_config(tmp_path), values, asked))
    budget = BrokerConfig().subscriber_buffer_bytes
    assert budget <= 1 << 20
    assert max(size for _, size in sizes) <= budget
    assert len(sizes) >= 3_000_000 // budget  # the budget, not a larger ask, sized them


def test_a_configured_budget_and_a_message_larger_than_it(tmp_path: Path) -> None:
    config = broker_config(tmp_path, subscriber_buffer_bytes=8192)
    values = [b"s" * 100] * 200 + [b"L" * 20_000] + [b"s" * 100] * 200
    sizes = asyncio.run(batch_sizes(config, values))
    assert [size > 20_000 for n, size in sizes if n == 1] == [True]  # the large one, alone
    assert all(size <= 8192 for n, size in sizes if n > 1)
