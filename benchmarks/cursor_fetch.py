#!/usr/bin/env python3
"""FetchCursor latency against the number of cursor updates a cursor partition holds.

For each size N (default 1,000 / 10,000 / 100,000 / 1,000,000) the benchmark writes N cursor
updates into the ``__cursors`` partition of a fresh data directory (directly with the commit
log: 1,000 cursors updated round-robin, the first of them written only once, at the very start),
starts ``tidelog serve`` on it once so the server builds and snapshots its cursor index, then
starts a **fresh server process** on the same data (cold: nothing cached in memory) and times
``proto.API/FetchCursor`` over gRPC for a present cursor (the one written first) and an absent
one. Beside it, on the same data in the same run, it times the scan-from-the-beginning
algorithm of Liftbridge's first cursor design (read the partition forward, keep the last value
seen for the key). Prints one JSON object; ``--plot FILE`` also draws latency against updates.

    python benchmarks/cursor_fetch.py [--sizes 1000,10000,100000,1000000] [--fetches 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.broker.cursor_index import VALUE
from tidelog.log import LogConfig, NewRecord, SegmentedLog
from tidelog.process import ServerProcess

CURSORS = 1000
STREAM = "orders"
PRESENT = "consumer-0"
ABSENT = "nobody"


def key_of(cursor: str) -> bytes:
    return f"{cursor},{STREAM},0".encode()


def start_server(data: Path) -> ServerProcess:
    return ServerProcess(data, "--log-level", "WARNING").start(timeout=600)


def write_updates(data: Path, updates: int) -> int:
    """N cursor records in __cursors partition 0; returns the present cursor's value (0: it is
    written once, first, with the record's position as its value)."""
    start_server(data).stop()  # creates the stream layout and __cursors
    log = SegmentedLog(data / "streams" / "__cursors" / "0", LogConfig())
    try:
        batch: list[bytes | NewRecord] = []
        for i in range(updates):
            # consumer-0 is written once, first; the others take turns after it.
            cursor = "consumer-0" if i == 0 else f"consumer-{1 + (i - 1) % (CURSORS - 1)}"
            batch.append(NewRecord(VALUE.pack(i), key=key_of(cursor)))
            if len(batch) == 10_000:
                log.append(batch)
                batch = []
        if batch:
            log.append(batch)
    finally:
        log.close()
    return 0


def fetch_p50_ms(address: str, cursor: str, fetches: int, expected: int) -> float:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.APIStub(channel)
        request = pb.FetchCursorRequest(stream=STREAM, partition=0, cursorId=cursor)
        times = []
        for _ in range(fetches):
            start = time.perf_counter()
            offset = stub.FetchCursor(request, timeout=60).offset
            times.append(time.perf_counter() - start)
            if offset != expected:
                raise RuntimeError(f"FetchCursor({cursor}) = {offset}, expected {expected}")
    return statistics.median(times) * 1000


def forward_scan_ms(data: Path, cursor: str, expected: int) -> float:
    """Liftbridge's first design: read the partition from the beginning, keep the last value."""
    log = SegmentedLog(data / "streams" / "__cursors" / "0", LogConfig())
    try:
        key = key_of(cursor)
        start = time.perf_counter()
        found = -1
        for batch in log.forward_reader(0):
            for k, v in zip(batch.keys(), batch.values(), strict=True):
                if k == key:
                    found = VALUE.unpack(v)[0]
        elapsed = time.perf_counter() - start
    finally:
        log.close()
    if found != expected:
        raise RuntimeError(f"forward scan found {found}, expected {expected}")
    return elapsed * 1000


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    axes.plot(result["updates"], result["present_p50_ms"], "o-", label="tidelog, present cursor")
    axes.plot(result["updates"], result["absent_p50_ms"], "s--", label="tidelog, absent cursor")
    axes.plot(
        result["updates"],
        result["forward_scan_ms"],
        "^-",
        label="scan from the beginning (in process, no RPC)",
    )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("cursor updates in the partition")
    axes.set_ylabel("FetchCursor latency, ms (p50)")
    axes.set_title("FetchCursor on a fresh server process")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description="FetchCursor latency vs cursor updates")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--fetches", type=int, default=200, help="calls per measurement")
    parser.add_argument("--plot", type=Path, help="also write a PNG plot here (needs matplotlib)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    result: dict[str, Any] = {
        "benchmark": "cursor_fetch",
        "updates": sizes,
        "present_p50_ms": [],
        "absent_p50_ms": [],
        "forward_scan_ms": [],
        "cold_start_s": [],
        "first_start_s": [],
    }
    root = Path(tempfile.mkdtemp(prefix="tidelog-cursor-bench-"))
    try:
        for n in sizes:
            data = root / str(n)
            present_value = write_updates(data, n)
            first = start_server(data)  # replays the partition once, snapshots the index on stop
            first.stop()
            cold = start_server(data)
            try:
                result["present_p50_ms"].append(
                    round(fetch_p50_ms(cold.address, PRESENT, args.fetches, present_value), 4)
                )
                result["absent_p50_ms"].append(
                    round(fetch_p50_ms(cold.address, ABSENT, args.fetches, -1), 4)
                )
            finally:
                cold.stop()
            result["cold_start_s"].append(round(cold.startup_s, 3))
            result["first_start_s"].append(round(first.startup_s, 3))
            result["forward_scan_ms"].append(
                round(forward_scan_ms(data, PRESENT, present_value), 2)
            )
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result["ratios"] = {
        "present_p50_largest_vs_smallest": round(
            result["present_p50_ms"][-1] / result["present_p50_ms"][0], 3
        ),
        "forward_scan_vs_present_at_largest": round(
            result["forward_scan_ms"][-1] / result["present_p50_ms"][-1], 1
        ),
    }
    result["environment"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    if args.plot:
        plot(args.plot, result)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
