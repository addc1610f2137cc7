#!/usr/bin/env python3
"""What ``proto.API/Subscribe`` spends laying out a batch, per message: the per-message path
(``liftbridge._messages`` building one ``pb.Message`` each, then ``SerializeToString`` as grpcio
does for each write) against ``liftbridge_frames.framed_messages`` (the whole batch framed at
once, in blocks of at most 256 KiB), on the same batches, interleaved A, B, A, B ...

Batches are encoded as the log stores them (``tidelog.log.record.encode_batch``) with
consecutive offsets from 1,000,000 and nanosecond timestamps of today; the cases:

- ``uniform``: ``--batch`` values of 100 bytes, no keys, no headers (a catch-up);
- ``keys``: the same with a 16-byte key on every message;
- ``sizes``: values of 50 to 150 bytes at random (the gathered layout);
- ``headers``: ``uniform`` with one header on 1 % of the messages.

Each case runs ``--rounds`` rounds of both paths over ``--batches`` batches; the least wall
time and the least process CPU time of each over the rounds are kept (µs per message). Prints
one JSON object with the load average before and after.

    python benchmarks/liftbridge_frames.py [--batch 2000] [--batches 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tidelog.api.liftbridge import _messages
from tidelog.api.liftbridge_frames import framed_messages
from tidelog.log import MessageBatch, NewRecord
from tidelog.log.record import encode_batch, gather_headers

STREAM = "bench-stream"
NOW_NS = 1_764_000_000_000_000_000


def batch_of(records: list[NewRecord], first: int) -> MessageBatch:
    n = len(records)
    encoded = encode_batch(records, np.arange(first, first + n, dtype=np.int64), NOW_NS, 1 << 20)
    data = encoded.data.tobytes()
    positions = np.cumsum(encoded.sizes) - encoded.sizes
    header = gather_headers(data, positions).copy()
    header["timestamp"] = NOW_NS + np.arange(n, dtype=np.int64) * 1000
    return MessageBatch(data, positions, encoded.sizes, header)


def records_for(case: str, n: int, rng: np.random.Generator) -> list[NewRecord]:
    sizes = rng.integers(50, 151, n) if case == "sizes" else np.full(n, 100)
    out = []
    for i, size in enumerate(sizes.tolist()):
        value = rng.bytes(size)
        key = rng.bytes(16) if case == "keys" else None
        headers = {"trace": rng.bytes(8)} if case == "headers" and i % 100 == 7 else {}
        out.append(NewRecord(value, key, headers))
    return out


def per_message(batch: MessageBatch) -> int:
    total = 0
    for message in _messages(batch, STREAM, 0, STREAM):
        total += len(message.SerializeToString())
    return total


def framed(batch: MessageBatch) -> int:
    return sum(len(block.data) for block in framed_messages(batch, STREAM, 0, STREAM))


def timed(path: Callable[[MessageBatch], int], batches: list[MessageBatch]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        path(batch)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(27)
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    for case in ("uniform", "keys", "sizes", "headers"):
        batches = [
            batch_of(records_for(case, args.batch, rng), 1_000_000 + i * args.batch)
            for i in range(args.batches)
        ]
        messages = args.batch * args.batches
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for name, path in (("per_message", per_message), ("framed", framed)):
                wall, cpu = timed(path, batches)
                if name in best:  # the least of each over the rounds
                    wall, cpu = min(wall, best[name][0]), min(cpu, best[name][1])
                best[name] = (wall, cpu)
        row = {
            name: {"us_per_msg": round(w / messages * 1e6, 3), "cpu_us_per_msg": c / messages}
            for name, (w, c) in best.items()
        }
        for stats in row.values():
            stats["cpu_us_per_msg"] = round(stats["cpu_us_per_msg"] * 1e6, 3)
        row["speedup_wall"] = round(best["per_message"][0] / best["framed"][0], 1)
        row["speedup_cpu"] = round(best["per_message"][1] / best["framed"][1], 1)
        result[case] = row
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
