"""Fixtures of the Kafka front's tests that start a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

from tidelog.process import free_port


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    """A fresh ``tidelog serve`` with its Kafka listener on a free loopback port: (the process,
    that port); stopped (by PID) after the test."""
    port = free_port()
    with served(tmp_path / "data", "--kafka-port", str(port)) as process:
        yield process, port
