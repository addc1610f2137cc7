"""What the console's browser tests share: a standalone ``tidelog console`` process, a free
port, and screenshots saved under docs/console/."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Console:
    """A standalone ``tidelog console`` process, killed by PID."""

    def __init__(self, server: str, *extra: str) -> None:
        command = [sys.executable, "-m", "tidelog.cli", "console", "--server", server, "--port=0"]
        self.process = subprocess.Popen(
            [*command, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"http://[^/ ]+/", line)
        if match is None:
            self.kill()
            raise RuntimeError(f"tidelog console did not start: {line!r}")
        self.url = match.group(0).rstrip("/")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
