"""Smoke test of the Liftbridge side-by-side harness: ``benchmarks/e2e_throughput.py
--only-liftbridge`` with tiny counts, run as a user runs it, against a real ``tidelog serve`` and
Liftbridge's own server, both driven by the Go driver on go-liftbridge.

It needs the Go build (``make liftbridge``, a prerequisite of ``make test``; the harness rebuilds
in about a second when it is there): a missing ``go`` or a failed build FAILS the test (the
benchmark is part of the project's toolchain). It asserts that every phase measured both sides,
that the ratios are the sides' numbers divided (to the 3 decimals reported), and that both
servers were stopped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
E2E = ROOT / "benchmarks" / "e2e_throughput.py"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


side = _load("liftbridge_side")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rpartition(")")[2].split()[0] == "Z")


@pytest.mark.slow
def test_only_liftbridge_measures_both_servers_and_stops_them(tmp_path: Path) -> None:
    try:
        side.build()
    except side.GoBuildError as error:
        pytest.fail(f"{error} (make liftbridge)", pytrace=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(E2E), "--only-liftbridge", "--messages", "3000"]
    argv += ["--publish-async-messages", "300", "--liftbridge-catchup-messages", "3000"]
    argv += ["--live-rate", "1000", "--live-seconds", "0.5", "--timeout", "60"]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)

    publish = report["vs_liftbridge_publish_async"]
    for ack in ("ack_leader", "ack_all"):
        ours, theirs = publish[ack]["tidelog_msgs_per_s"], publish[ack]["liftbridge_msgs_per_s"]
        assert ours > 0 and theirs > 0
        assert publish[ack]["value"] == pytest.approx(ours / theirs, rel=0.01, abs=1e-3)
    catchup = report["vs_liftbridge_catchup"]
    assert catchup["messages"] == 3000
    ours, theirs = catchup["tidelog_msgs_per_s"], catchup["liftbridge_msgs_per_s"]
    assert ours > 0 and theirs > 0
    assert catchup["value"] == pytest.approx(ours / theirs, rel=0.01, abs=1e-3)
    live = report["vs_liftbridge_live_p99"]
    assert live["tidelog_p99_ms"] > 0 and live["liftbridge_p99_ms"] > 0
    ratio = live["liftbridge_p99_ms"] / live["tidelog_p99_ms"]
    assert live["value"] == pytest.approx(ratio, rel=0.01, abs=1e-3)

    record = report["details"]["liftbridge"]
    (round_,) = record["rounds"]
    for name in ("tidelog", "liftbridge"):
        assert round_["publish_leader"][name]["count"] == 300
        assert round_["publish_all"][name]["count"] == 300
        assert round_["catchup"][name]["count"] == 3000
        assert round_["catchup"][name]["bytes"] == 3000 * 100  # every value read whole
        assert round_["live"][name]["missing"] == 0
        assert round_["live"][name]["samples"] == 500  # 0.5 s at 1,000 msgs/s past the warm-up
        assert round_["catchup"][name]["server_cpu_s"] is not None
        assert not _alive(record["pids"][name]), f"{name} still running"
        assert not Path(record["directories"][name]).exists()
    assert record["exit_codes"] == {"tidelog": 0, "liftbridge": 0}  # both stopped gracefully
