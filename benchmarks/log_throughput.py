#!/usr/bin/env python3
"""Commit-log throughput: append, forward read, reverse read, and "the newest 100" latency.

Appends N messages of S bytes in batches to a fresh ``SegmentedLog`` (default config: 256 MiB
segments, interval flush), reads them all forward and in reverse (CRC-verified, every value
materialised as ``bytes``), and times reading the newest 100 messages of that log and of a small
one. In the same run the same payloads go to a plain buffered file as the baseline: once with one
``write`` per message (``raw_write``), once with one ``write`` per batch (``raw_batch_write``).

Writes are timed until the bytes are durable (the log's ``flush()`` / the file's ``fsync`` at the
end, on both sides); the ``page_cache`` block gives the same runs timed before that sync. The
machine is noisy, so the write side runs ``--rounds`` interleaved rounds (raw, raw batch, log) and
reports medians with the min-max spread, and the CPU time per message of each write phase
(user + system, this process: less sensitive to other processes than the wall rates) with the
load average at the end. Prints one JSON object.

    python benchmarks/log_throughput.py [--messages 1000000] [--size 100] [--batch 1000]
                                        [--rounds 3] [--small 10000] [--dir DIR]
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

from tidelog.log import SegmentedLog

Timing = tuple[float, float, float]
"""Seconds until written to the OS, seconds until synced, CPU seconds of this process (user +
system) over the same span."""


def make_batches(batch: int, size: int, distinct: int = 8) -> list[list[bytes]]:
    """A few batches of distinct random payloads, reused round-robin."""
    blob = os.urandom(distinct * batch * size)
    return [
        [blob[(b * batch + i) * size : (b * batch + i + 1) * size] for i in range(batch)]
        for b in range(distinct)
    ]


def raw_write(path: Path, batches: list[list[bytes]], rounds: int, per_message: bool) -> Timing:
    cpu = time.process_time()
    start = time.perf_counter()
    with open(path, "wb") as f:
        for r in range(rounds):
            values = batches[r % len(batches)]
            if per_message:
                for value in values:
                    f.write(value)
            else:
                f.write(b"".join(values))
        f.flush()
        written = time.perf_counter() - start
        os.fsync(f.fileno())
    return written, time.perf_counter() - start, time.process_time() - cpu


def log_append(log: SegmentedLog, batches: list[list[bytes]], rounds: int) -> Timing:
    cpu = time.process_time()
    start = time.perf_counter()
    for r in range(rounds):
        log.append(batches[r % len(batches)])
    written = time.perf_counter() - start
    log.flush()
    return written, time.perf_counter() - start, time.process_time() - cpu


def timed_forward(log: SegmentedLog) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    for batch in log.forward_reader(0):
        count += len(batch.values())
    return time.perf_counter() - start, count


def timed_reverse(log: SegmentedLog) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    for batch in log.reverse_reader():
        count += len(batch.values())
    return time.perf_counter() - start, count


def timed_forward_records(log: SegmentedLog) -> tuple[float, int]:
    start = time.perf_counter()
    count = sum(1 for _ in log.forward_reader(0).records())
    return time.perf_counter() - start, count


def last_100_ms(log: SegmentedLog, repeats: int = 200) -> float:
    """Median time to read and materialise the newest 100 messages, newest first."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        values = log.reverse_reader().read(max_messages=100).values()
        times.append(time.perf_counter() - start)
        assert len(values) == 100
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description="Commit-log throughput benchmark")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes per message")
    parser.add_argument("--batch", type=int, default=1000, help="messages per append")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved write rounds")
    parser.add_argument("--small", type=int, default=10_000, help="messages in the small log")
    parser.add_argument("--dir", help="where to put the data (default: a temp dir, removed)")
    args = parser.parse_args()

    rounds = args.messages // args.batch
    messages = rounds * args.batch
    payload_mb = messages * args.size / 1e6
    batches = make_batches(args.batch, args.size)
    root = Path(args.dir or tempfile.mkdtemp(prefix="tidelog-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[Timing]] = {"raw_write": [], "raw_batch_write": [], "append": []}
    log: SegmentedLog | None = None
    try:
        for round_no in range(args.rounds):
            times["raw_write"].append(raw_write(root / "raw.bin", batches, rounds, True))
            times["raw_batch_write"].append(raw_write(root / "batch.bin", batches, rounds, False))
            if log is not None:
                log.delete()
            log = SegmentedLog(root / f"log-{round_no}")
            times["append"].append(log_append(log, batches, rounds))
            (root / "raw.bin").unlink()
            (root / "batch.bin").unlink()
        assert log is not None
        disk_mb = log.size_bytes / 1e6
        segments = log.segment_count
        forward_s, forward_n = timed_forward(log)
        reverse_s, reverse_n = timed_reverse(log)
        records_s, records_n = timed_forward_records(log)
        assert forward_n == reverse_n == records_n == messages, (forward_n, reverse_n, messages)
        last_100_big = last_100_ms(log)
        log.close()

        small = SegmentedLog(root / "small")
        log_append(small, batches, max(1, args.small // args.batch))
        last_100_small = last_100_ms(small)
        small.close()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)

    def mb_per_s(name: str, synced: bool = True) -> float:
        return payload_mb / statistics.median(t[1] if synced else t[0] for t in times[name])

    def spread(name: str) -> list[float]:
        rates = [payload_mb / t[1] for t in times[name]]
        return [round(min(rates), 1), round(max(rates), 1)]

    append_s = statistics.median(t[1] for t in times["append"])
    forward_rate = forward_n / forward_s
    reverse_rate = reverse_n / reverse_s
    result = {
        "benchmark": "log_throughput",
        "messages": messages,
        "message_bytes": args.size,
        "batch": args.batch,
        "rounds": args.rounds,
        "segments": segments,
        "append_msgs_per_s": round(messages / append_s),
        "append_mb_per_s": round(mb_per_s("append"), 1),
        "append_disk_mb_per_s": round(disk_mb / append_s, 1),
        "raw_write_mb_per_s": round(mb_per_s("raw_write"), 1),
        "raw_batch_write_mb_per_s": round(mb_per_s("raw_batch_write"), 1),
        "forward_read_msgs_per_s": round(forward_rate),
        "reverse_read_msgs_per_s": round(reverse_rate),
        "forward_read_records_msgs_per_s": round(records_n / records_s),
        "last_100_of_log_ms": round(last_100_big, 4),
        "last_100_of_small_log_ms": round(last_100_small, 4),
        "ratios": {
            "append_vs_raw_write_mb": round(mb_per_s("append") / mb_per_s("raw_write"), 3),
            "append_vs_raw_batch_write_mb": round(
                mb_per_s("append") / mb_per_s("raw_batch_write"), 3
            ),
            "reverse_vs_forward": round(reverse_rate / forward_rate, 3),
            "last_100_big_vs_small": round(last_100_big / last_100_small, 3),
        },
        "spread_mb_per_s": {name: spread(name) for name in times},
        "cpu_us_per_msg": {
            name: round(statistics.median(t[2] for t in times[name]) / messages * 1e6, 3)
            for name in times
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "page_cache": {
            "append_mb_per_s": round(mb_per_s("append", False), 1),
            "raw_write_mb_per_s": round(mb_per_s("raw_write", False), 1),
            "raw_batch_write_mb_per_s": round(mb_per_s("raw_batch_write", False), 1),
            "append_vs_raw_write_mb": round(
                mb_per_s("append", False) / mb_per_s("raw_write", False), 3
            ),
        },
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
        },
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
