"""Idle subscribers cost the server a bounded amount each (the per-subscription byte budget).

100 raw ``proto.API/Subscribe`` calls from EARLIEST on a stream holding 4 MB, from one client
process that reads each handshake and nothing after it. Once they are open and a publish has
gone through, the server's RSS has grown by far less than the 100 x 1 MiB a batch used to hold
(each budget is 256 KiB by default); the bound is generous, a guard, not a measurement. Speed
with idle subscribers is ``benchmarks/isolation.py``'s business.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.support.server import ServerProcess

from tidelog import Client

SUBSCRIBERS = 100
ISOLATION = Path(__file__).resolve().parents[2] / "benchmarks" / "isolation.py"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_idle_subscribers_hold_a_bounded_amount(server: ServerProcess) -> None:
    with Client(server.address) as client:
        client.create_stream("idle")
        for _ in range(4):
            client.publish_batch("idle", [b"i" * 1000] * 1000, partition=0)
        before = rss_mb(server.pid)
        holder = subprocess.Popen(
            [
                sys.executable,
                str(ISOLATION),
                "--hold-idle",
                server.address,
                "idle",
                f"{SUBSCRIBERS}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            ready: list[str] = []
            reader = threading.Thread(target=lambda: ready.append(holder.stdout.readline()))  # type: ignore[union-attr]
            reader.start()
            reader.join(60)
            assert ready and ready[0].startswith("ready"), "idle subscribers did not open"
            acks = client.publish_batch("idle", [b"n" * 1000] * 1000, partition=0)
            assert acks[-1].offset == 4999  # publishing goes on beside them
            time.sleep(1.0)
            grown = rss_mb(server.pid) - before
        finally:
            holder.kill()
            holder.wait(10)
    assert grown < 80, f"{SUBSCRIBERS} idle subscribers grew the server by {grown:.0f} MB"
