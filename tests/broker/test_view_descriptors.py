"""Views draw their descriptors from the broker's open-file budget (``broker/descriptors.py``):
a view that does not fit is refused naming ``open_files_max`` (never an internal error), the
segment cache gets what the views leave, and a data directory whose views outgrow a lower
descriptor limit still starts, those views left closed and answered RESOURCE_EXHAUSTED.

Measured on the commit before: a view on a 1024-partition stream held ~6,100 descriptors, the
fourth failed with INTERNAL, and that directory could not start under 8,192 descriptors."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from tests.broker.brokertools import broker_config, running
from tests.support.server import ServerProcess

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.broker import StreamConfig, ViewKind, ViewSpec
from tidelog.broker.descriptors import VIEW_STORE_DESCRIPTORS
from tidelog.errors import LimitReached
from tidelog.log import NewRecord

TABLE = VIEW_STORE_DESCRIPTORS[ViewKind.TABLE]


def test_a_view_past_the_budget_is_refused_naming_open_files_max(tmp_path: Path) -> None:
    config = broker_config(tmp_path, open_files_max=16 * TABLE)  # views may hold 8 stores

    async def body() -> None:
        async with running(config) as broker:
            broker.create_stream("four", StreamConfig(partitions=4))
            broker.create_stream("five", StreamConfig(partitions=5))
            await broker.declare_view("four", ViewSpec("a", ViewKind.TABLE))
            assert broker.descriptors.views == 4 * TABLE
            assert broker.files.capacity == 12 * TABLE, "segments get what views leave"
            with pytest.raises(LimitReached, match="open_files_max") as refused:
                await broker.declare_view("five", ViewSpec("b", ViewKind.TABLE))
            assert "needs 40 descriptors" in str(refused.value)
            assert "b" not in broker.views("five").specs
            await broker.declare_view("four", ViewSpec("c", ViewKind.TABLE))  # 8 stores: fits
            await broker.drop_view("four", "a")
            await broker.delete_stream("four")
            assert broker.descriptors.views == 0 and broker.files.capacity == 16 * TABLE
            await broker.declare_view("five", ViewSpec("b", ViewKind.TABLE))

    asyncio.run(body())


def test_a_restart_under_a_low_descriptor_limit_leaves_the_views_that_do_not_fit_closed(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # Written with room to spare: 4 + 48 stores.
    config = broker_config(data, open_files_max=1000)

    async def write() -> None:
        async with running(config) as broker:
            broker.create_stream("small", StreamConfig(partitions=4))
            broker.create_stream("wide", StreamConfig(partitions=48))
            await broker.declare_view("small", ViewSpec("latest", ViewKind.TABLE))
            await broker.declare_view("wide", ViewSpec("latest", ViewKind.TABLE))
            await broker.publish("small", 0, [NewRecord(b"v", key=b"k")])

    asyncio.run(write())
    # 256 descriptors: the server keeps 128 for its budget, 64 for views: the small view only.
    server = ServerProcess(data, max_open_files=256).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            api = v1_grpc.TidelogStub(channel)
            found = api.ViewGet(v1.ViewGetRequest(stream="small", view="latest", key=b"k"))
            assert found.found and found.entry.value == b"v"
            with pytest.raises(grpc.RpcError) as refused:
                api.ViewGet(v1.ViewGetRequest(stream="wide", view="latest", key=b"k"))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "open_files_max" in (refused.value.details() or "")
        assert server.stop() == 0
    finally:
        server.kill()


def test_views_declared_before_open_at_start_past_the_views_half_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade (or a lower open_files_max) must not close views that served before: at start
    they take from the segment files' share; only new declares keep to the half."""
    data = tmp_path / "data"

    async def write() -> None:
        async with running(broker_config(data, open_files_max=1000)) as broker:
            for name, partitions in (("small", 4), ("wide", 48)):
                broker.create_stream(name, StreamConfig(partitions=partitions))
                await broker.declare_view(name, ViewSpec("latest", ViewKind.TABLE))
            await broker.publish("wide", 7, [NewRecord(b"v", key=b"k")])

    async def restart() -> None:
        # 52 stores (416 descriptors) against 300 for views: over the half, under 450.
        async with running(broker_config(data, open_files_max=600)) as broker:
            assert broker.descriptors.views == 52 * TABLE
            assert broker.files.capacity == 600 - 52 * TABLE
            wide = broker.views("wide")
            assert not wide._left_closed and "latest" in wide._views
            with pytest.raises(LimitReached, match="open_files_max"):
                await broker.declare_view("small", ViewSpec("new", ViewKind.TABLE))

    asyncio.run(write())
    with caplog.at_level(logging.WARNING, logger="tidelog"):
        asyncio.run(restart())
    warnings = [r.getMessage() for r in caplog.records if "segment files' share" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "open_files_max = 600" in warnings[0] and f"({2 * 52 * TABLE}" in warnings[0]
