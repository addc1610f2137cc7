from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh ``tidelog serve`` on a free loopback port, stopped (by PID) after the test."""
    with served(tmp_path / "data") as process:
        yield process
