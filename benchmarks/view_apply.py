#!/usr/bin/env python3
"""What materialised views cost a publisher: the same keyed publish with no view, a table, a
window index.

Starts its own ``tidelog serve`` (free loopback port, temporary data directory; stopped by PID),
then for each case creates a stream and publishes N keyed messages (1,000 keys, 100-byte values)
in batches of 5,000 through the client, and asks the view once at the end (a query first applies
everything published, so the clock stops only when the view has caught up). Prints one JSON
object: per case ``publish_msgs_per_s`` (until the last ack) and ``caught_up_msgs_per_s`` (until
the view answered), and ``ratio`` = caught-up rate / the rate without a view.

    python benchmarks/view_apply.py [--messages N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tidelog import Client
from tidelog.client import Message, View
from tidelog.process import ServerProcess

BATCH = 5000


def measure(
    client: Client, name: str, views: list[View], messages: list[Message]
) -> dict[str, Any]:
    client.create_stream(name, views=views)
    started = time.perf_counter()
    for i in range(0, len(messages), BATCH):
        client.publish_batch(name, messages[i : i + BATCH], partition=0)
    published = time.perf_counter() - started
    if views and views[0].kind == "table":
        client.view_get(name, views[0].name, b"k1")
    elif views:
        client.last_values(name, views[0].name, b"k1", 1)
    caught_up = time.perf_counter() - started
    return {
        "publish_msgs_per_s": round(len(messages) / published),
        "caught_up_msgs_per_s": round(len(messages) / caught_up),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    messages = [Message(b"x" * 100, key=f"k{i % 1000}".encode()) for i in range(args.messages)]
    cases = {
        "none": [],
        "table": [View.table("t")],
        "window": [View.window("w", 1000)],
    }
    with tempfile.TemporaryDirectory(prefix="tidelog-view-bench-") as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        try:
            with Client(server.address) as client:
                results = {
                    case: measure(client, case, views, messages) for case, views in cases.items()
                }
        finally:
            server.kill()
    base = results["none"]["caught_up_msgs_per_s"]
    for case in ("table", "window"):
        results[case]["ratio"] = round(results[case]["caught_up_msgs_per_s"] / base, 2)
    print(json.dumps({"messages": args.messages, **results}))


if __name__ == "__main__":
    main()
