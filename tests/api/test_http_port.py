"""The server's HTTP port serves /metrics and the web console at / together, and the console can
be turned off (``console = false``) leaving /metrics alone."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.support.server import served

from tidelog.client import Client


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


@pytest.mark.slow
def test_a_stop_ends_open_live_tails_at_once(tmp_path: Path) -> None:
    """SIGTERM with a live tail open: the tail's stream ends by itself, the server stops well
    within the port's grace time, and nothing is logged as failed."""
    port = free_port()
    with served(tmp_path / "data", "--metrics-port", str(port)) as process:
        with Client(process.address) as client:
            client.create_stream("t")
        tail = urllib.request.urlopen(f"http://127.0.0.1:{port}/streams/t/tail", timeout=10)
        try:
            assert tail.readline().startswith(b"retry:")  # the stream is open
            started = time.monotonic()
            assert process.stop() == 0
            elapsed = time.monotonic() - started
            assert tail.read() is not None  # the stream ended (no timeout)
        finally:
            tail.close()
    logged = "".join(process.stderr_lines)
    assert "Traceback" not in logged and "Exception in ASGI application" not in logged, logged
    assert elapsed < 0.9, f"the stop waited for the tail: {elapsed:.2f} s"
