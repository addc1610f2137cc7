"""``tidelog serve`` refuses, in one line and exit code 1, a port or a data directory in use."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from clitools import CLI_TIMEOUT, clean_env
from tests.support.server import ServerProcess


def serve(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "serve", "--metrics-port", "0", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=clean_env(**(env_extra or {})),
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_a_port_in_use_is_refused_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--data-dir", str(tmp_path / "data"), "--port", str(port))
    assert result.returncode == 1, result.stderr
    (line,) = error_lines(result)
    assert f"cannot listen on 127.0.0.1:{port}" in line
    assert "Traceback" not in result.stderr


def test_a_data_directory_in_use_is_refused_with_one_line(tmp_path: Path) -> None:
    running = ServerProcess(tmp_path / "data").start()
    try:
        result = serve("--data-dir", str(tmp_path / "data"), "--port", "0")
        assert running.process is not None and running.process.poll() is None
    finally:
        running.kill()
    assert result.returncode == 1, result.stderr
    (line,) = error_lines(result)
    assert "is in use by another tidelog server" in line
    assert "Traceback" not in result.stderr


def test_a_metrics_port_in_use_is_refused_with_one_line(tmp_path: Path) -> None:
    """The error names the port and how to choose another; nothing is left half-started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidelog.cli",
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                "0",
                "--metrics-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=clean_env(),
        )
    assert result.returncode == 1, result.stderr
    (line,) = error_lines(result)
    assert f"127.0.0.1:{port}" in line
    assert "--metrics-port" in line and "TIDELOG_METRICS_PORT" in line
    assert "Traceback" not in result.stderr
    assert "tidelog listening on" not in result.stdout


def test_an_unreadable_groups_file_is_refused_naming_it(tmp_path: Path) -> None:
    """The saved consumer groups are never dropped silently: the server does not start."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "groups.json").write_text('{"version": 1, "groups": {"g": {"epoch"')
    result = serve("--data-dir", str(data), "--port", "0", env_extra={"COLUMNS": "1000"})
    assert result.returncode == 1, result.stderr
    (line,) = error_lines(result)
    assert f"cannot restore consumer groups from {data / 'groups.json'}" in line
    assert "Traceback" not in result.stderr
