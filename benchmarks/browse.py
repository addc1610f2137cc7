#!/usr/bin/env python3
"""Newest-first across partitions on the server (``tidelog.v1/Browse``) against the client-side way.

Two streams of 8 partitions, ``small`` (10,000 messages) and ``large`` (10,000,000 by default,
``--large N``), each message a 100-byte value with a key ``user-<i % 100000>``, spread evenly.
They are filled **in-process, straight into the commit logs** (a server creates the streams and
stops; ``SegmentedLog.append`` then writes batches of 10,000 into each partition directory, a
fraction of the time the gRPC publish path would take), then a **fresh ``tidelog serve``** opens
the data (nothing cached in its memory) and everything is timed through the client over gRPC:

- ``newest50_small_ms`` / ``newest50_large_ms``: ``client.browse(stream, limit=50)``, the median
  of ``--runs`` calls (the first call, cold, is reported apart);
- ``forward_baseline_ms``: what a console must do without a reverse read: read every partition
  forward from the start (8 concurrent ``subscribe_batches``, their columns as numpy arrays),
  keep each partition's last 50, merge them by timestamp, take the newest 50 (one run: it is
  long);
- ``search_msgs_per_s``: a key search over the newest 1,000,000 messages of ``large``
  (``browse(key=..., max_scan=1_000_000)``; the key matches 10 messages of every 1,000,000, so
  the scan runs to its budget), messages scanned on the server per second of the call;
- ``tail_idle_cpu_percent``: a fresh server (its console on) with a live tail open on the
  messages page of a stream, then a ``publish_batch`` of 1,000 (one timestamp for all): the
  server's CPU (user + system, ``/proc``) over the next 10 s, in percent of one core, while the
  tail has nothing new (``tail_events`` counts the events it sent: about one per 0.5 s poll).

Prints one JSON object with these keys, the ratios and the sizes run.

    python benchmarks/browse.py [--large 10000000] [--runs 20] [--keep-data DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import http.client
import json
import os
import platform
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tidelog.client import AsyncClient, Client
from tidelog.log import LogConfig, NewRecord, SegmentedLog
from tidelog.process import ServerProcess

PARTITIONS = 8
KEYS = 100_000
VALUE = b"v" * 100
BATCH = 10_000
SEARCH_SCAN = 1_000_000
SEARCHED_KEY = b"user-77"


def start_server(data: Path) -> ServerProcess:
    return ServerProcess(data, "--log-level", "WARNING").start(timeout=600)


def fill(data: Path, sizes: dict[str, int]) -> float:
    """Create the streams through a server, then append straight into their logs; seconds."""
    server = start_server(data)
    try:
        with Client(server.address) as client:
            for name in sizes:
                client.create_stream(name, partitions=PARTITIONS)
    finally:
        server.stop()
    started = time.perf_counter()
    for name, total in sizes.items():
        logs = [
            SegmentedLog(data / "streams" / name / str(p), LogConfig()) for p in range(PARTITIONS)
        ]
        try:
            written = 0
            while written < total:
                many = min(BATCH * PARTITIONS, total - written)
                for p, log in enumerate(logs):
                    records = [
                        NewRecord(VALUE, key=b"user-%d" % ((written + i) % KEYS))
                        for i in range(p, many, PARTITIONS)
                    ]
                    if records:
                        log.append(records)
                written += many
        finally:
            for log in logs:
                log.close()
    return time.perf_counter() - started


def newest50_ms(client: Client, stream: str, runs: int) -> tuple[float, float]:
    """(cold first call, median of ``runs`` more) in ms."""
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        page = client.browse(stream, limit=50)
        times.append((time.perf_counter() - started) * 1000)
        assert len(page.messages) == 50
    return times[0], statistics.median(times[1:])


async def forward_newest50(address: str, stream: str) -> list[tuple[int, int, int]]:
    """The client-side way: every partition forward from the start, the last 50 kept."""

    async def last50(client: AsyncClient, partition: int) -> list[tuple[int, int, int]]:
        tail: list[tuple[int, int, int]] = []
        async for batch in client.subscribe_batches(
            stream, partition, start="earliest", stop="latest"
        ):
            offsets = batch.offsets[-50:].tolist()
            stamps = batch.timestamps[-50:].tolist()
            tail = (tail + [(t, partition, o) for t, o in zip(stamps, offsets, strict=True)])[-50:]
        return tail

    async with AsyncClient(address) as client:
        tails = await asyncio.gather(*(last50(client, p) for p in range(PARTITIONS)))
    return heapq.nlargest(50, (key for tail in tails for key in tail))


def search(client: Client, stream: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    page = client.browse(
        stream, key=SEARCHED_KEY, limit=50, max_scan=SEARCH_SCAN, max_scan_seconds=60
    )
    seconds = time.perf_counter() - started
    return seconds, page.scanned, len(page.messages)


TAIL_IDLE_S = 10.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tail_idle_cpu(root: Path) -> tuple[float, int]:
    """(server CPU % of one core over TAIL_IDLE_S with a tail open after a batch of 1,000,
    events the tail sent in that time)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = int(probe.getsockname()[1])
    server = ServerProcess(
        root / "tail-data", "--log-level", "WARNING", "--metrics-port", str(http_port)
    ).start()
    events = 0
    stop = threading.Event()
    try:
        with Client(server.address) as client:
            client.create_stream("tailed", partitions=3)
            client.publish("tailed", b"first", partition=0)
            top = client.browse("tailed", limit=1).messages[0]
            connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            where = f"{top.timestamp}:{top.partition}:{top.offset}"
            connection.request(
                "GET",
                f"/streams/tailed/tail?after={where}",
                headers={"Host": f"127.0.0.1:{http_port}"},
            )
            response = connection.getresponse()
            assert response.status == 200, response.read()[:300]

            def read() -> None:
                nonlocal events
                while not stop.is_set():
                    try:
                        line = response.readline()
                    except (OSError, ValueError, AttributeError):  # closed under it: the end
                        return
                    if not line:
                        return
                    if line.startswith((b"id:", b": idle")):
                        events += 1

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            client.publish_batch("tailed", [b"m%d" % i for i in range(1000)], partition=1)
            time.sleep(1.0)  # the tail reads the batch
            events = 0
            before = cpu_seconds(server.pid)
            time.sleep(TAIL_IDLE_S)
            used = cpu_seconds(server.pid) - before
            counted = events
            stop.set()
            connection.close()
    finally:
        server.stop()
    return used / TAIL_IDLE_S * 100, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--large", type=int, default=10_000_000, help="messages in the large stream"
    )
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--keep-data", type=Path, help="fill this directory (or reuse it) and keep it"
    )
    args = parser.parse_args()

    root = args.keep_data or Path(tempfile.mkdtemp(prefix="tidelog-browse-bench-"))
    data = root / "data"
    sizes = {"small": args.small, "large": args.large}
    fill_s = None
    if not (data / "streams" / "large").exists():
        fill_s = fill(data, sizes)
    server = start_server(data)
    try:
        with Client(server.address) as client:
            small_cold, small = newest50_ms(client, "small", args.runs)
            large_cold, large = newest50_ms(client, "large", args.runs)
            ours = [
                (m.timestamp, m.partition, m.offset)
                for m in client.browse("large", limit=50).messages
            ]
            started = time.perf_counter()
            theirs = asyncio.run(forward_newest50(server.address, "large"))
            forward_ms = (time.perf_counter() - started) * 1000
            assert theirs == ours, "the client-side newest 50 differs from Browse's"
            search_s, scanned, found = search(client, "large")
    finally:
        server.stop()
    try:
        tail_cpu, tail_events = tail_idle_cpu(root)
    finally:
        if args.keep_data is None:
            shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "newest50_small_ms": round(small, 3),
        "newest50_large_ms": round(large, 3),
        "forward_baseline_ms": round(forward_ms, 1),
        "search_msgs_per_s": round(scanned / search_s),
        "tail_idle_cpu_percent": round(tail_cpu, 1),
        "large_vs_small": round(large / small, 2),
        "forward_vs_newest50": round(forward_ms / large, 1),
        "newest50_small_cold_ms": round(small_cold, 3),
        "newest50_large_cold_ms": round(large_cold, 3),
        "search_scanned": scanned,
        "search_found": found,
        "search_s": round(search_s, 3),
        "tail_events": tail_events,
        "sizes": sizes,
        "partitions": PARTITIONS,
        "fill": "in-process SegmentedLog.append, batches of 10,000 per partition",
        "fill_s": None if fill_s is None else round(fill_s, 1),
        "targets": {
            "large_vs_small": "<= 2",
            "forward_vs_newest50": ">= 100",
            "search_msgs_per_s": ">= 1000000",
            "tail_idle_cpu_percent": "<= 5",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load": os.getloadavg(),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
