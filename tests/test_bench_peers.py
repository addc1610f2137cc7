"""Smoke test of benchmarks/peers.py: tiny runs against real redis-server and nats-server.

Missing servers or client libraries make these tests FAIL (not skip): the peer benchmark is part
of the project's toolchain, and its install step (see benchmarks/peers.py) must have run.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PEERS_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def _load_peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers", PEERS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("peers", module)
    spec.loader.exec_module(module)
    return module


peers = _load_peers()


def require_installed() -> None:
    """Fail (not skip, not error) with the install instructions when a peer is missing."""
    missing = []
    for binary in ("redis-server", "redis-benchmark", "nats-server"):
        try:
            peers.find_binary(binary)
        except peers.PeerNotInstalledError:
            missing.append(binary)
    for module in ("redis", "hiredis", "nats"):
        if importlib.util.find_spec(module) is None:
            missing.append(f"python module {module}")
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: {peers.INSTALL_HINT}", pytrace=False)


def _assert_rates(result: dict[str, Any], keys: tuple[str, ...], n: int) -> None:
    for key in keys:
        value = result[key]
        assert isinstance(value, float) and value > 0, (key, value)
    assert result["published"] == n
    assert result["read"] == n
    assert result["timed_out"] is False
    assert result["server_pids"]
    for pid in result["server_pids"]:
        assert not peers.pid_alive(pid), f"server PID {pid} still running"


@pytest.mark.slow
def test_redis_smoke() -> None:
    require_installed()
    payloads = peers.make_payloads(2000, 100)
    result = peers.measure_redis(payloads, timeout=30)
    _assert_rates(
        result, ("publish_msgs_per_s", "read_msgs_per_s", "c_client_publish_msgs_per_s"), 2000
    )
    assert result["c_client_published"] == 2000
    assert len(result["server_pids"]) == 2


@pytest.mark.slow
def test_nats_smoke() -> None:
    require_installed()
    payloads = peers.make_payloads(2000, 100)
    result = peers.measure_nats(payloads, timeout=30)
    _assert_rates(result, ("publish_msgs_per_s", "read_msgs_per_s"), 2000)
    assert result["client_errors"] == []


@pytest.mark.slow
@pytest.mark.parametrize("measure", ["measure_redis", "measure_nats"])
def test_timeout_reports_partial_rate(measure: str) -> None:
    require_installed()
    payloads = peers.make_payloads(300_000, 100)
    result = getattr(peers, measure)(payloads, timeout=0.05)
    assert result["timed_out"] is True
    assert "publish" in result["timed_out_phases"]
    assert 0 <= result["published"] < len(payloads)
    for pid in result["server_pids"]:
        assert not peers.pid_alive(pid)


@pytest.mark.parametrize("factory", ["redis_server", "nats_server"])
def test_server_stopped_and_removed_on_error(factory: str) -> None:
    require_installed()
    make: Callable[[], Any] = getattr(peers, factory)
    server = make()
    with pytest.raises(ZeroDivisionError), server:
        pid, directory = server.pid, server.directory
        assert peers.pid_alive(pid) and directory.is_dir()
        _ = 1 / 0
    assert not peers.pid_alive(pid)
    assert not directory.exists()


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    require_installed()
    import json

    assert peers.main(["--messages", "1000", "--size", "32", "--only", "redis"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["messages"] == 1000 and out["message_bytes"] == 32
    assert "nats" not in out
    assert out["redis"]["publish_msgs_per_s"] > 0
    assert out["versions"]["redis_py"]


def test_missing_binary_message() -> None:
    with pytest.raises(peers.PeerNotInstalledError, match="install"):
        peers.find_binary("no-such-peer-server-binary")
    assert shutil.which("no-such-peer-server-binary") is None
