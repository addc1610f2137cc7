#!/usr/bin/env python3
"""``make kafka-dist`` / ``make spark-kafka``: fetch Apache Kafka's broker, or Spark's Kafka
source, and their runtime dependencies from Maven Central into ``build/kafka/`` (see
tests/support/kafka_dist.py, which the tests and benchmarks use to find them).

Usage::

    python scripts/kafka_dist.py broker|spark-kafka [--force]

Prints the bundle's ``lib`` directory. Exit codes: 0 fetched (or already there), 1 Maven failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.kafka_dist import BUNDLES, FetchFailed, fetch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", choices=sorted(BUNDLES))
    parser.add_argument("--force", action="store_true", help="fetch again even when present")
    args = parser.parse_args()
    bundle = BUNDLES[args.bundle]
    started = time.monotonic()
    try:
        lib = fetch(bundle, force=args.force)
    except FetchFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    count = len(list(lib.glob("*.jar")))
    print(f"{lib} ({count} jars, {time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
