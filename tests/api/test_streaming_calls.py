"""The servicers' streaming loops, driven in process: what a call leaves behind when its client
stops reading or goes away, and how much a subscription holds.

A call whose client vanished is closed by gRPC as an abandoned async generator (``aclose`` at the
``yield`` it stood at); these tests close it the same way. Loops are bounded in count and time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.broker.brokertools import broker_config

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.api.liftbridge import LiftbridgeService
from tidelog.broker import Broker
from tidelog.control import Advertised, SingleBroker

GUARD_S = 10.0


class Context:
    """The little of ``grpc.aio.ServicerContext`` the servicers use on their happy paths."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def peer(self) -> str:  # the connection publishes are counted against (api/inflight.py)
        return "ipv4:127.0.0.1:1"


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def until(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + GUARD_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


def test_an_abandoned_publish_async_with_a_full_queue_leaves_no_task(tmp_path: Path) -> None:
    """The client stopped reading acks (the servicer stands at a ``yield``), its requests kept
    coming until the call's queue was full, then it vanished."""

    async def scenario() -> None:
        broker = Broker(broker_config(tmp_path))
        await broker.start()
        try:
            broker.create_stream("p")
            service = LiftbridgeService(SingleBroker(broker, Advertised("b", "127.0.0.1", 1)))
            sent = 0

            async def requests() -> AsyncIterator[pb.PublishRequest]:
                nonlocal sent
                for n in range(100_000):
                    sent += 1
                    yield pb.PublishRequest(stream="p", value=b"v", correlationId=str(n))

            before = other_tasks()
            call = service.PublishAsync(requests(), Context())  # type: ignore[arg-type]
            assert (await anext(call)).ack.offset == 0
            last = -1
            while sent != last:  # until the queue is full and the pump waits on it
                last = sent
                await asyncio.sleep(0.05)
            assert sent < 100_000, "the call buffered every request: its queue is unbounded"
            await call.aclose()
            await until(lambda: other_tasks() <= before, "the call's request pump still runs")
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), 4 * GUARD_S))
