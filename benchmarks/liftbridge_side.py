#!/usr/bin/env python3
"""Liftbridge itself beside tidelog: the same Go client against both servers, in one run.

The anchor of issue 27. Liftbridge's own server (``github.com/liftbridge-io/liftbridge``, with
its embedded NATS) and a driver program on Liftbridge's official Go client
(``github.com/liftbridge-io/go-liftbridge/v2``; ``benchmarks/go/lbbench``) are built from Go
modules by ``build``: ``go build`` in the module ``benchmarks/go`` (its ``go.mod`` pins both and
names the server as a ``tool``; ``go.sum`` is committed), with the binaries under one build
directory (``build/go`` of the checkout, gitignored; ``$TIDELOG_GO_BUILD`` overrides it) and Go's
own module and build caches. Nothing is installed by hand; once built on the machine, a build
costs seconds. ``make liftbridge`` runs the same build.

``LiftbridgeServer`` starts that server on 127.0.0.1 (free ports for its API and its embedded
NATS) from a configuration written into a fresh temporary directory (data directory, NATS
configuration and log inside), waits for its metadata-leader line (bounded), and always stops it
by PID (SIGINT, its graceful stop; SIGKILL after a time-out) and removes the directory.

``measure`` runs the Liftbridge phases against a tidelog server and a Liftbridge server, each
phase on tidelog and then on Liftbridge, seconds apart (the machine is shared and its load moves;
pairing keeps that out of the ratios), ``rounds`` times on fresh streams of one partition:

- ``publish_leader`` / ``publish_all``: the Go client's ``PublishAsync``, ack LEADER and ack
  ALL, ``publish_messages`` random payloads of ``size`` bytes, a window of ``window`` permits
  (go-liftbridge has none of its own), every ack checked (offsets 0..N-1 once each).
- ``catchup``: a stream filled with ``catchup_messages`` messages (tidelog through its batched
  ``publish_batch``, Liftbridge through ``PublishAsync``: its one publish path; the fill is not
  the measure), then read from the earliest offset by the Go client's ``Subscribe``, every
  offset checked in order.
- ``live``: the Go client's ``Subscribe`` from new messages only while ``live_rate`` msgs/s are
  published on an absolute 1 ms clock for ``live_warmup`` + ``live_seconds`` seconds (the
  warm-up not counted), each payload carrying its send time; latency = receive time - send
  time. With ``live_publisher="native"`` (default) each server gets its fast publish path at
  that rate: tidelog's ``PublishStream`` in requests of ``live_batch`` messages (the paced
  publisher of ``e2e_throughput.py``), Liftbridge the Go client's ``PublishAsync``; with ``go``
  both get ``PublishAsync`` (tidelog's does not keep up with 10,000 msgs/s: the grpcio cost
  per message, docs/performance.md).

Every record has the load average before and after, the CPU seconds of the server and of the
driver. ``summary`` turns the rounds into ``vs_liftbridge_publish_async``,
``vs_liftbridge_catchup`` and ``vs_liftbridge_live_p99``: tidelog over Liftbridge for rates,
Liftbridge's p99 over tidelog's for latency (so >= 1 means tidelog is at least as good
everywhere), medians of the rounds' ratios, with both sides' numbers beside them.

    python benchmarks/liftbridge_side.py build [--build-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidelog.client.aio import AsyncClient
from tidelog.process import free_port

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # processes.py beside this file, however it was loaded
    sys.path.insert(0, str(BENCH_DIR))

from processes import ServerProcess  # noqa: E402

GO_MODULE = BENCH_DIR / "go"
LIFTBRIDGE_PACKAGE = "github.com/liftbridge-io/liftbridge"
BUILD_ENV = "TIDELOG_GO_BUILD"
BUILD_TIMEOUT = 1800.0
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
LEADER_LINE = "Server became metadata leader"
FILL_BATCH = 1_000
DRAIN_S = 10.0  # the driver's own bound on the last live messages
SAFETY = 60.0

LivePublisher = Callable[[dict[str, Any]], list[str]]
"""The argv of tidelog's paced live publisher for one configuration (``e2e_throughput.py``'s
``--live-publisher``); it prints a JSON report with ``sent`` and ``warmup`` last."""


class GoBuildError(RuntimeError):
    """Go is missing, or ``go build`` of the driver or of Liftbridge's server failed."""


class DriverError(RuntimeError):
    """The Go driver failed or its output was not the JSON report."""


@dataclass(frozen=True)
class Binaries:
    driver: Path
    liftbridge: Path
    go_version: str
    build_seconds: float


@dataclass(frozen=True)
class Target:
    """One server under test."""

    name: str
    address: str
    pid: int


@dataclass(frozen=True)
class Settings:
    publish_messages: int = 200_000
    window: int = 1_000
    catchup_messages: int = 1_000_000
    size: int = 100
    live_rate: int = 10_000
    live_batch: int = 10
    live_seconds: float = 5.0
    live_warmup: float = 0.5
    live_publisher: str = "native"  # or "go"
    rounds: int = 1
    timeout: float = 300.0  # per driver run


def default_build_dir() -> Path:
    return Path(os.environ.get(BUILD_ENV) or BENCH_DIR.parent / "build" / "go")


def go_binary() -> str:
    found = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise GoBuildError("no `go` on PATH: install Go 1.24 or newer (Debian: golang-go)")
    return found


def build(build_dir: Path | None = None, timeout: float = BUILD_TIMEOUT) -> Binaries:
    """``go build`` the driver and Liftbridge's server into ``build_dir/bin``, fetching the
    modules through the Go module proxy the first time. The module and build caches are Go's
    own (``go env GOMODCACHE``, ``GOCACHE``, under the user's home), so a fresh checkout — the
    CI's clean clone — builds in seconds once any checkout on the machine has built."""
    root = (build_dir or default_build_dir()).resolve()
    go = go_binary()
    env = {
        **os.environ,
        "GOBIN": str(root / "bin"),
        # no flag of the caller's go env leaks in
        "GOFLAGS": "-modcacherw -buildvcs=false -mod=readonly",
    }
    driver, liftbridge = root / "bin" / "lbbench", root / "bin" / "liftbridge"
    start = time.perf_counter()
    for output, package in ((driver, "./lbbench"), (liftbridge, LIFTBRIDGE_PACKAGE)):
        try:
            done = subprocess.run(
                [go, "build", "-o", str(output), package],
                cwd=GO_MODULE,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise GoBuildError(f"go build {package}: over {timeout:.0f} s") from exc
        if done.returncode != 0:
            raise GoBuildError(f"go build {package} failed:\n{done.stderr[-3000:]}")
    version = subprocess.run(
        [go, "version"], capture_output=True, text=True, timeout=60, check=False, env=env
    ).stdout.strip()
    return Binaries(driver, liftbridge, version, round(time.perf_counter() - start, 1))


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LiftbridgeServer(ServerProcess):
    """Liftbridge's server with its embedded NATS on 127.0.0.1, in a temporary directory; a
    context manager (``processes.ServerProcess``) that always stops it by PID (SIGINT:
    Liftbridge's graceful stop, which exits 0; SIGTERM ends it with 1) and removes the
    directory."""

    stop_signal = signal.SIGINT
    stop_timeout = STOP_TIMEOUT

    def __init__(self, binary: Path) -> None:
        super().__init__()
        self.binary = binary

    def start(self) -> None:
        directory = self.make_directory("e2e-liftbridge-")
        self.port, nats_port = free_port(), free_port()
        nats_conf = directory / "nats.conf"
        nats_conf.write_text(f"listen: 127.0.0.1:{nats_port}\n")
        config = directory / "liftbridge.yaml"
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"data.dir: {directory / 'data'}\n"
            "logging.level: info\n"
            "nats:\n"
            f"  embedded.config: {nats_conf}\n"
            f"  servers: ['nats://127.0.0.1:{nats_port}']\n"
            "clustering:\n"
            "  server.id: bench\n"
            "  raft.bootstrap.seed: true\n"
        )
        log = directory / "server.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if LEADER_LINE in self.log_tail(100_000):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"liftbridge did not become ready: {self.log_tail()}")


def run_driver(
    binary: Path, mode: str, target: Target, *flags: str, timeout: float
) -> dict[str, Any]:
    """One driver run; its last stdout line, parsed."""
    argv = [str(binary), mode, "-addr", target.address, *flags, "-timeout", f"{timeout:.0f}s"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + SAFETY)
    except subprocess.TimeoutExpired as exc:
        raise DriverError(f"{' '.join(argv)}: no end after {timeout + SAFETY:.0f} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise DriverError(f"{' '.join(argv)}: rc {done.returncode}: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


async def _fill_tidelog(address: str, stream: str, payloads: Sequence[bytes]) -> None:
    async with AsyncClient(address) as client:
        for start in range(0, len(payloads), FILL_BATCH):
            await client.publish_batch(stream, payloads[start : start + FILL_BATCH])


def _live_external(
    binary: Path, target: Target, stream: str, argv: list[str], s: Settings
) -> dict[str, Any]:
    """The driver subscribes; another process (tidelog's paced publisher) publishes."""
    driver_argv = [str(binary), "live", "-addr", target.address, "-stream", stream]
    driver_argv += ["-timeout", f"{s.timeout:.0f}s"]
    driver = subprocess.Popen(
        driver_argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdin is not None and driver.stdout is not None
        ready = driver.stdout.readline()
        if not ready.startswith('{"ready"'):
            raise DriverError(f"live driver not ready: {ready!r}")
        publisher = subprocess.run(
            argv, capture_output=True, text=True, timeout=s.timeout + SAFETY, check=False
        )
        if publisher.returncode != 0:
            raise DriverError(
                f"live publisher rc {publisher.returncode}: {publisher.stderr[-2000:]}"
            )
        report = json.loads(publisher.stdout.strip().splitlines()[-1])
        out, err = driver.communicate(
            f"{report['sent']} {report['warmup']}\n", timeout=DRAIN_S + SAFETY
        )
        if driver.returncode != 0:
            raise DriverError(f"live driver rc {driver.returncode}: {err[-2000:]}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result["publisher"] = report
        return result
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


class _Round:
    """One round of the paired phases; ``records[phase][side]``."""

    def __init__(
        self,
        number: int,
        sides: tuple[Target, Target],
        binaries: Binaries,
        s: Settings,
        payloads: Sequence[bytes],
        live_publisher: LivePublisher,
    ) -> None:
        self.number, self.sides, self.binaries, self.s = number, sides, binaries, s
        self.payloads, self.live_publisher = payloads, live_publisher
        self.records: dict[str, dict[str, Any]] = {}

    def driver(self, mode: str, target: Target, *flags: str) -> dict[str, Any]:
        return run_driver(self.binaries.driver, mode, target, *flags, timeout=self.s.timeout)

    def timed(
        self, phase: str, target: Target, work: Callable[..., dict[str, Any]], *args: Any
    ) -> dict[str, Any]:
        """``work(*args)``'s record with the server's CPU seconds and the load around it."""
        before, cpu = _loadavg(), _cpu_seconds(target.pid)
        record = work(*args)
        after = _cpu_seconds(target.pid)
        record["server_cpu_s"] = None if cpu is None or after is None else round(after - cpu, 3)
        record["loadavg_before"], record["loadavg_after"] = before, _loadavg()
        self.records.setdefault(phase, {})[target.name] = record
        return record

    def stream(self, target: Target, phase: str) -> str:
        name = f"lb{self.number}-{phase}"
        self.driver("create", target, "-stream", name)
        return name

    def run(self) -> dict[str, dict[str, Any]]:
        s = self.s
        for ack in ("leader", "all"):
            for target in self.sides:
                stream = self.stream(target, f"async-{ack}")
                flags = ["-stream", stream, "-count", str(s.publish_messages), "-ack", ack]
                flags += ["-size", str(s.size), "-window", str(s.window)]
                self.timed(f"publish_{ack}", target, self.driver, "publish", target, *flags)
        n = min(s.catchup_messages, len(self.payloads))
        for target in self.sides:
            stream = self.stream(target, "catchup")
            fill_start = time.perf_counter()
            if target.name == "tidelog":
                asyncio.run(_fill_tidelog(target.address, stream, self.payloads[:n]))
            else:
                flags = ["-stream", stream, "-count", str(n), "-size", str(s.size)]
                self.driver("publish", target, *flags, "-window", str(s.window))
            fill_s = round(time.perf_counter() - fill_start, 3)
            flags = ["-stream", stream, "-count", str(n)]
            self.timed("catchup", target, self.driver, "catchup", target, *flags)["fill_s"] = fill_s
        for target in self.sides:
            self.timed("live", target, self.live, target, self.stream(target, "live"))
        return self.records

    def live(self, target: Target, stream: str) -> dict[str, Any]:
        s = self.s
        if target.name == "tidelog" and s.live_publisher == "native":
            config = {
                "address": target.address,
                "stream": stream,
                "size": max(s.size, 16),
                "rate": s.live_rate,
                "batch": s.live_batch,
                "seconds": s.live_seconds,
                "warmup_seconds": s.live_warmup,
                "timeout": s.timeout,
            }
            argv = self.live_publisher(config)
            result = _live_external(self.binaries.driver, target, stream, argv, s)
            result["publish_method"] = f"tidelog PublishStream, {s.live_batch} per request"
            return result
        flags = ["-stream", stream, "-publish", "-rate", str(s.live_rate), "-size", str(s.size)]
        flags += ["-seconds", str(s.live_seconds), "-warmup", str(s.live_warmup)]
        result = self.driver("live", target, *flags, "-window", str(s.window))
        result["publish_method"] = "go-liftbridge PublishAsync, ack LEADER"
        return result


def measure(
    tidelog: Target,
    liftbridge: Target,
    binaries: Binaries,
    settings: Settings,
    payloads: Sequence[bytes],
    live_publisher: LivePublisher,
) -> dict[str, Any]:
    """The paired phases, ``settings.rounds`` times; every record of every round."""
    rounds = [
        _Round(number, (tidelog, liftbridge), binaries, settings, payloads, live_publisher).run()
        for number in range(settings.rounds)
    ]
    return {
        "settings": asdict(settings),
        "go": binaries.go_version,
        "build_seconds": binaries.build_seconds,
        "versions": {"liftbridge": "v1.9.0", "go-liftbridge": "v2.3.0"},
        "rounds": rounds,
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _paired(rounds: list[dict[str, Any]], phase: str, key: str, invert: bool) -> dict[str, Any]:
    """Both sides' medians of ``key`` and the median of the rounds' ratios: tidelog over
    Liftbridge, or Liftbridge over tidelog when ``invert`` (latency: lower is better)."""
    ratios: list[float | None] = []
    for r in rounds:
        ours, theirs = r[phase]["tidelog"].get(key), r[phase]["liftbridge"].get(key)
        a, b = (theirs, ours) if invert else (ours, theirs)
        ratios.append(a / b if a is not None and b else None)
    return {
        "value": _median(ratios),
        "tidelog": _median([r[phase]["tidelog"].get(key) for r in rounds]),
        "liftbridge": _median([r[phase]["liftbridge"].get(key) for r in rounds]),
    }


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The three ``vs_liftbridge_*`` keys of the report (see the module's docstring)."""
    rounds = record["rounds"]

    def rates(phase: str) -> dict[str, Any]:
        p = _paired(rounds, phase, "msgs_per_s", invert=False)
        return {
            "value": p["value"],
            "tidelog_msgs_per_s": p["tidelog"],
            "liftbridge_msgs_per_s": p["liftbridge"],
        }

    catchup = rates("catchup")
    p99 = _paired(rounds, "live", "p99_ms", invert=True)
    p50 = _paired(rounds, "live", "p50_ms", invert=True)
    settings = record["settings"]
    return {
        "vs_liftbridge_publish_async": {
            "ack_leader": rates("publish_leader"),
            "ack_all": rates("publish_all"),
            "target": "none: reported as it is (docs/performance.md)",
            "messages": settings["publish_messages"],
        },
        "vs_liftbridge_catchup": {
            **catchup,
            "target": ">= 1",
            "met": catchup["value"] is not None and catchup["value"] >= 1,
            "messages": min(settings["catchup_messages"], rounds[0]["catchup"]["tidelog"]["count"]),
        },
        "vs_liftbridge_live_p99": {
            "value": p99["value"],
            "target": ">= 1 (Liftbridge's p99 over tidelog's)",
            "met": p99["value"] is not None and p99["value"] >= 1,
            "tidelog_p99_ms": p99["tidelog"],
            "liftbridge_p99_ms": p99["liftbridge"],
            "tidelog_p50_ms": p50["tidelog"],
            "liftbridge_p50_ms": p50["liftbridge"],
            "rate_msgs_per_s": settings["live_rate"],
            "publishers": {
                side: rounds[0]["live"][side]["publish_method"]
                for side in ("tidelog", "liftbridge")
            },
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=("build",))
    parser.add_argument("--build-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    binaries = build(args.build_dir)
    print(json.dumps({k: str(v) for k, v in asdict(binaries).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
