"""``tidelog.spark.remote.connect``: the first server that answers; with ``wait_s`` (what a
streaming query's writer uses at each commit) it waits for a broker that is restarting instead
of failing the query. No Spark session needed."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from tests.support.server import ServerProcess

from tidelog.client import ClientTls, Unavailable
from tidelog.spark import remote


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_a_writer_waits_for_a_restarting_broker_and_a_probe_does_not(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(Unavailable, match="no tidelog server answered"):
        remote.connect(
            [address], ClientTls()
        )  # nothing listens: one probe (2 s budget), then the error
    assert time.monotonic() - started < 10

    server = ServerProcess(tmp_path / "data", "--port", str(port))
    later = threading.Timer(3.0, server.start)  # later than one probe gives up (2 s)
    later.start()
    try:
        client = remote.connect([address], ClientTls(), wait_s=60)
        try:
            assert client.list_streams() is not None
        finally:
            client.close()
    finally:
        later.join()
        server.kill()
