#!/usr/bin/env python3
"""Catch-up and publish of two source trees side by side, with redis-py XRANGE in the same run.

What it measures: for each of ``--rounds`` rounds, a fresh ``tidelog serve`` per source tree
(the trees alternate which goes first), ``publish_batch`` of N messages of S bytes, then a
tidelog.v1 catch-up of them as columns (``subscribe_batch``) and with every message built
(``subscribe_batch_decoded``): the phases of ``e2e_throughput.py``, by its own functions. Then
Redis Streams' XRANGE over the same payloads (``peers.measure_redis``, the same baseline
``e2e_throughput.py`` uses). Each phase reports its wall rate, the server's CPU per message
(``/proc/PID/stat`` user + system around the phase) and this process's (the client's,
``getrusage``), with the 1-minute load average, because wall rates on a shared machine say more
about the neighbours than about the code.

A tree is a checkout whose ``src`` goes first on the server's ``PYTHONPATH`` (the client is
this checkout's: to compare clients too, run this script from each checkout in turn with
``--trees .``). Prints one JSON object per phase row, then a summary of medians.

    python benchmarks/catchup_trees.py --trees /tmp/base,. [--messages 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import e2e_throughput as e2e  # the benchmark's own phases (benchmarks/ is on sys.path)
import peers
from tidelog.client import AsyncClient

STREAM = "catchup"


def client_cpu_seconds() -> float:
    """This process's CPU seconds (user + system, all threads: grpc's poller too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


async def one_tree(tree: str, payloads: list[bytes], timeout: float) -> dict[str, Any]:
    """Publish, then the two catch-ups, on a fresh server running ``tree``'s code."""
    os.environ["PYTHONPATH"] = str(Path(tree).resolve() / "src")
    n = len(payloads)
    row: dict[str, Any] = {"tree": tree}
    with e2e.TidelogServer("interval") as server:
        async with AsyncClient(server.address) as client:
            await client.create_stream(STREAM)
            before = server.cpu_seconds() or 0.0
            start = time.perf_counter()
            await e2e.publish_batch_phase(client, STREAM, payloads, timeout)
            row["publish_msgs_per_s"] = round(n / (time.perf_counter() - start))
            row["publish_server_us_per_msg"] = round(
                ((server.cpu_seconds() or 0.0) - before) / n * 1e6, 3
            )
            for name, columns in (("catchup", True), ("catchup_decoded", False)):
                row[f"{name}_load"] = load()
                before = server.cpu_seconds() or 0.0
                mine = client_cpu_seconds()
                r = await e2e.subscribe_phase(
                    client, STREAM, payloads, n, timeout, reverse=False, columns=columns
                )
                row[f"{name}_msgs_per_s"] = round(r["count"] / r["seconds"])
                row[f"{name}_server_us_per_msg"] = round(
                    ((server.cpu_seconds() or 0.0) - before) / n * 1e6, 3
                )
                row[f"{name}_client_us_per_msg"] = round((client_cpu_seconds() - mine) / n * 1e6, 3)
        server.stop()
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = [t for t in args.trees.split(",") if t]
    payloads = peers.make_payloads(args.messages, args.size)
    gc.collect()
    gc.freeze()  # as e2e_throughput.py does: no phase pays for scanning the fixture
    rows: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = trees if number % 2 == 0 else trees[::-1]
        for tree in order:
            row = {"round": number, **await one_tree(tree, payloads, args.timeout)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        redis = peers.measure_redis(payloads, c_client=False)
        row = {"round": number, "tree": "redis", "load": load()}
        row["xrange_msgs_per_s"] = round(redis["read_msgs_per_s"])
        print(json.dumps(row), flush=True)
        rows.append(row)
    summary: dict[str, Any] = {}
    xrange = statistics.median(r["xrange_msgs_per_s"] for r in rows if r["tree"] == "redis")
    for tree in trees:
        mine = [r for r in rows if r["tree"] == tree]
        medians = {
            key: round(statistics.median(r[key] for r in mine), 3)
            for key in mine[0]
            if key.endswith(("_per_s", "_per_msg"))
        }
        ratios = [
            r["catchup_msgs_per_s"] / x["xrange_msgs_per_s"]
            for r in mine
            for x in rows
            if x["tree"] == "redis" and x["round"] == r["round"]
        ]
        medians["catchup_vs_xrange_same_round"] = round(statistics.median(ratios), 2)
        summary[tree] = medians
    summary["xrange_msgs_per_s"] = xrange
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="comma-separated source trees")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    args = parser.parse_args()
    print(json.dumps({"summary": asyncio.run(run(args))}, indent=1))


if __name__ == "__main__":
    main()
