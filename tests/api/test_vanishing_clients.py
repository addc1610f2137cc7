"""Clients that vanish mid-stream leave nothing behind on the server (DESIGN.md, "Faults").

Rounds of client processes each open a Subscribe from EARLIEST and a PublishAsync that keeps
sending, read neither, and are killed with SIGKILL while both calls are busy. The server runs in
this process, so the test can count what it keeps: once the calls are gone, the event loop's
tasks and the partition's subscriber count return to where they were before the first client,
and the process's RSS grows by a bounded amount. Loops are bounded in count and time; the RSS
bound is generous (a guard against a per-client leak, not a measurement).
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.api.server import Server
from tidelog.api.settings import ServerSettings
from tidelog.client import AsyncClient

ROUNDS = 4
CLIENTS = 6
GUARD_S = 60.0
SETTLE_S = 10.0
REPO = Path(__file__).resolve().parents[2]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), GUARD_S)
    assert line.startswith("ready"), f"client did not start: {line!r}"


async def settle(condition: object, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"still not released after {SETTLE_S} s: {what()}")  # type: ignore[operator]
        gc.collect()
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_killed_clients_leave_no_tasks_subscriptions_or_memory(tmp_path: Path) -> None:
    async def scenario() -> None:
        settings = ServerSettings(data_dir=tmp_path / "data", port=0, metrics_port=0)
        server = Server(settings)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            async with AsyncClient(address) as client:
                await client.create_stream("churn")
                await client.publish_batch("churn", [b"x" * 1000] * 2000, partition=0)
                await client.list_streams()
            partition = server.broker.partition("churn", 0)
            gc.collect()
            await asyncio.sleep(0.5)
            baseline_tasks = len(asyncio.all_tasks())
            baseline_rss = rss_mb()
            for _ in range(ROUNDS):
                clients = [
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.api.vanishing_client", address, "churn"],
                        cwd=REPO,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for _ in range(CLIENTS)
                ]
                try:
                    await asyncio.gather(*(wait_ready(c) for c in clients))
                    await asyncio.sleep(2.0)  # both calls busy: unread acks, a full publish queue
                    assert partition.subscribers == CLIENTS
                finally:
                    for c in clients:
                        c.kill()
                        c.wait(10)

                def tasks() -> int:
                    return len(asyncio.all_tasks())

                await settle(lambda: partition.subscribers == 0, lambda: partition.subscribers)
                await settle(
                    lambda: tasks() <= baseline_tasks,
                    lambda: [t.get_coro() for t in asyncio.all_tasks()][:5],
                )
            grown = rss_mb() - baseline_rss
            assert grown < 150, f"RSS grew {grown:.0f} MB over {ROUNDS * CLIENTS} killed clients"
            assert pb.Message  # the proto module stays imported for the client helper
        finally:
            await server.stop()

    asyncio.run(scenario())
