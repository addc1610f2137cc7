"""``tidelog console``: a port in use is refused in one line (exit 1); the help names the
options the docs promise."""

from __future__ import annotations

import socket
import subprocess
import sys

from clitools import CLI_TIMEOUT, clean_env


def console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "console", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=clean_env(),
    )


def test_a_port_in_use_is_refused_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = console("--server", "127.0.0.1:1", "--port", str(port))
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"cannot serve the console on 127.0.0.1:{port}" in line and "--host/--port" in line
    assert "Traceback" not in result.stderr


def test_the_help_names_its_options() -> None:
    result = console("--help")
    assert result.returncode == 0
    for option in ("--server", "--host", "--port", "--sample-interval", "--stall-after"):
        assert option in result.stdout
