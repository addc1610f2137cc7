#!/usr/bin/env python3
"""``make sites``: three tidelog sites on loopback, replicating to each other, until Ctrl-C.

Starts ``tidelog serve`` three times - sites ``a``, ``b`` and ``c`` on ports 9301, 9302 and 9303
(metrics off), data in ``./tidelog-sites/<site>`` - and declares every site on every other, so a
payload transmitted on any of them can go to the two others. Prints how to try it, then waits;
Ctrl-C (or SIGTERM) stops the three servers gracefully. The data stays for the next run.

    python scripts/sites.py [--base-port 9301] [--data-dir tidelog-sites]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import tidelog

SITES = ("a", "b", "c")


def start(site: str, port: int, data_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "serve",
            "--site-id",
            site,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--data-dir",
            str(data_dir / site),
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
            # Keep reading its stdout so the server never blocks on a full pipe.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process
        if not line and process.poll() is not None:
            break
    process.kill()
    raise SystemExit(f"site {site} did not start on port {port} (is the port free?)")


def main() -> None:
    parser = argparse.ArgumentParser(description="three replicating tidelog sites on loopback")
    parser.add_argument("--base-port", type=int, default=9301)
    parser.add_argument("--data-dir", type=Path, default=Path("tidelog-sites"))
    args = parser.parse_args()
    ports = {site: args.base_port + i for i, site in enumerate(SITES)}
    processes: list[subprocess.Popen[str]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for site in SITES:
            processes.append(start(site, ports[site], args.data_dir))
        for site in SITES:
            with tidelog.Client(f"127.0.0.1:{ports[site]}") as client:
                known = {s.site_id for s in client.list_sites()[1]}
                for other in SITES:
                    if other != site and other not in known:
                        client.add_site(other, f"127.0.0.1:{ports[other]}")
        print("three sites, each declared on the others:")
        for site in SITES:
            print(f"  site {site}: 127.0.0.1:{ports[site]}  (data in {args.data_dir / site})")
        print(
            f"try:  tidelog site transmit orders b,c hello --server 127.0.0.1:{ports['a']}\n"
            f"      tidelog site status --server 127.0.0.1:{ports['a']}\n"
            f"      tidelog tail __lrq_recv.orders.a --from earliest "
            f"--server 127.0.0.1:{ports['b']}\n"
            "Ctrl-C stops the three servers.",
            flush=True,
        )
        while not stop.is_set():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        print("stopped the three sites")


if __name__ == "__main__":
    main()
