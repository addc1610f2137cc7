"""The CLI's client commands load the client and ``tidelog.wire`` only: no broker, log or store
module, nor numpy or RocksDB, which only the server needs (``tidelog serve`` loads it late).

Each check runs ``tidelog publish``'s code path in a fresh interpreter (this process has long
imported everything) and reports what that interpreter loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.cli.clitools import CLI_TIMEOUT, Cli, clean_env, free_port
from tests.support.server import ServerProcess

SERVER_ONLY = ("tidelog.log", "tidelog.broker", "tidelog.store", "numpy", "rocksdict")
"""Packages (with their submodules) a client command must not load."""

PROBE = """
import json, sys
from tidelog.cli.app import app
try:
    app(["publish", *sys.argv[3:], "--json", "--server", sys.argv[2]], prog_name="tidelog")
except SystemExit as done:
    code = done.code
heavy = tuple(sys.argv[1].split(","))
loaded = sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy)))
print(json.dumps({"exit": code, "loaded": loaded}))
"""


def publish_in_fresh_process(server: str, *args: str) -> tuple[int, list[str], list[str]]:
    """(exit code, server-only modules loaded, the lines printed before the report)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(SERVER_ONLY), server, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=CLI_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    *printed, last = done.stdout.splitlines()
    report = json.loads(last)
    return report["exit"], report["loaded"], printed


def test_a_publish_to_no_server_loads_no_server_module() -> None:
    code, loaded, _ = publish_in_fresh_process(f"127.0.0.1:{free_port()}", "s", "v")
    assert code == 1  # nobody listens: the client gave up
    assert loaded == []


@pytest.mark.slow
def test_a_publish_loads_no_server_module(cli: Cli, server: ServerProcess, stream: str) -> None:
    """Against a real server (``server``: another process, killed by PID), the whole path: the
    message packed, sent and acknowledged."""
    assert cli("stream", "create", stream).returncode == 0
    code, loaded, printed = publish_in_fresh_process(server.address, stream, "v")
    assert code == 0
    assert json.loads(printed[-1])["offset"] == 0
    assert loaded == []
