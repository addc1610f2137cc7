"""The server's HTTP port serves /metrics and the web console at / together, and the console can
be turned off (``console = false``) leaving /metrics alone."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.support.server import served


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-type"], error.read().decode()


@pytest.mark.slow
def test_metrics_and_the_console_share_the_port(tmp_path: Path) -> None:
    port = free_port()
    with served(tmp_path / "data", "--metrics-port", str(port)):
        status, kind, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and kind.startswith("text/plain")
        assert "tidelog_messages_in_total" in text
        status, kind, text = get(f"http://127.0.0.1:{port}/")  # redirected to /streams
        assert status == 200 and kind.startswith("text/html") and "<h1>Streams</h1>" in text
        status, kind, text = get(f"http://127.0.0.1:{port}/static/htmx.min.js")
        assert status == 200 and "htmx" in text
    with served(tmp_path / "data", "--metrics-port", str(port), env={"TIDELOG_CONSOLE": "false"}):
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        assert get(f"http://127.0.0.1:{port}/streams")[0] == 404
