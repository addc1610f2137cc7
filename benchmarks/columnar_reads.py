#!/usr/bin/env python3
"""Reads as columns (issue 27): a catch-up consumed three ways, and the broker's per-record CRC
check at the sizes a read makes.

``catchup``: the benchmark starts its own ``tidelog serve`` on a free 127.0.0.1 port with a
fresh temporary data directory (stopped by PID and removed at the end, also on failure),
publishes ``--messages`` random 100-byte values to one partition, then reads them all from
EARLIEST to STOP_LATEST with ``AsyncClient.subscribe_batches``, consumed as

- ``decode``: every message built (``tidelog.client.codec.decode``, as before issue 27), its
  value's length summed;
- ``columns``: ``batch.values.sizes.sum()`` (no object per message);
- ``arrow``: ``batch.to_arrow(("offset", "value"))``;

each twice, the second kept: msgs/s, and the CPU seconds of the server and of this client.
On code from before issue 27 (batches were raw frames) ``columns`` and ``arrow`` are skipped and
``frames`` (counting the raw frames' offsets) is measured instead.

``verify``: ``tidelog.log.record.verify_records`` over encoded batches of the sizes a read makes
(a 256 KiB subscription frame of 100-byte values: 1,927 records; a 1 MiB read: 7,700; 5,000
records of 20 bytes; 260 of 1,000 bytes; 10 of 100 bytes), µs per record, best of 7.

Prints one JSON object with the load average before and after each part.

    python benchmarks/columnar_reads.py [--messages 1000000] [--only catchup,verify]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

VERIFY_SHAPES = ((1927, 100), (7700, 100), (5000, 20), (260, 1000), (10, 100))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def catchup(messages: int) -> dict[str, Any]:
    import tidelog.client
    from tidelog.client import AsyncClient
    from tidelog.client.codec import decode
    from tidelog.process import ServerProcess

    columnar = hasattr(tidelog.client, "ReceivedBatch")  # issue 27 on
    modes = ["decode", "columns", "arrow"] if columnar else ["decode", "frames"]
    work = Path(tempfile.mkdtemp(prefix="tidelog-columnar-reads-"))
    server = ServerProcess(work / "data")
    out: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    try:
        server.start()
        values = [os.urandom(100) for _ in range(10_000)]
        async with AsyncClient(server.address) as client:
            await client.create_stream("s")
            async with client.publisher("s", 0) as publisher:
                pending: list[Any] = []
                for first in range(0, messages, 5000):
                    chunk = [values[(first + i) % len(values)] for i in range(5000)]
                    pending.append(await publisher.send(chunk[: messages - first]))
                    if len(pending) > 8:
                        await pending.pop(0)
                for future in pending:
                    await future
            for mode in modes * 2:  # each twice, the second kept
                server_cpu = cpu_seconds(server.pid)
                client_cpu = time.process_time()
                started = time.perf_counter()
                count = 0
                async for batch in client.subscribe_batches(
                    "s", 0, start="earliest", stop="latest"
                ):
                    if mode == "decode":
                        decoded = decode(batch, "s", 0)
                        sum(len(m.value) for m in decoded)
                        count += len(decoded)
                    elif mode == "columns":
                        int(batch.values.sizes.sum())
                        count += len(batch)
                    elif mode == "arrow":
                        count += batch.to_arrow(("offset", "value")).num_rows
                    else:
                        count += len(batch.offsets) // 8
                seconds = time.perf_counter() - started
                if count != messages:
                    raise RuntimeError(f"{mode}: {count} messages, not {messages}")
                out[mode] = {
                    "msgs_per_s": round(messages / seconds),
                    "server_cpu_us_per_msg": round(
                        (cpu_seconds(server.pid) - server_cpu) / messages * 1e6, 3
                    ),
                    "client_cpu_us_per_msg": round(
                        (time.process_time() - client_cpu) / messages * 1e6, 3
                    ),
                }
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["load_average_after"] = os.getloadavg()[0]
    return out


def verify() -> dict[str, Any]:
    from tidelog.log.record import encode_batch, verify_records

    out: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    rng = np.random.default_rng(1)
    for count, size in VERIFY_SHAPES:
        values = [rng.bytes(size) for _ in range(count)]
        batch = encode_batch(values, np.arange(count, dtype=np.int64), 123, 1 << 20)
        data = batch.data.tobytes()
        positions = np.cumsum(batch.sizes) - batch.sizes
        stamps = np.full(count, 123, dtype=np.int64)
        repeats = max(1, 20_000 // count)
        best = float("inf")
        for _ in range(7):
            started = time.perf_counter()
            for _ in range(repeats):
                verify_records(data, positions, batch.sizes, batch.offsets, stamps, "s", 0)
            best = min(best, (time.perf_counter() - started) / repeats / count)
        out[f"{count}x{size}B_us_per_record"] = round(best * 1e6, 3)
    out["load_average_after"] = os.getloadavg()[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--only", default="catchup,verify")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    result: dict[str, Any] = {}
    if "verify" in parts:
        result["verify"] = verify()
    if "catchup" in parts:
        result["catchup"] = asyncio.run(catchup(args.messages))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
