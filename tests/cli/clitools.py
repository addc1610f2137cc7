"""Helpers for driving the real ``tidelog`` command (``python -m tidelog.cli``) in subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Queue

CLI_TIMEOUT = 60.0
"""A CLI call that has not finished by then is a hang (``run`` kills the child by PID)."""
READY = "tidelog listening on "

_AT_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
    " os.execv(sys.argv[1], sys.argv[1:])"
)


def at_terminal(*args: str) -> list[str]:
    """``tidelog ARGS...`` with SIGINT at its default, as at a terminal, whatever the test process
    inherited (a background job's SIGINT is ignored, and that carries over exec). The reset is a
    shim that execs the command rather than a ``preexec_fn``, which would make ``subprocess``
    fork() and run gRPC's fork handlers in a child of a process with calls in flight."""
    return [sys.executable, "-c", _AT_TERMINAL, sys.executable, "-m", "tidelog.cli", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any TIDELOG_* setting (or COLUMNS), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_") and k != "COLUMNS"}
    return {**env, **extra}


@dataclass(frozen=True)
class Cli:
    """Runs ``tidelog ARGS... --server ADDRESS``; ``server=False`` leaves ``--server`` out."""

    address: str

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        server: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tidelog.cli", *args]
        if server:
            command += ["--server", self.address]
        return subprocess.run(
            command,
            input=input,
            capture_output=True,
            text=True,
            env=env if env is not None else clean_env(),
            timeout=CLI_TIMEOUT,
        )

    def many(self, *calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        """Independent calls, run concurrently (most of their time is interpreter start-up)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda args: self(*args), calls))


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: ...`` line a failed command printed on stderr."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{done.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def words(text: str) -> str:
    """``text`` with every run of whitespace (line breaks included) as one space: what a person
    reads, however the terminal width wrapped it."""
    return " ".join(text.split())


def error_text(done: subprocess.CompletedProcess[str]) -> str:
    """The ``error: ...`` message a failed command printed on stderr, as words (see
    ``test_cli_errors.py`` for the one-line rule itself)."""
    text = words(done.stderr)
    assert text.startswith("error: "), done.stderr
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LineReader:
    """Collects a child's stdout lines on a thread, so a test can wait for them with a bound."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.lines: Queue[str | None] = Queue()
        self._thread = threading.Thread(target=self._pump, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def take(self, count: int, timeout: float = 15.0) -> list[str]:
        """The next ``count`` lines; fewer if the stream ends or ``timeout`` s pass."""
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except Empty:
                break
            if line is None:
                break
            got.append(line)
        return got


class Serve:
    """``tidelog serve ARGS...`` exactly as given (no flags added), stopped by PID."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidelog.cli", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env if env is not None else clean_env(),
            cwd=cwd,
        )
        self.stdout = LineReader(self.process)

    def ready_line(self, timeout: float = 30.0) -> str | None:
        """The ``tidelog listening on HOST:PORT`` line, or None if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.stdout.take(1, timeout=deadline - time.monotonic())
            if not lines:
                return None
            if lines[0].startswith(READY):
                return lines[0]
        return None

    def port(self) -> int:
        line = self.ready_line()
        assert line is not None, f"serve did not start:\n{self.stderr()}"
        return int(line.rsplit(":", 1)[1])

    def stderr(self) -> str:
        self.stop()
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise


__all__ = [
    "Cli",
    "LineReader",
    "Path",
    "Serve",
    "clean_env",
    "error_text",
    "free_port",
    "one_error_line",
    "words",
]
