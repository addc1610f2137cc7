#!/usr/bin/env python3
"""Isolation: what idle subscribers, vanishing clients, many streams and an outage cost.

Every part starts its own ``tidelog serve`` (``tidelog.process.ServerProcess``: 127.0.0.1, a
free port, metrics off, a fresh temporary data directory) and always stops it by PID. Parts
(``--only`` runs some of them; all by default):

- ``idle``: a fast publisher (``tidelog.Client.publish_batch``, ``tidelog.v1/PublishBatch``,
  1,000 messages of 1 KiB per call, every ack awaited) publishes for ``--seconds`` into one
  stream that already holds ``--prefill-mb`` of data, first with no subscriber
  (``publish_mb_s_0``), then with ``--subscribers`` idle ones (``publish_mb_s_500``). An idle
  subscriber is a raw ``proto.API/Subscribe`` from EARLIEST on that stream, one connection each,
  opened in a separate client process that reads the handshake and then never reads again.
  Such a subscriber is not idle at once: until its client's HTTP/2 flow-control window is full
  (a few MiB, which gRPC clients grow whether or not their application reads) the server keeps
  sending it the stream's history. So the crowded publish runs twice: right after the
  subscribers open, while the windows fill (``publish_mb_s_500_filling``,
  ``idle_subscribers_publish_ratio_filling``), and once the server has gone quiet, the windows
  full (``publish_mb_s_500``; at most ``--settle-max-s`` of waiting, ``details.idle.
  windows_filled``). ``idle_subscribers_publish_ratio`` is the quotient of the latter and
  ``publish_mb_s_0`` (the publisher alone, before the subscribers open and again after they
  are gone, averaged; target >= 0.8: an idle subscriber costs nothing per published message),
  and ``idle_subscribers_rss_mb`` the server's highest VmRSS while the idle subscribers were
  open, filling included (target <= 300).
- ``churn``: ``--churn-rounds`` rounds of ``--churn-clients`` client processes, each starting a
  Subscribe from EARLIEST and a PublishAsync call that keeps publishing, all killed with SIGKILL
  mid-stream. ``churn_rss_growth_mb`` is the server's VmRSS after the last round (and a settling
  pause) minus before the first; ``details.churn`` has the per-round RSS.
- ``fds``: ``--streams`` streams (2,000) of 20 sealed segments each (4 KiB segments, one 4 KiB
  message per publish, so every publish rolls; the data directory is on /dev/shm when there is
  one, since only descriptors are counted), then the server is restarted;
  ``fds_2000_streams`` is the highest count of ``/proc/<pid>/fd`` after the restart and after
  reading every stream once from its oldest to its newest message (target <= 1,100). With
  another ``--streams`` the key is null and the counts are in ``details.fds``.
- ``reconnect``: a ``tidelog.Client`` talks to the server, the server is stopped for
  ``--outage-s`` (5) seconds and started again on the same port, while the client calls
  ``list_streams`` every 20 ms; ``reconnect_s`` is the time from the server's ready line to the
  first call that succeeds (target <= 0.5).

``load_average`` holds ``/proc/loadavg`` before and after; the machine is shared: rerun when it
is loaded. Every wait is bounded by count and time.

    python benchmarks/isolation.py [--quick] [--only idle,churn,fds,reconnect]
        [--subscribers 500] [--seconds 10] [--prefill-mb 8] [--streams 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from tidelog import Client
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client.aio import AsyncClient
from tidelog.process import ServerProcess

PARTS = ("idle", "churn", "fds", "reconnect")
MESSAGE_BYTES = 1024
BATCH = 1000
READY_TIMEOUT_S = 120.0
FD_SEGMENTS = 20
FD_SEGMENT_BYTES = 4096


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(*extra: str, data_dir: Path | None = None) -> Iterator[ServerProcess]:
    with tempfile.TemporaryDirectory(prefix="tidelog-isolation-") as tmp:
        process = ServerProcess(data_dir or Path(tmp) / "data", *extra).start()
        try:
            yield process
        finally:
            try:
                process.stop(timeout=20)
            except Exception:
                process.kill()


def publish_for(client: Client, stream: str, seconds: float) -> dict[str, float]:
    payload = [os.urandom(MESSAGE_BYTES) for _ in range(BATCH)]
    sent = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        client.publish_batch(stream, payload, partition=0)
        sent += 1
    elapsed = time.perf_counter() - started
    return {"mb": sent * BATCH * MESSAGE_BYTES / 1e6, "seconds": round(elapsed, 2)}


# -- idle subscribers (a client process that opens them and never reads) ------------------------


async def _hold_idle(address: str, stream: str, count: int) -> None:
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(count)
    ]
    calls = [
        pb_grpc.APIStub(channel).Subscribe(
            pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST)
        )
        for channel in channels
    ]
    for call in calls:
        first = await call.read()
        assert first == pb.Message(), first  # the handshake; nothing is read after it
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed


def start_idle(address: str, stream: str, count: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--hold-idle", address, stream, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(READY_TIMEOUT_S)
    if not ready or not ready[0].startswith("ready"):
        process.kill()
        raise RuntimeError(f"idle subscribers did not open: {ready}")
    return process


def run_idle(args: argparse.Namespace) -> dict[str, Any]:
    stream = "isolation"
    with server() as srv, Client(srv.address) as client:
        client.create_stream(stream)
        prefill = [os.urandom(MESSAGE_BYTES) for _ in range(BATCH)]
        for _ in range(max(1, int(args.prefill_mb * 1e6 / (BATCH * MESSAGE_BYTES)))):
            client.publish_batch(stream, prefill, partition=0)
        rss_start = rss_mb(srv.pid)
        cpu = cpu_s(srv.pid)
        alone = publish_for(client, stream, args.seconds)
        cpu_alone = cpu_s(srv.pid) - cpu
        rss_alone = rss_mb(srv.pid)
        opened = time.perf_counter()
        holders = [
            start_idle(srv.address, stream, n)
            for n in _split(args.subscribers, args.idle_processes)
        ]
        open_s = time.perf_counter() - opened
        try:
            time.sleep(args.settle_s)
            rss_samples = [rss_mb(srv.pid) or 0.0]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.25):
                    rss_samples.append(rss_mb(srv.pid) or 0.0)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            cpu = cpu_s(srv.pid)
            filling = publish_for(client, stream, args.seconds)
            cpu_filling = cpu_s(srv.pid) - cpu
            fill_started = time.perf_counter()
            cpu = cpu_s(srv.pid)
            quiet = wait_quiet(srv.pid, args.settle_max_s)
            fill_s = time.perf_counter() - fill_started
            cpu_fill = cpu_s(srv.pid) - cpu
            cpu = cpu_s(srv.pid)
            crowded = publish_for(client, stream, args.seconds)
            cpu_crowded = cpu_s(srv.pid) - cpu
            time.sleep(args.settle_s)
            sampling.set()
            sampler.join()
            rss_samples.append(rss_mb(srv.pid) or 0.0)
        finally:
            for holder in holders:
                holder.kill()
                holder.wait(10)
        time.sleep(args.settle_s)
        rss_after_close = rss_mb(srv.pid)
        # Alone again, minutes later: the machine is shared, and the ratio should not hinge on
        # one sample of it.
        alone_after = publish_for(client, stream, args.seconds)
    rate_0 = (alone["mb"] + alone_after["mb"]) / (alone["seconds"] + alone_after["seconds"])
    rate_n = crowded["mb"] / crowded["seconds"]
    rate_filling = filling["mb"] / filling["seconds"]
    return {
        "publish_mb_s_0": round(rate_0, 1),
        "publish_mb_s_500": round(rate_n, 1),
        "idle_subscribers_publish_ratio": round(rate_n / rate_0, 3) if rate_0 else None,
        "publish_mb_s_500_filling": round(rate_filling, 1),
        "idle_subscribers_publish_ratio_filling": (
            round(rate_filling / rate_0, 3) if rate_0 else None
        ),
        "idle_subscribers_rss_mb": max(rss_samples),
        "details": {
            "subscribers": args.subscribers,
            "idle_processes": args.idle_processes,
            "prefill_mb": args.prefill_mb,
            "open_s": round(open_s, 2),
            "publish_alone": {**alone, "server_cpu_s": round(cpu_alone, 2)},
            "publish_alone_after": alone_after,
            "publish_while_filling": {**filling, "server_cpu_s": round(cpu_filling, 2)},
            "windows_filled": {
                "seconds_after_publish": round(fill_s, 1),
                "server_cpu_s": round(cpu_fill, 1),
                "quiet": quiet,
            },
            "publish_crowded": {**crowded, "server_cpu_s": round(cpu_crowded, 2)},
            "rss_mb": {
                "start": rss_start,
                "after_publish_alone": rss_alone,
                "idle_open_settled": rss_samples[0],
                "idle_open_max": max(rss_samples),
                "after_idle_closed": rss_after_close,
            },
        },
    }


def wait_quiet(pid: int, limit_s: float, *, window_s: float = 2.0, busy: float = 0.05) -> bool:
    """Wait until the server uses under ``busy`` CPU-seconds per second over ``window_s``: the
    idle subscribers' clients have stopped taking data (their flow-control windows are full).
    False when that did not happen within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_s(pid)
        time.sleep(window_s)
        if cpu_s(pid) - before < busy * window_s:
            return True
    return False


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- churn: clients killed mid-stream --------------------------------------------------------------


async def _churn_client(address: str, stream: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.APIStub(channel)
        subscribe = stub.Subscribe(pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST))
        await subscribe.read()
        payload = os.urandom(MESSAGE_BYTES)

        async def requests() -> Any:
            n = 0
            while True:
                n += 1
                yield pb.PublishRequest(
                    stream=stream, value=payload, ackPolicy=pb.LEADER, correlationId=str(n)
                )
                if n % 50 == 0:
                    await asyncio.sleep(0.001)

        publish = stub.PublishAsync(requests())
        await publish.read()
        print("ready", flush=True)
        await asyncio.sleep(3600)  # read nothing more: killed from outside


def run_churn(args: argparse.Namespace) -> dict[str, Any]:
    stream = "churn"
    rounds: list[dict[str, Any]] = []
    with server() as srv, Client(srv.address) as client:
        client.create_stream(stream)
        client.publish_batch(stream, [os.urandom(MESSAGE_BYTES)] * BATCH, partition=0)
        time.sleep(1.0)
        before = rss_mb(srv.pid) or 0.0
        for number in range(args.churn_rounds):
            clients = [
                subprocess.Popen(
                    [sys.executable, __file__, "--churn-client", srv.address, stream],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(args.churn_clients)
            ]
            deadline = time.monotonic() + 60
            for process in clients:
                assert process.stdout is not None
                while time.monotonic() < deadline and process.poll() is None:
                    if process.stdout.readline().startswith("ready"):
                        break
            time.sleep(0.3)  # mid-stream
            for process in clients:
                process.send_signal(signal.SIGKILL)
            for process in clients:
                process.wait(10)
            rounds.append({"round": number, "rss_mb": rss_mb(srv.pid), "load": loadavg()})
        time.sleep(args.settle_s)
        client.list_streams()
        after = rss_mb(srv.pid) or 0.0
    return {
        "churn_rss_growth_mb": round(after - before, 1),
        "details": {
            "rounds": args.churn_rounds,
            "clients_per_round": args.churn_clients,
            "rss_mb_before": before,
            "rss_mb_after": after,
            "per_round": rounds,
        },
    }


# -- descriptors of a server with many streams of many segments -----------------------------------


async def _fill_streams(address: str, streams: int) -> None:
    payload = os.urandom(FD_SEGMENT_BYTES - 256)
    gate = asyncio.Semaphore(32)
    async with AsyncClient(address) as client:

        async def fill(number: int) -> None:
            async with gate:
                name = f"fd-{number:05d}"
                await client.create_stream(name, segment_max_bytes=FD_SEGMENT_BYTES)
                for _ in range(FD_SEGMENTS + 1):  # every publish after the first rolls
                    await client.publish_batch(name, [payload], partition=0)

        await asyncio.gather(*(fill(n) for n in range(streams)))


async def _read_streams(address: str, streams: int) -> int:
    gate = asyncio.Semaphore(16)
    read = 0
    async with AsyncClient(address) as client:

        async def one(number: int) -> None:
            nonlocal read
            async with gate:
                async for _batch in client.subscribe_batches(
                    f"fd-{number:05d}", start="earliest", stop="latest"
                ):
                    read += 1

        await asyncio.gather(*(one(n) for n in range(streams)))
    return read


def run_fds(args: argparse.Namespace) -> dict[str, Any]:
    # On a tmpfs when there is one: every publish rolls a segment, and a roll syncs the sealed
    # one; what is counted here is descriptors, which fsync costs do not change.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="tidelog-isolation-fds-", dir=shm) as tmp:
        data = Path(tmp) / "data"
        started = time.perf_counter()
        with server(data_dir=data) as srv:
            asyncio.run(_fill_streams(srv.address, args.streams))
            fds_filled = fd_count(srv.pid)
        fill_s = time.perf_counter() - started
        segments = len(list(data.rglob("*.log")))
        with server(data_dir=data) as srv:
            after_restart = fd_count(srv.pid)
            started = time.perf_counter()
            asyncio.run(_read_streams(srv.address, args.streams))
            read_s = time.perf_counter() - started
            after_read = fd_count(srv.pid)
            rss_read = rss_mb(srv.pid)
    highest = max(after_restart, after_read)
    return {
        "fds_2000_streams": highest if args.streams == 2000 else None,
        "details": {
            "streams": args.streams,
            "segment_files": segments,
            "fill_s": round(fill_s, 1),
            "fds_after_fill": fds_filled,
            "fds_after_restart": after_restart,
            "fds_after_read": after_read,
            "read_s": round(read_s, 1),
            "rss_mb_after_read": rss_read,
        },
    }


# -- reconnect after an outage ---------------------------------------------------------------------


def run_reconnect(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tidelog-isolation-rc-") as tmp:
        data = Path(tmp) / "data"
        first = ServerProcess(data).start()
        port = first.port
        successes: list[float] = []
        failures = 0
        stop = threading.Event()
        try:
            with Client(first.address) as client:
                client.list_streams()

                def poll() -> None:
                    nonlocal failures
                    while not stop.is_set():
                        try:
                            client.list_streams()
                            successes.append(time.monotonic())
                        except Exception:
                            failures += 1
                        stop.wait(0.02)

                first.stop()
                down = time.monotonic()
                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
                time.sleep(args.outage_s)
                successes.clear()
                second = ServerProcess(data, "--port", str(port)).start()
                ready = time.monotonic()
                try:
                    deadline = ready + 60
                    while not successes and time.monotonic() < deadline:
                        time.sleep(0.01)
                    stop.set()
                    poller.join(10)
                finally:
                    second.stop()
        finally:
            first.kill()
    recovered = [t for t in successes if t >= ready]
    return {
        "reconnect_s": round(recovered[0] - ready, 3) if recovered else None,
        "details": {
            "outage_s": round(ready - down, 2),
            "failed_calls": failures,
            "port": port,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller smoke run")
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--idle-processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=None, help="each publish phase")
    parser.add_argument("--prefill-mb", type=float, default=8.0)
    parser.add_argument("--settle-s", type=float, default=None)
    parser.add_argument(
        "--settle-max-s",
        type=float,
        default=None,
        help="longest wait for the idle subscribers' windows to fill",
    )
    parser.add_argument("--churn-rounds", type=int, default=None)
    parser.add_argument("--churn-clients", type=int, default=None)
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--outage-s", type=float, default=5.0)
    parser.add_argument("--hold-idle", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--churn-client", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold_idle:
        address, stream, count = args.hold_idle
        asyncio.run(_hold_idle(address, stream, int(count)))
        return
    if args.churn_client:
        asyncio.run(_churn_client(*args.churn_client))
        return
    quick = args.quick
    args.seconds = args.seconds or (3.0 if quick else 10.0)
    args.settle_s = args.settle_s if args.settle_s is not None else (1.0 if quick else 3.0)
    args.settle_max_s = args.settle_max_s or (120.0 if quick else 900.0)
    args.churn_rounds = args.churn_rounds or (3 if quick else 10)
    args.churn_clients = args.churn_clients or (10 if quick else 30)
    args.streams = args.streams or (200 if quick else 2000)
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(only) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    result: dict[str, Any] = {
        "publish_mb_s_0": None,
        "publish_mb_s_500": None,
        "idle_subscribers_publish_ratio": None,
        "publish_mb_s_500_filling": None,
        "idle_subscribers_publish_ratio_filling": None,
        "idle_subscribers_rss_mb": None,
        "churn_rss_growth_mb": None,
        "fds_2000_streams": None,
        "reconnect_s": None,
        "quick": quick,
        "load_average": {"before": loadavg()},
        "details": {},
    }
    runners = {"idle": run_idle, "churn": run_churn, "fds": run_fds, "reconnect": run_reconnect}
    for part in PARTS:
        if part not in only:
            continue
        started = time.perf_counter()
        measured = runners[part](args)
        details = measured.pop("details")
        details["seconds"] = round(time.perf_counter() - started, 1)
        details["load_average_after"] = loadavg()
        result.update(measured)
        result["details"][part] = details
    result["load_average"]["after"] = loadavg()
    result["targets"] = {
        "idle_subscribers_publish_ratio >= 0.8": _met(
            result["idle_subscribers_publish_ratio"], 0.8
        ),
        "idle_subscribers_rss_mb <= 300": _met(300, result["idle_subscribers_rss_mb"]),
        "fds_2000_streams <= 1100": _met(1100, result["fds_2000_streams"]),
        "reconnect_s <= 0.5": _met(0.5, result["reconnect_s"]),
    }
    print(json.dumps(result, indent=2))


def _met(high: float | None, low: float | None) -> bool | None:
    return None if high is None or low is None else high >= low


if __name__ == "__main__":
    main()
