"""A server that cannot start (its metrics port is taken) leaves nothing behind: no gRPC server,
the data directory unlocked, so a second try in the same process starts."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from tidelog.api.server import Server
from tidelog.api.settings import ServerSettings


def test_a_failed_start_releases_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            metrics_port = taken.getsockname()[1]
            settings = ServerSettings(data_dir=tmp_path / "data", port=0, metrics_port=metrics_port)
            failed = Server(settings)
            with pytest.raises(OSError, match="--metrics-port") as raised:
                await failed.start()
            assert f"127.0.0.1:{metrics_port}" in str(raised.value)
            # Nothing answers on the gRPC port the failed start had bound.
            if failed.port:
                with socket.socket() as probe:
                    assert probe.connect_ex(("127.0.0.1", failed.port)) != 0
        retry = Server(settings.model_copy(update={"metrics_port": 0}))
        await retry.start()  # the data directory's lock was released
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{retry.port}") as channel:
                await channel.channel_ready()
        finally:
            await retry.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))
