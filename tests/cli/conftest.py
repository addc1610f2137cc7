"""Fixtures for the CLI tests: one server per module, a runner bound to it, a stream name."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from tests.cli.clitools import Cli
from tests.support.server import ServerProcess, served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``tidelog serve`` per test module (each test uses its own streams), killed by PID."""
    with served(tmp_path_factory.mktemp("cli-server") / "data") as process:
        yield process


@pytest.fixture
def cli(server: ServerProcess) -> Cli:
    return Cli(server.address)


@pytest.fixture
def stream(request: pytest.FixtureRequest) -> str:
    """A stream name of this test's own (not created yet)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:80]
