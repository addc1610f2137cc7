#!/usr/bin/env python3
"""Peer brokers on loopback: Redis Streams and NATS JetStream, measured with the same messages.

Each broker is started by this harness as a subprocess on 127.0.0.1 on a free port with its data
in a fresh temporary directory, waited for (bounded), and always stopped by PID (SIGTERM, then
SIGKILL after a timeout) with the directory removed, also when a phase fails. The same N random
payloads of S bytes (generated once, all distinct) go to both brokers.

Redis (``redis-server --appendonly yes --appendfsync everysec --save ''``), one redis-py
connection, hiredis parser:

- ``publish_msgs_per_s``: XADD ``{v: payload}`` with auto IDs, pipelined in batches of 1,000.
- ``read_msgs_per_s``: XRANGE in chunks of 1,000, each continuing from the exclusive ``(id`` of
  the last entry read.
- ``c_client_publish_msgs_per_s``: the server's XADD ceiling through Redis's own C client, on a
  second fresh server: ``redis-benchmark -c 1 -n N -P 1000 -q -x XADD bench '*' v`` with the
  first payload on stdin (``-x``). Every request carries that same value: Redis 7.0's
  redis-benchmark has no per-request data placeholder (``__data__`` is sent literally).

NATS (``nats-server -js``, file storage), one nats-py connection:

- ``publish_msgs_per_s``: ``js.publish_async`` in windows of 1,000; every PubAck of a window is
  awaited before the next window, and an error ack fails the run.
- ``read_msgs_per_s``: an ordered push consumer (``js.subscribe(..., ordered_consumer=True)``,
  callback) reading all N messages, timed from the subscribe call.

Every phase is bounded by count and by ``--timeout`` seconds: on time-out the partial rate is
reported with ``"timed_out": true`` and the phase's name in ``"timed_out_phases"``.

Install (Debian 12; versions measured: redis-server/redis-tools 5:7.0.15-1~deb12u10,
nats-server 2.9.10-1+b3, redis 8.1.0, hiredis 3.5.0, nats-py 2.16.0)::

    apt-get update
    apt-get install -y --no-install-recommends redis-server redis-tools nats-server
    .venv/bin/python -m pip install 'redis[hiredis]==8.1.0' 'hiredis==3.5.0' 'nats-py==2.16.0'

Debian's redis-server package does not start a service in a container without systemd; if one
runs, it listens on 6379, which this harness never uses. ``nats-server`` is in /usr/sbin.

Usage (prints one JSON object)::

    python benchmarks/peers.py [--messages 1000000] [--size 100] [--only redis|nats]
                               [--timeout 300]

From another script, with benchmarks/ on sys.path::

    from peers import make_payloads, measure_nats, measure_redis
    payloads = make_payloads(1_000_000, 100)
    redis_result, nats_result = measure_redis(payloads), measure_nats(payloads)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # processes.py beside this file, however it was loaded
    sys.path.insert(0, str(BENCH_DIR))

from processes import ServerProcess  # noqa: E402

DEFAULT_MESSAGES = 1_000_000
DEFAULT_SIZE = 100
DEFAULT_TIMEOUT = 300.0  # seconds per phase
BATCH = 1_000
STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0

INSTALL_HINT = (
    "run the peers install step: `apt-get update && apt-get install -y --no-install-recommends "
    "redis-server redis-tools nats-server` and `.venv/bin/python -m pip install "
    "'redis[hiredis]==8.1.0' 'hiredis==3.5.0' 'nats-py==2.16.0'` (see benchmarks/peers.py)"
)

REDIS_STREAM = "bench"
NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.msgs"


class PeerNotInstalledError(RuntimeError):
    """A server binary or client library the harness needs is missing."""


def make_payloads(messages: int, size: int) -> list[bytes]:
    """``messages`` distinct random payloads of ``size`` bytes (one ``os.urandom`` call)."""
    blob = os.urandom(messages * size)
    return [blob[i * size : (i + 1) * size] for i in range(messages)]


def find_binary(name: str) -> str:
    """Absolute path of ``name``: PATH first, then the sbin/bin directories Debian uses."""
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise PeerNotInstalledError(f"{name} not found: {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server may still lose a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (a reaped child's PID does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if count > 0 and seconds > 0 else 0.0


class Server(ServerProcess):
    """A broker subprocess on 127.0.0.1 with its own temporary data directory.

    Use as a context manager (``processes.ServerProcess``): entering starts it and waits until its
    port accepts connections (bounded by ``STARTUP_TIMEOUT``); leaving stops it by PID and
    removes the directory, whatever happened in between. ``command(port, directory)`` builds the
    argv.
    """

    stop_timeout = STOP_TIMEOUT

    def __init__(self, name: str, binary: str, command: Any, attempts: int = 3) -> None:
        super().__init__()
        self.name = name
        self.binary = binary
        self.command = command
        self.attempts = attempts

    def start(self) -> None:
        directory = self.make_directory(f"peers-{self.name}-")
        data = directory / "data"
        data.mkdir()
        last_error = ""
        for _ in range(self.attempts):
            self.port = free_port()
            self._log = open(directory / "server.log", "wb")  # noqa: SIM115 - closed in stop
            self.proc = subprocess.Popen(
                [self.binary, *self.command(self.port, data)],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches us, and we stop the server by PID
            )
            self.pid = self.proc.pid
            if self._wait_ready():
                return
            last_error = self.log_tail()
            self.stop_process()  # lost the port race or failed: try another port
        raise RuntimeError(f"{self.name} did not become ready: {last_error}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self.proc.poll() is None
            except OSError:
                time.sleep(0.02)
        return False


def redis_server() -> Server:
    def command(port: int, directory: Path) -> list[str]:
        return [
            "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--daemonize", "no", "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--dir", str(directory),
        ]  # fmt: skip

    return Server("redis", find_binary("redis-server"), command)


def nats_server() -> Server:
    def command(port: int, directory: Path) -> list[str]:
        return ["-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(directory), "-n", "peers"]

    return Server("nats", find_binary("nats-server"), command)


# ---------------------------------------------------------------------------------------------
# Redis Streams


def _redis_client(port: int, timeout: float) -> Any:
    try:
        import redis
    except ImportError as e:
        raise PeerNotInstalledError(f"redis-py missing: {INSTALL_HINT}") from e
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        # a safety net against a hung server, not the phase limit (a batch may take a while)
        socket_timeout=max(timeout, 30.0),
        socket_connect_timeout=5,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:  # the port accepts before Redis has loaded its AOF
        try:
            client.ping()
            return client
        except redis.exceptions.BusyLoadingError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def redis_publish(
    client: Any, payloads: Sequence[bytes], timeout: float, batch: int = BATCH
) -> dict[str, Any]:
    """XADD every payload, pipelined in batches; stops early at ``timeout`` seconds."""
    n = len(payloads)
    done = 0
    timed_out = False
    pipe = client.pipeline(transaction=False)
    start = time.perf_counter()
    deadline = start + timeout
    while done < n:
        if time.perf_counter() >= deadline:
            timed_out = True
            break
        for payload in payloads[done : done + batch]:
            pipe.xadd(REDIS_STREAM, {"v": payload})
        ids = pipe.execute()
        done += len(ids)
    seconds = time.perf_counter() - start
    return {"count": done, "seconds": seconds, "timed_out": timed_out}


def redis_read(client: Any, expected: int, timeout: float, batch: int = BATCH) -> dict[str, Any]:
    """XRANGE the whole stream in chunks, each from the exclusive ``(id`` of the last entry."""
    done = 0
    nbytes = 0
    timed_out = False
    first: bytes | None = None
    last: bytes | None = None
    low = "-"
    start = time.perf_counter()
    deadline = start + timeout
    while done < expected:
        if time.perf_counter() >= deadline:
            timed_out = True
            break
        entries = client.xrange(REDIS_STREAM, min=low, max="+", count=batch)
        if not entries:
            break
        for _, fields in entries:
            nbytes += len(fields[b"v"])
        done += len(entries)
        if first is None:
            first = entries[0][1][b"v"]
        last = entries[-1][1][b"v"]
        low = "(" + entries[-1][0].decode()
    seconds = time.perf_counter() - start
    return {
        "count": done,
        "bytes": nbytes,
        "seconds": seconds,
        "timed_out": timed_out,
        "first": first,
        "last": last,
    }


def redis_benchmark_xadd(
    port: int, payload: bytes, messages: int, timeout: float, client: Any
) -> dict[str, Any]:
    """``redis-benchmark`` (C client, 1 connection, pipeline 1000) XADDing ``payload`` N times."""
    binary = find_binary("redis-benchmark")
    argv = [
        binary, "-h", "127.0.0.1", "-p", str(port), "-c", "1", "-n", str(messages),
        "-P", str(BATCH), "-q", "-x", "XADD", REDIS_STREAM, "*", "v",
    ]  # fmt: skip
    start = time.perf_counter()
    # start_new_session: on time-out it is killed by PID like the servers
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    out = err = b""
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=STOP_TIMEOUT)
    seconds = time.perf_counter() - start
    count = int(client.xlen(REDIS_STREAM))
    text = out.decode(errors="replace")
    rates = re.findall(r"([0-9]+(?:\.[0-9]+)?) requests per second", text)
    if not timed_out and (proc.returncode != 0 or not rates):
        raise RuntimeError(
            f"redis-benchmark failed (rc {proc.returncode}): {text[-500:]!r} "
            f"{err.decode(errors='replace')[-500:]!r}"
        )
    # on time-out, the partial rate: what the server stored in the time allowed
    rate = _rate(count, seconds) if timed_out or not rates else float(rates[-1])
    return {"count": count, "seconds": seconds, "timed_out": timed_out, "rate": rate}


def measure_redis(
    payloads: Sequence[bytes], *, timeout: float = DEFAULT_TIMEOUT, c_client: bool = True
) -> dict[str, Any]:
    """Redis Streams on two fresh servers: redis-py XADD + XRANGE, then redis-benchmark XADD."""
    n = len(payloads)
    result: dict[str, Any] = {"messages": n}
    timed_out_phases: list[str] = []
    pids: list[int] = []
    with redis_server() as server:
        pids.append(server.pid)
        client = _redis_client(server.port, timeout)
        try:
            result["server_version"] = client.info("server")["redis_version"]
            pub = redis_publish(client, payloads, timeout)
            if pub["timed_out"]:
                timed_out_phases.append("publish")
            xlen = int(client.xlen(REDIS_STREAM))
            if xlen != pub["count"]:
                raise RuntimeError(f"XLEN {xlen} after {pub['count']} acknowledged XADDs")
            read = redis_read(client, pub["count"], timeout)
            if read["timed_out"]:
                timed_out_phases.append("read")
            _check_read("redis", read, payloads, pub["count"])
        finally:
            client.close()
    result.update(
        publish_msgs_per_s=_rate(pub["count"], pub["seconds"]),
        read_msgs_per_s=_rate(read["count"], read["seconds"]),
        published=pub["count"],
        read=read["count"],
        publish_seconds=round(pub["seconds"], 3),
        read_seconds=round(read["seconds"], 3),
    )
    if c_client and n:
        with redis_server() as server:
            pids.append(server.pid)
            client = _redis_client(server.port, timeout)
            try:
                bench = redis_benchmark_xadd(server.port, payloads[0], n, timeout, client)
            finally:
                client.close()
        if bench["timed_out"]:
            timed_out_phases.append("c_client_publish")
        result.update(
            c_client_publish_msgs_per_s=bench["rate"],
            c_client_published=bench["count"],
            c_client_seconds=round(bench["seconds"], 3),
        )
    result.update(
        timed_out=bool(timed_out_phases),
        timed_out_phases=timed_out_phases,
        server_pids=pids,
        batch=BATCH,
        config="appendonly yes, appendfsync everysec, save ''",
    )
    return result


def _check_read(name: str, read: dict[str, Any], payloads: Sequence[bytes], expected: int) -> None:
    """Outside the timed loop: the right number of bytes, first and last payloads in order."""
    if read["timed_out"]:
        return
    if read["count"] != expected:
        raise RuntimeError(f"{name}: read {read['count']} messages, expected {expected}")
    if expected == 0:
        return
    size = len(payloads[0])
    if read["bytes"] != expected * size:
        raise RuntimeError(f"{name}: read {read['bytes']} bytes, expected {expected * size}")
    if read["first"] != payloads[0] or read["last"] != payloads[expected - 1]:
        raise RuntimeError(f"{name}: first/last message read differ from those published")


# ---------------------------------------------------------------------------------------------
# NATS JetStream


async def _nats_phases(port: int, payloads: Sequence[bytes], timeout: float) -> dict[str, Any]:
    try:
        import nats
        from nats.js.api import StorageType, StreamConfig
    except ImportError as e:
        raise PeerNotInstalledError(f"nats-py missing: {INSTALL_HINT}") from e

    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(repr(e))

    nc = await nats.connect(
        f"nats://127.0.0.1:{port}",
        connect_timeout=5,
        allow_reconnect=False,
        error_cb=on_error,
    )
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(
            StreamConfig(
                name=NATS_STREAM,
                subjects=["bench.>"],
                storage=StorageType.FILE,
                num_replicas=1,
                allow_direct=True,
            )
        )

        # Acked publishes: a window of publish_async, then every PubAck of it awaited.
        n = len(payloads)
        acked = 0
        last_seq = 0
        pub_timed_out = False
        start = time.perf_counter()
        deadline = start + timeout
        while acked < n:
            if time.perf_counter() >= deadline:
                pub_timed_out = True
                break
            futures = [
                await js.publish_async(NATS_SUBJECT, p) for p in payloads[acked : acked + BATCH]
            ]
            remaining = max(deadline - time.perf_counter(), 0.001)
            done, pending = await asyncio.wait(futures, timeout=remaining)
            for f in pending:
                f.cancel()
            for f in futures:
                if f not in done:
                    break
                exc = f.exception()
                if exc is not None:
                    raise RuntimeError(f"JetStream refused a publish: {exc!r}")
                ack = f.result()
                acked += 1
                last_seq = max(last_seq, ack.seq)
            if pending:
                pub_timed_out = True
                break
        pub_seconds = time.perf_counter() - start

        info = await js.stream_info(NATS_STREAM)
        stored = int(info.state.messages)
        if not pub_timed_out and (stored != acked or last_seq != acked):
            raise RuntimeError(f"JetStream stores {stored} (last seq {last_seq}), acked {acked}")

        # Ordered push consumer, callback: all stored messages, in order.
        expected = stored
        state: dict[str, Any] = {"count": 0, "bytes": 0, "first": None, "last": None}
        finished = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            state["count"] += 1
            state["bytes"] += len(msg.data)
            if state["first"] is None:
                state["first"] = msg.data
            if state["count"] >= expected:
                state["last"] = msg.data
                finished.set()

        read_timed_out = False
        start = time.perf_counter()
        if expected:
            sub = await js.subscribe(NATS_SUBJECT, cb=on_msg, ordered_consumer=True)
            try:
                await asyncio.wait_for(finished.wait(), timeout)
            except TimeoutError:
                read_timed_out = True
            read_seconds = time.perf_counter() - start
            await sub.unsubscribe()
        else:
            read_seconds = 0.0
        read = {**state, "seconds": read_seconds, "timed_out": read_timed_out}
        if not pub_timed_out:
            _check_read("nats", read, payloads, expected)
        return {
            "published": acked,
            "publish_seconds": pub_seconds,
            "publish_timed_out": pub_timed_out,
            "read": read["count"],
            "read_seconds": read_seconds,
            "read_timed_out": read_timed_out,
            "client_errors": errors,
        }
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 10)


def measure_nats(payloads: Sequence[bytes], *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """NATS JetStream (file storage) on a fresh server: acked async publishes, ordered consumer.

    Runs its own event loop (``asyncio.run``): call it from synchronous code.
    """
    with nats_server() as server:
        pid = server.pid
        phases = asyncio.run(_nats_phases(server.port, payloads, timeout))
    timed_out_phases = [p for p in ("publish", "read") if phases[f"{p}_timed_out"]]
    return {
        "messages": len(payloads),
        "publish_msgs_per_s": _rate(phases["published"], phases["publish_seconds"]),
        "read_msgs_per_s": _rate(phases["read"], phases["read_seconds"]),
        "published": phases["published"],
        "read": phases["read"],
        "publish_seconds": round(phases["publish_seconds"], 3),
        "read_seconds": round(phases["read_seconds"], 3),
        "timed_out": bool(timed_out_phases),
        "timed_out_phases": timed_out_phases,
        "client_errors": phases["client_errors"],
        "server_pids": [pid],
        "window": BATCH,
        "config": "file storage, 1 replica, limits retention, ordered push consumer",
    }


# ---------------------------------------------------------------------------------------------


def _binary_version(name: str, args: list[str]) -> str | None:
    try:
        out = subprocess.run(
            [find_binary(name), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (PeerNotInstalledError, OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"v=?([0-9][0-9.]*)", out.stdout + out.stderr)
    return match.group(1) if match else (out.stdout + out.stderr).strip() or None


def _deb_version(package: str) -> str | None:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {
        "redis_server": _binary_version("redis-server", ["--version"]),
        "redis_server_deb": _deb_version("redis-server"),
        "nats_server": _binary_version("nats-server", ["--version"]),
        "nats_server_deb": _deb_version("nats-server"),
        "redis_py": _dist_version("redis"),
        "hiredis": _dist_version("hiredis"),
        "nats_py": _dist_version("nats-py"),
        "python": platform.python_version(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--only", choices=("redis", "nats"))
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per phase (default 300)"
    )
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 1:
        parser.error("--messages and --size must be positive")

    payloads = make_payloads(args.messages, args.size)
    out: dict[str, Any] = {"messages": args.messages, "message_bytes": args.size}
    if args.only in (None, "redis"):
        start = time.perf_counter()
        out["redis"] = measure_redis(payloads, timeout=args.timeout)
        out["redis"]["wall_seconds"] = round(time.perf_counter() - start, 3)
    if args.only in (None, "nats"):
        start = time.perf_counter()
        out["nats"] = measure_nats(payloads, timeout=args.timeout)
        out["nats"]["wall_seconds"] = round(time.perf_counter() - start, 3)
    out["versions"] = versions()
    out["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
