"""A benchmark's server subprocess: started in a temporary directory, stopped by its PID.

:class:`ServerProcess` is the shape the servers the benchmarks start have in common (tidelog in
``e2e_throughput.py``, Liftbridge in ``liftbridge_side.py``, Redis and NATS in ``peers.py``): a
context manager whose entering calls the subclass's :meth:`ServerProcess.start` (make the
directory, spawn the process, wait until it is ready) and, if that fails, stops whatever it had
started; whose leaving stops the process by PID (:attr:`ServerProcess.stop_signal`, then SIGKILL
after :attr:`ServerProcess.stop_timeout`) and removes the directory, whatever happened between.

Invariants: after :meth:`ServerProcess.stop`, ``proc`` is None, the server's log file is closed
and its directory removed; ``exit_code`` is the process's exit code (None if none was started).
The process is found by the PID it was started with and nothing else (never by its name).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any, Self


def stop_pid(
    proc: subprocess.Popen[Any], first: signal.Signals = signal.SIGTERM, timeout: float = 30.0
) -> int | None:
    """Stop ``proc`` by its PID: ``first``, then SIGKILL after ``timeout`` seconds; its exit
    code (a process that has exited already is only reaped)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, first)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    return proc.returncode


class ServerProcess:
    """One server subprocess on 127.0.0.1 with its own temporary directory (module docstring);
    subclasses give :meth:`start`, and may change :attr:`stop_signal` and :attr:`stop_timeout`."""

    stop_signal: signal.Signals = signal.SIGTERM
    """What asks the server to stop (SIGKILL follows after :attr:`stop_timeout`)."""
    stop_timeout: float = 30.0

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.pid = 0
        self.exit_code: int | None = None
        self._log: IO[bytes] | None = None
        """The server's log file when this object opened it (closed in :meth:`stop`)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Make the directory, start the server and return once it is ready (or raise)."""
        raise NotImplementedError

    def make_directory(self, prefix: str) -> Path:
        self.directory = Path(tempfile.mkdtemp(prefix=prefix))
        return self.directory

    def log_tail(self, limit: int = 2000) -> str:
        """The last ``limit`` bytes of ``server.log`` in the directory, as text ("" if none)."""
        if self.directory is None:
            return ""
        try:
            return (self.directory / "server.log").read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def stop_process(self) -> None:
        """Stop the process (by PID) and close its log; the directory stays (a retry may use
        it)."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                self.exit_code = stop_pid(proc, self.stop_signal, self.stop_timeout)
                if proc.stdout is not None:
                    proc.stdout.close()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def stop(self) -> None:
        """Stop the process and remove the directory; safe to call more than once."""
        try:
            self.stop_process()
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None
