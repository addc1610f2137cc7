#!/usr/bin/env python3
"""What an idle cluster costs: three brokers and etcd on loopback, first with no stream of
their own, then with one stream of ``--partitions`` partitions, three replicas each, and nothing
published. Nothing is copied either time; what the brokers spend is their metadata reads and
their followers' fetches waiting at each leader's log end.

- ``idle_cores_empty``: CPU seconds per second of the three brokers together, no stream;
- ``idle_cores``: the same with the stream (``--partitions`` of RF 3);
- ``cpu_us_per_partition_per_s``: the difference, per partition (all replicas included);
- ``create_s``: how long ``CreateStream`` took (placing, writing to etcd, every replica open).

Prints one JSON object with those keys and the load average before and after. The brokers'
CPU is read from ``/proc/<pid>/stat`` (Linux).

    python benchmarks/cluster_idle.py [--partitions 300] [--seconds 10] [--settle 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tidelog.client import Client
from tidelog.process import ServerProcess, running_etcd

TICKS = os.sysconf("SC_CLK_TCK")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def cores(pids: list[int], seconds: float) -> float:
    before = cpu_s(pids)
    time.sleep(seconds)
    return (cpu_s(pids) - before) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidelog-cluster-idle-"))
    result: dict[str, Any] = {"load_before": loadavg()}
    try:
        with ExitStack() as stack:
            url = stack.enter_context(running_etcd(root / "etcd"))
            servers = []
            for n in (1, 2, 3):
                server = ServerProcess(
                    root / f"b{n}", "--cluster", url, "--broker-id", f"b{n}"
                ).start()
                stack.callback(server.kill)
                servers.append(server)
            pids = [server.pid for server in servers]
            time.sleep(args.settle)
            empty = cores(pids, args.seconds)
            started = time.perf_counter()
            with Client(servers[0].address) as client:
                client.create_stream(
                    "idle", partitions=args.partitions, replication_factor=3, min_isr=2
                )
            result["create_s"] = round(time.perf_counter() - started, 2)
            time.sleep(args.settle)
            busy = cores(pids, args.seconds)
            result["idle_cores_empty"] = round(empty, 3)
            result["idle_cores"] = round(busy, 3)
            result["cpu_us_per_partition_per_s"] = round((busy - empty) / args.partitions * 1e6)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = loadavg()
    result["settings"] = vars(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
