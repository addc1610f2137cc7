#!/usr/bin/env python3
""" "The last 10 values of a key in [t0, t1]": backward_fetch against a forward fetch.

One window store per backend (memory, RocksDB in a temporary directory), ``retain_duplicates``,
one key, one 100-byte value per millisecond for ``max(sizes)`` ms. For each size N the query
range [t1 - N + 1, t1] ends at the newest value and holds N values. Two ways to answer it:

- ``backward_ms``: ``backward_fetch`` and take the first 10 (then close the iterator);
- ``forward_ms``: ``fetch`` the whole range, keeping the last 10 (what a store without backward
  iteration forces).

Times are medians over repetitions, in milliseconds. Prints one JSON object with ``sizes``, a
``memory`` and a ``rocksdb`` object (``backward_ms``, ``forward_ms`` aligned with ``sizes``,
``backward_flat_ratio`` = max / min backward time, ``speedup_at_largest`` = forward / backward at
the largest size), and the load times. Targets: backward flat within 2x, and >= 100x faster than
forward at 1,000,000.

    python benchmarks/window_fetch.py [--quick] [--sizes 1000,100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

from tidelog.store import InMemoryWindowStore, RocksDBWindowStore, WindowStore

KEY = b"sensor-42"
LAST = 10
VALUE_BYTES = 100


def load(store: WindowStore, count: int) -> float:
    """Put ``count`` values, one per ms from 0; returns the seconds it took."""
    value = bytes(range(VALUE_BYTES))
    began = time.perf_counter()
    for t in range(count):
        store.put(KEY, value, t)
    if isinstance(store, RocksDBWindowStore):
        store.flush()
    return time.perf_counter() - began


def backward_last(store: WindowStore, t0: int, t1: int) -> list[Any]:
    with store.backward_fetch(KEY, t0, t1) as it:
        return list(islice(it, LAST))


def forward_last(store: WindowStore, t0: int, t1: int) -> list[Any]:
    with store.fetch(KEY, t0, t1) as it:
        return list(deque(it, maxlen=LAST))[::-1]


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 4)


def measure(store: WindowStore, sizes: list[int], newest: int) -> dict[str, Any]:
    backward, forward = [], []
    for size in sizes:
        t0, t1 = newest - size + 1, newest
        assert backward_last(store, t0, t1) == forward_last(store, t0, t1)
        assert [e[1] for e in backward_last(store, t0, t1)] == list(range(t1, t1 - LAST, -1))
        backward.append(median_ms(lambda t0=t0, t1=t1: backward_last(store, t0, t1), 101))
        repeats = 3 if size >= 500_000 else 5 if size >= 50_000 else 21
        forward.append(median_ms(lambda t0=t0, t1=t1: forward_last(store, t0, t1), repeats))
    return {
        "backward_ms": backward,
        "forward_ms": forward,
        "backward_flat_ratio": round(max(backward) / min(backward), 2),
        "speedup_at_largest": round(forward[-1] / backward[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1,000 / 10,000 / 100,000")
    parser.add_argument("--sizes", help="comma-separated range sizes (default 1000,100000,1000000)")
    args = parser.parse_args()
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    elif args.quick:
        sizes = [1_000, 10_000, 100_000]
    else:
        sizes = [1_000, 100_000, 1_000_000]
    count = max(sizes)
    result: dict[str, Any] = {"sizes": sizes}
    with tempfile.TemporaryDirectory() as tmp:
        stores: dict[str, Callable[[], WindowStore]] = {
            "memory": lambda: InMemoryWindowStore(retain_duplicates=True),
            "rocksdb": lambda: RocksDBWindowStore(Path(tmp) / "w", retain_duplicates=True),
        }
        for name, open_store in stores.items():
            with open_store() as store:
                load_s = load(store, count)
                result[name] = measure(store, sizes, count - 1)
                result[name]["load_s"] = round(load_s, 2)
    result["value_bytes"] = VALUE_BYTES
    result["last"] = LAST
    result["python"] = platform.python_version()
    result["machine"] = platform.machine()
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
