"""The operator's caps (``broker/limits.py``): streams, partitions per stream and views beyond
their settings are refused with ``LimitReached`` naming the setting, and nothing is created."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig, ViewKind, ViewSpec
from tidelog.errors import LimitReached, StreamExists


def test_streams_partitions_and_views_are_capped(tmp_path: Path) -> None:
    config = broker_config(tmp_path, max_streams=2, max_partitions_per_stream=4, max_views=1)

    async def body() -> None:
        async with running(config) as broker:
            with pytest.raises(LimitReached, match="max_partitions_per_stream"):
                broker.create_stream("wide", StreamConfig(partitions=5))
            broker.create_stream("a", StreamConfig(partitions=4))
            broker.create_stream("b")  # __cursors is the broker's own: not counted
            with pytest.raises(StreamExists):
                broker.create_stream("a")  # a taken name says so, whatever the caps
            with pytest.raises(LimitReached, match="max_streams") as refused:
                broker.create_stream("c")
            assert refused.value.setting == "max_streams"
            assert broker.find_stream("c") is None and broker.find_stream("wide") is None
            assert not (tmp_path / "streams" / "c").exists()
            table = ViewSpec("latest", ViewKind.TABLE)
            await broker.declare_view("a", table)
            await broker.declare_view("a", table)  # declaring it again is no new view
            with pytest.raises(LimitReached, match="max_views"):
                await broker.declare_view("b", ViewSpec("other", ViewKind.TABLE))
            await broker.drop_view("a", "latest")
            await broker.declare_view("b", ViewSpec("other", ViewKind.TABLE))
            await broker.delete_stream("b")
            broker.create_stream("c")  # room again

    asyncio.run(body())
