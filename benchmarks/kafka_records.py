#!/usr/bin/env python3
"""The Kafka record layer's speed: produce side (parse + to_tidelog) and fetch side (to_kafka).

Produce: ``--batches`` record batches of ``--records`` records with ``--size``-byte values, no
keys and no headers, back to back as one partition's ``records`` of a Produce request, are parsed
(``parse_batches``) and mapped to tidelog records (``to_tidelog``). Two shapes: every record the
same size and timestamp, timestamps that advance one ms per 100 records (both proven by the
parser's vectorised guess of where records start), and values of 50 to 150 bytes (the guess
fails: the per-record walk over length varints). Fetch: the records of one batch are appended
to a log in a temporary directory, read back as one ``MessageBatch`` and turned into a Kafka
batch (``to_kafka``).
Each figure is the best of ``--rounds`` (the machine is shared and noisy). Prints one JSON object.

    python benchmarks/kafka_records.py [--batches 10] [--records 10000] [--size 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

from tidelog.kafka.convert import to_kafka, to_tidelog
from tidelog.kafka.records import build_batch, parse_batches
from tidelog.log import FlushPolicy, LogConfig, SegmentedLog


def kafka_batch(records: int, size: int, ms_per_100: int, spread: int = 0) -> bytes:
    """A producer's batch: values of ``size`` bytes (give or take ``spread``), no keys."""
    values = os.urandom(records * (size + spread))
    lens = np.random.default_rng(7).integers(size - spread, size + spread + 1, records)
    starts = np.cumsum(lens) - lens
    stamps = 1_700_000_000_000 + np.arange(records, dtype=np.int64) // 100 * ms_per_100
    offsets = np.arange(records, dtype=np.int64)
    return build_batch(offsets=offsets, timestamps=stamps, values=(values, starts, lens))


def best(rounds: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def produce(data: bytes) -> None:
    for batch in parse_batches(data):
        to_tidelog(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    total = args.batches * args.records
    result: dict[str, object] = {"records": total, "value_bytes": args.size}
    shapes = (("uniform", 0, 0), ("advancing_ms", 1, 0), ("sizes_vary", 1, args.size // 2))
    for shape, ms_per_100, spread in shapes:
        data = kafka_batch(args.records, args.size, ms_per_100, spread) * args.batches
        parse_s = best(args.rounds, lambda data=data: parse_batches(data))  # type: ignore[misc]
        both_s = best(args.rounds, lambda data=data: produce(data))  # type: ignore[misc]
        result[f"produce_{shape}"] = {
            "parse_records_per_s": round(total / parse_s),
            "parse_to_tidelog_records_per_s": round(total / both_s),
        }
    one = parse_batches(kafka_batch(args.records, args.size, 1))[0]
    with tempfile.TemporaryDirectory() as directory:
        log = SegmentedLog(directory, LogConfig(flush_policy=FlushPolicy.NEVER))
        try:
            log.append(to_tidelog(one))
            read, _, _ = log.read_forward(0, args.records - 1, args.records, 1 << 30)
            assert len(read) == args.records
            fetch_s = best(args.rounds, lambda: to_kafka(read, log_append_time=False))
        finally:
            log.close()
    result["fetch_to_kafka_records_per_s"] = round(args.records / fetch_s)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
