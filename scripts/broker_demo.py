#!/usr/bin/env python3
"""``make demo-broker``: the broker end to end on this machine, in about ten seconds.

Starts ``tidelog serve`` on a free loopback port with a temporary data directory, creates a
stream, publishes 100,000 orders in batches, reads them back forward (catch-up) and backward
(the newest ten), follows live messages, stores a cursor, kills the server with SIGKILL, starts
it again on the same data and checks that every acknowledged message came back. Prints what it
does; exits non-zero if any check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from tidelog import Client
from tidelog.process import ServerProcess


def start_server(data_dir: Path) -> ServerProcess:
    return ServerProcess(data_dir, "--log-level", "WARNING").start()


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="tidelog-demo-"))
    server = start_server(data_dir)
    address = server.address
    print(f"server {address} (pid {server.pid}), data in {data_dir}")
    try:
        with Client(address) as client:
            step("create stream 'orders' with 2 partitions")
            client.create_stream("orders", partitions=2)

            step("publish 100,000 orders to partition 0 in batches of 1,000")
            started = time.perf_counter()
            orders = [json.dumps({"order": i, "amount": i % 97}).encode() for i in range(100_000)]
            acks = client.publish_batch("orders", orders, partition=0)
            elapsed = time.perf_counter() - started
            print(
                f"{len(acks):,} acks, offsets {acks[0].offset}..{acks[-1].offset}, "
                f"{len(acks) / elapsed:,.0f} msgs/s"
            )
            client.publish(
                "orders",
                b'{"order": "vip"}',
                key=b"customer-7",
                headers={"source": b"demo"},
                partition=1,
            )

            step("catch up: read partition 0 from the earliest offset to the latest")
            started = time.perf_counter()
            seen = sum(1 for _ in client.subscribe("orders", 0, start="earliest", stop="latest"))
            print(f"read {seen:,} messages in {time.perf_counter() - started:.2f} s")
            assert seen == len(orders)

            step("reverse: the newest three orders, newest first")
            for i, m in enumerate(client.subscribe("orders", 0, start="latest", reverse=True)):
                print(f"  offset {m.offset}: {m.value.decode()}")
                if i == 2:
                    break

            step("live: a follower receives messages as they are published")
            received: list[int] = []

            def follow() -> None:
                with Client(address) as follower:
                    for m in follower.subscribe("orders", 0, start="new"):
                        received.append(m.offset)
                        if len(received) == 5:
                            return

            thread = threading.Thread(target=follow)
            thread.start()
            time.sleep(0.5)
            for n in range(5):
                client.publish("orders", f"live {n}".encode(), partition=0)
            thread.join(10)
            print(f"follower got offsets {received}")
            assert len(received) == 5

            step("cursor: remember where consumer 'billing' stopped")
            client.set_cursor("billing", "orders", 0, acks[-1].offset)
            print(f"cursor billing = {client.fetch_cursor('billing', 'orders', 0)}")

        step("crash: SIGKILL the server, start it again on the same data")
        server.kill()
        server = start_server(data_dir)
        address = server.address
        with Client(address) as client:
            info = client.stream_info("orders")
            print(f"after restart: partition 0 newest offset {info.partitions[0].newest_offset}")
            values = [
                m.value
                for m in client.subscribe("orders", 0, start="earliest", stop=len(orders) - 1)
            ]
            assert values == orders, "acknowledged messages differ after the crash"
            assert client.fetch_cursor("billing", "orders", 0) == acks[-1].offset
            key_message = next(client.subscribe("orders", 1, start="earliest", stop="latest"))
            assert key_message.key == b"customer-7" and key_message.headers == {"source": b"demo"}
            print("every acknowledged message, key, header and cursor came back")
        print("\ndemo passed")
        return 0
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.pop("TIDELOG_SERVER", None)
    raise SystemExit(main())
