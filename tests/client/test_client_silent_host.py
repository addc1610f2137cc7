"""A host that takes TCP connections and never answers (a hung broker, a black hole after a
NAT): a publish that must not be sent twice waits for its channel a second per attempt, then
looks again, and gives up within its retry budget, not after gRPC's 20 s connect timeout. And a
stream a lookup did not know is looked up again before the next call (it may exist since)."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.client import AsyncClient, ClientSettings, Unavailable
from tidelog.client.leaders import LeaderRouter


def test_a_plain_publish_to_a_silent_host_gives_up_within_its_budget() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nobody ever reads
        address = f"127.0.0.1:{silent.getsockname()[1]}"

        async def main() -> float:
            settings = ClientSettings(retry_budget_s=2.0)
            async with AsyncClient(address, settings=settings) as client:
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    await client.publish_batch("s", [b"x"], partition=0)
                return time.monotonic() - started

        took = asyncio.run(main())
    assert took < 8, f"gave up after {took:.1f} s"


def test_a_stream_unknown_at_its_lookup_is_looked_up_again() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        router = LeaderRouter("127.0.0.1:1", channel, ClientSettings())
        unknown = pb.StreamMetadata(name="later", error=pb.StreamMetadata.Error.UNKNOWN_STREAM)
        router.learn(
            pb.FetchMetadataResponse(streamMetadata=[unknown, pb.StreamMetadata(name="s")])
        )
        asked: list[str] = []

        async def refresh(stream: str) -> None:
            asked.append(stream)

        router.refresh = refresh  # type: ignore[method-assign]
        await router.ensure("s")
        await router.ensure("later")
        assert asked == ["later"], "a stream created after the lookup is asked about again"
        await channel.close()

    asyncio.run(main())
