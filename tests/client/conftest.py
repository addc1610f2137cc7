"""Fixtures for the client tests: one server per module, a stream name per test, a raw stub."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``tidelog serve`` per test module (each test uses its own streams), killed by PID."""
    with served(tmp_path_factory.mktemp("client-server") / "data") as process:
        yield process


@pytest.fixture
def stream(request: pytest.FixtureRequest) -> str:
    """A stream name of this test's own (not created yet)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:80]


@pytest.fixture
def api(server: ServerProcess) -> Iterator[pb_grpc.APIStub]:
    """A raw ``proto.API`` stub, for what the client does not offer (pause, read-only...)."""
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.APIStub(channel)
