#!/usr/bin/env python3
"""End-to-end tidelog over loopback (gRPC client <-> ``tidelog serve``), next to Redis and NATS.

The benchmark starts its own ``tidelog serve`` (``python -m tidelog.cli serve``) on a free
127.0.0.1 port with a fresh temporary data directory, waits for its ready line (bounded), and
always stops it by PID (SIGTERM, then SIGKILL after a timeout) and removes the directory, also when
a phase fails. N random payloads of S bytes (default 1,000,000 x 100 B, all distinct, generated
once by ``peers.make_payloads``) are used by every throughput phase and by the peers; they are
frozen out of the garbage collector's scans (``gc.freeze``) so that no phase pays for the
fixture's size.

Phases, each on its own fresh stream of one partition:

- ``publish_batch_msgs_per_s``: ``AsyncClient.publish_batch`` (``tidelog.v1/PublishBatch``) with
  1,000 messages per call, one call in flight, every ack awaited (ack policy LEADER: committed
  under the server's flush policy, ``interval`` by default).
- ``publish_pipelined_msgs_per_s``: the same batches through ``AsyncClient.publisher`` (one
  ``tidelog.v1/PublishStream``), up to 4 batches in flight so client and server work overlap.
- ``subscribe_batch_msgs_per_s``: catch-up, ``AsyncClient.subscribe_batches`` from EARLIEST to
  STOP_LATEST over the whole partition, consumed as columns (issue 27's consumer API): every
  batch's value lengths summed from ``batch.values.sizes`` (no Python object per message), the
  first and last values checked against the payloads. The XRANGE reader sums every value's
  length too. numpy, which the columns load on first use, is loaded before the timer starts
  (0.15-0.2 s of wall time on this machine, paid once per process), as redis-py and hiredis are
  loaded before XRANGE's.
- ``subscribe_batch_decoded_msgs_per_s``: the same catch-up with every batch decoded with
  ``tidelog.client.aio.decode`` (one ``ReceivedMessage`` with its value as ``bytes`` per
  message) and every value's length summed: the figure the key above measured before issue 27.
- ``subscribe_reverse_msgs_per_s``: the same in reverse, from LATEST to the oldest.
- ``publish_async_msgs_per_s``: the Liftbridge path, ``proto.API/PublishAsync`` (bidi stream), one
  ``PublishRequest`` per message with ``ackPolicy=LEADER``, a ``correlationId`` and
  ``expectedOffset=-1`` (go-liftbridge's default: no offset check), at most
  ``--publish-async-window`` requests unacknowledged, every response read and checked (no
  ``asyncError``, offsets in order). Over ``--publish-async-messages`` messages (default 200,000,
  the first of the N payloads), recorded as ``publish_async_messages``.
- ``publish_async_go_style_msgs_per_s``: the same messages on one fresh stream, driven as
  go-liftbridge's ``PublishAsync`` drives it: each request carries a random 22-character
  ``correlationId`` under which an ack callback is registered, a permit of
  ``--publish-async-window`` (1,000) is taken before each request is written and given back by
  the callback, and one reader task hands each response to the callback its ``correlationId``
  names (in whatever order they come); any ``asyncError`` fails the run. Its ratio to nats-py's
  acked publish is ``ratios.publish_async_go_style_vs_nats_publish`` (target >= 0.5, issue 12).
- ``live_latency_p50_ms`` / ``live_latency_p99_ms``: a live subscriber (SubscribeBatches from
  NEW_ONLY, handshake awaited first) in this process while a publisher in a separate process
  sends ``--live-rate`` msgs/s (default 10,000) as ``--live-batch`` messages (default 10) per
  request on one ``PublishStream`` (``AsyncClient.publisher``) on an absolute 1 ms clock,
  requests not waiting for each other (bounded in flight), for ``--live-seconds`` (default 5)
  after 0.5 s of warm-up that is not counted. Each payload starts with its send time
  (``time.time_ns()``, little-endian i64) and a sequence number; latency = the subscriber's
  ``time.time_ns()`` after decoding the batch minus the send time. Percentiles are nearest-rank.
- ``live_latency_pinned_p50_ms`` / ``live_latency_pinned_p99_ms`` (``--pin-cpu N``): the same
  live phase once more against a second fresh server, with the server, this process (every
  thread, for the phase only) and the publisher process all confined to CPU ``N``
  (``os.sched_setaffinity``): one core for everything imitates a slower machine.
  ``details.live_pinned`` has its CPU seconds per process and per message. ``--only-live`` runs
  the live phase (and the pinned one, when asked) alone.

- TLS (``--skip-tls`` leaves it out), right after the catch-up phases: a second fresh
  ``tidelog serve`` requiring mutual TLS (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``;
  certificates from ``tidelog.security.testca`` in a temporary directory, removed afterwards)
  and an ``AsyncClient`` presenting a client certificate. ``--tls-rounds`` rounds (default 3),
  each on a fresh stream of both servers: ``publish_batch`` plaintext then over TLS, then forward
  catch-up plaintext then over TLS, same payloads, same code. ``tls_publish_ratio`` and
  ``tls_catchup_ratio`` are the medians of the rounds' TLS/plaintext ratios (target >= 0.8
  each); pairing phases seconds apart keeps the shared machine's moving load out of them.
  ``details.tls.rounds`` has every rate.

- Liftbridge side by side (``--skip-liftbridge`` leaves it out; ``--only-liftbridge`` runs it
  alone), after the peers: Liftbridge's own server (v1.9.0, its embedded NATS) and a driver on
  its official Go client (go-liftbridge v2.3.0, ``benchmarks/go/lbbench``), both built from Go
  modules before the first phase (``benchmarks/liftbridge_side.py``: ``go build`` under
  ``--liftbridge-build``, default ``build/go``), a fresh ``tidelog serve`` and that server
  started side by side; the same driver runs each phase against tidelog, then against
  Liftbridge: ``PublishAsync`` with ack LEADER and with ack ALL (``--publish-async-messages``,
  ``--publish-async-window``), a catch-up of ``--liftbridge-catchup-messages`` (1,000,000)
  through ``Subscribe``, and live latency through ``Subscribe`` at ``--live-rate`` (each
  server's own fast publisher by default; ``--liftbridge-live-publisher go`` sends
  ``PublishAsync`` to both). ``--liftbridge-rounds`` rounds; ``vs_liftbridge_publish_async``,
  ``vs_liftbridge_catchup`` and ``vs_liftbridge_live_p99`` hold the medians of the rounds'
  ratios (tidelog over Liftbridge, for latency Liftbridge's p99 over tidelog's: >= 1 is
  tidelog as good or better) with both sides' numbers; ``details.liftbridge`` every record.

``peers`` runs ``benchmarks/peers.py`` (``measure_redis``, ``measure_nats``) with the same
payloads after tidelog's server is stopped; ``--skip-peers`` leaves its numbers ``null``.
``ratios`` compares them with the targets, each with a boolean ``met`` (``false`` when a side was
not measured). ``details`` holds per-phase counts, seconds, CPU seconds of the client, server and
(live) publisher processes, and the load average before and after each phase.

Every loop is bounded by count and by ``--timeout`` seconds per phase: on time-out a phase reports
its partial rate and is named in ``details.timed_out_phases``.

``--profile DIR`` additionally samples the server and this client (and the live publisher) with
``py-spy record --nonblocking --format raw`` during each tidelog phase and writes collapsed stacks
plus ``DIR/summary.json`` (top functions by own and inclusive share of CPU samples). Profiled runs
are slower: compare their numbers with unprofiled runs only.

    python benchmarks/e2e_throughput.py [--messages 1000000] [--size 100] [--skip-peers]
        [--publish-async-messages 200000] [--publish-async-window 1000] [--live-seconds 5]
        [--live-rate 10000] [--live-batch 10] [--flush-policy interval] [--timeout 300]
        [--profile DIR] [--profile-native] [--skip-tls] [--tls-rounds 3]
        [--skip-liftbridge | --only-liftbridge] [--liftbridge-rounds 1]
        [--liftbridge-catchup-messages 1000000] [--liftbridge-live-publisher native|go]
        [--liftbridge-build DIR] [--pin-cpu N] [--only-live] [--grpc-transport grpcio|native]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import queue
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import ClientSettings, ClientTls
from tidelog.client.aio import AsyncClient
from tidelog.client.codec import decode
from tidelog.security.testca import issue, make_ca

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # processes.py beside this file, however it was loaded
    sys.path.insert(0, str(BENCH_DIR))

from processes import ServerProcess  # noqa: E402

DEFAULT_MESSAGES = 1_000_000
DEFAULT_SIZE = 100
DEFAULT_ASYNC_MESSAGES = 200_000
DEFAULT_ASYNC_WINDOW = 1_000
DEFAULT_TIMEOUT = 300.0  # seconds per phase
BATCH = 1_000
READY = "tidelog listening on "
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
SAFETY = 60.0  # extra seconds a phase may hang past its own deadline before it is aborted
LIVE_HEADER = 16  # send time (i64) + sequence number (u64) at the start of every live payload
LIVE_WARMUP_S = 0.5
LIVE_MAX_IN_FLIGHT = 200
LIVE_DRAIN_S = 10.0  # how long the subscriber may lag behind the publisher's end
START_CPUS = os.sched_getaffinity(0)
"""The CPUs this script may use, as started: what a pinned phase's helpers (py-spy) keep."""
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]

STREAM_BATCH = "e2e-batch"
STREAM_PIPELINED = "e2e-pipelined"
PIPELINE_WINDOW = 4
STREAM_ASYNC = "e2e-async"
STREAM_ASYNC_GO = "e2e-async-go"
STREAM_LIVE = "e2e-live"
STREAM_TLS = "e2e-tls"
TLS_TARGET = 0.8
"""mTLS throughput over plaintext, for batched publish and for catch-up."""


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if count > 0 and seconds > 0 else 0.0


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far (Linux ``/proc``)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (``q`` in (0, 1])."""
    if not sorted_values:
        return None
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[rank - 1]


@contextlib.contextmanager
def pinned_thread(cpus: set[int] | None) -> Iterator[None]:
    """Confine the calling thread to ``cpus`` meanwhile (a process it starts inherits that)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def pinned_process(cpus: set[int] | None) -> Iterator[None]:
    """Confine every thread of this process (gRPC's too) to ``cpus`` meanwhile; threads
    started meanwhile inherit it from their creator. Restores each thread's affinity after."""
    if cpus is None:
        yield
        return
    saved: dict[int, set[int]] = {}
    try:
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            with contextlib.suppress(ProcessLookupError):
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
        yield
    finally:
        everywhere = saved.get(threading.get_native_id(), os.sched_getaffinity(0))
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, saved.get(tid, everywhere))


# ---------------------------------------------------------------------------------------------
# The tidelog server


class TidelogServer(ServerProcess):
    """``python -m tidelog.cli serve`` on 127.0.0.1, port 0, in a temporary directory.

    A context manager (``processes.ServerProcess``): entering starts it and waits for its ready
    line on stdout (bounded by ``STARTUP_TIMEOUT``); leaving stops it by PID (SIGTERM, SIGKILL
    after ``STOP_TIMEOUT``) and removes the directory, whatever happened in between.
    """

    stop_timeout = STOP_TIMEOUT

    def __init__(self, flush_policy: str, *extra: str, cpus: set[int] | None = None) -> None:
        super().__init__()
        self.flush_policy = flush_policy
        self.extra = extra
        """More ``tidelog serve`` flags (the TLS phases' certificates)."""
        self.cpus = cpus
        """The CPUs the server may run on (all its threads: inherited at start), or any."""

    def start(self) -> None:
        directory = self.make_directory("e2e-tidelog-")
        data = directory / "data"
        # Settings from the flags only: no TIDELOG_* variable from the caller's shell leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_")}
        self._log = open(directory / "server.log", "wb")  # noqa: SIM115 - closed in stop
        argv = [
            sys.executable, "-m", "tidelog.cli", "serve",
            "--data-dir", str(data), "--host", "127.0.0.1", "--port", "0",
            "--metrics-port", "0", "--flush-policy", self.flush_policy, *self.extra,
        ]  # fmt: skip
        with pinned_thread(self.cpus):  # the child inherits the spawning thread's affinity
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                start_new_session=True,  # a Ctrl-C reaches us, and we stop the server by PID
            )
        self.pid = self.proc.pid
        lines: queue.Queue[bytes] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def drain() -> None:  # ends at EOF, when the server exits
            for line in stdout:
                lines.put(line)

        threading.Thread(target=drain, name="tidelog-stdout", daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1).decode(errors="replace")
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(READY):
                self.port = int(line.strip().rsplit(":", 1)[1])
                return
        raise RuntimeError(f"tidelog serve did not become ready: {self.log_tail()}")

    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.pid) if self.pid else None


# ---------------------------------------------------------------------------------------------
# Optional sampling profiles (py-spy)


class Profiler:
    """``py-spy record`` attached to some PIDs for one phase; stopped with SIGINT (it then writes
    its collapsed stacks). Does nothing when ``directory`` is None."""

    def __init__(self, directory: Path | None, phase: str, native: bool) -> None:
        self.directory = directory
        self.phase = phase
        self.native = native
        self.running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.files: dict[str, str] = {}

    def attach(self, name: str, pid: int) -> None:
        if self.directory is None:
            return
        binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out = self.directory / f"{self.phase}-{name}.txt"
        argv = [binary, "record", "--pid", str(pid), "--rate", "250"]
        argv += ["--format", "raw", "--output", str(out)]
        # py-spy cannot unwind native stacks without pausing the process
        argv.append("--native" if self.native else "--nonblocking")
        with pinned_thread(START_CPUS):  # not on the pinned phase's CPU (inherited otherwise)
            proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
            )
        self.running.append((name, proc, out))
        time.sleep(0.3)  # let it attach before the phase starts

    def stop(self) -> None:
        for name, proc, out in self.running:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            if proc.stderr is not None:
                proc.stderr.close()
            if out.exists():
                self.files[name] = str(out)
        self.running = []


def summarise_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Top functions of a py-spy raw (collapsed) profile by own and inclusive sample share."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function_of(f) for f in stack.split(";")]
        frames = [f for f in frames if f]
        if not frames:
            continue
        own[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count

    def share(counter: collections.Counter[str]) -> list[list[Any]]:
        return [[f, round(100 * c / total, 1)] for f, c in counter.most_common(top)]

    return {"samples": total, "own_pct": share(own), "inclusive_pct": share(inclusive)}


def _function_of(frame: str) -> str:
    """``name (path/to/file.py:123)`` -> ``name (file.py)``; thread frames are dropped."""
    frame = frame.strip()
    if frame.startswith(("process ", "thread ")):
        return ""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({Path(where).name})" if where else name


# ---------------------------------------------------------------------------------------------
# Phases


class Phase:
    """Times one phase: wall clock, CPU seconds of the processes involved, load average."""

    def __init__(
        self,
        name: str,
        server: TidelogServer,
        details: dict[str, Any],
        profile_dir: Path | None,
        native: bool,
    ) -> None:
        self.name = name
        self.server = server
        self.details = details
        self.profiler = Profiler(profile_dir, name, native)
        self.record: dict[str, Any] = {}

    def __enter__(self) -> Phase:
        self.record["loadavg_before"] = _loadavg()
        self.profiler.attach("server", self.server.pid)
        self.profiler.attach("client", os.getpid())
        self._server_cpu = self.server.cpu_seconds()
        self._client_cpu = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        server_cpu = self.server.cpu_seconds()
        if server_cpu is not None and self._server_cpu is not None:
            self.record["server_cpu_s"] = round(server_cpu - self._server_cpu, 3)
        self.record["client_cpu_s"] = round(time.process_time() - self._client_cpu, 3)
        self.record["loadavg_after"] = _loadavg()
        self.profiler.stop()
        if self.profiler.files:
            self.record["profiles"] = self.profiler.files
        self.details[self.name] = self.record


async def publish_batch_phase(
    client: AsyncClient, stream: str, payloads: Sequence[bytes], timeout: float
) -> dict[str, Any]:
    """``publish_batch`` in calls of ``BATCH`` messages, one in flight, every ack awaited."""
    n = len(payloads)
    done = 0
    last_offset = -1
    timed_out = False
    start = time.perf_counter()
    deadline = start + timeout
    while done < n:
        if time.perf_counter() >= deadline:
            timed_out = True
            break
        acks = await client.publish_batch(stream, payloads[done : done + BATCH])
        done += len(acks)
        last: Any = acks[-1]
        last_offset = last if isinstance(last, int) else last.offset  # an Ack or an offset
    seconds = time.perf_counter() - start
    if not timed_out and last_offset != n - 1:
        raise RuntimeError(f"publish_batch: last ack at offset {last_offset}, expected {n - 1}")
    return {"count": done, "seconds": seconds, "timed_out": timed_out}


async def publish_pipelined_phase(
    client: AsyncClient, stream: str, payloads: Sequence[bytes], window: int, timeout: float
) -> dict[str, Any]:
    """``AsyncClient.publisher`` (one ``PublishStream``): batches of ``BATCH`` messages, up to
    ``window`` in flight, every ack awaited; client and server work overlap."""
    n = len(payloads)
    sent = 0
    last_offset = -1
    timed_out = False
    start = time.perf_counter()
    deadline = start + timeout
    async with client.publisher(stream) as publisher:
        pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        while sent < n or pending:
            if sent < n and len(pending) < window and time.perf_counter() < deadline:
                pending.append(await publisher.send(payloads[sent : sent + BATCH]))
                sent += len(payloads[sent : sent + BATCH])
                continue
            if sent < n and time.perf_counter() >= deadline:
                timed_out = True
            if not pending:
                break
            acks = await pending.popleft()
            last_offset = acks[-1].offset
    seconds = time.perf_counter() - start
    if not timed_out and last_offset != n - 1:
        raise RuntimeError(f"publish_pipelined: last ack at offset {last_offset}, not {n - 1}")
    return {"count": last_offset + 1, "seconds": seconds, "timed_out": timed_out}


async def subscribe_phase(
    client: AsyncClient,
    stream: str,
    payloads: Sequence[bytes],
    expected: int,
    timeout: float,
    *,
    reverse: bool,
    columns: bool = False,
) -> dict[str, Any]:
    """Catch-up over the whole partition (forward EARLIEST..STOP_LATEST, or reverse LATEST..the
    oldest), every batch decoded into ``ReceivedMessage`` values, or (``columns``) read as
    columns."""
    count = 0
    nbytes = 0
    first: Any = None
    last: Any = None
    timed_out = False
    if columns:  # a library loaded once per process, not a catch-up's cost (module docstring)
        importlib.import_module("numpy")
    batches = client.subscribe_batches(
        stream,
        0,
        start="latest" if reverse else "earliest",
        stop=None if reverse else "latest",
        reverse=reverse,
    )
    start = time.perf_counter()
    deadline = start + timeout
    try:
        async for batch in batches:
            if columns:
                n = len(batch)
                if n:
                    nbytes += int(batch.values.sizes.sum())
                    if first is None:
                        first = batch[0]
                    last = batch  # its last message is built once, after the loop
                count += n
            else:
                messages = decode(batch, stream, 0)
                for message in messages:
                    nbytes += len(message.value)
                if messages:
                    if first is None:
                        first = messages[0]
                    last = messages[-1]
                count += len(messages)
            if count > expected:
                raise RuntimeError(f"subscribe: {count} messages, more than the {expected} stored")
            if time.perf_counter() >= deadline:
                timed_out = True
                break
    finally:
        await batches.aclose()
    seconds = time.perf_counter() - start
    if columns and last is not None:
        last = last[len(last) - 1]
    if not timed_out:
        size = len(payloads[0]) if payloads else 0
        want_first, want_last = (expected - 1, 0) if reverse else (0, expected - 1)
        if count != expected or nbytes != expected * size:
            raise RuntimeError(f"subscribe: {count} messages / {nbytes} B, expected {expected}")
        if expected and (
            first.offset != want_first
            or last.offset != want_last
            or first.value != payloads[want_first]
            or last.value != payloads[want_last]
        ):
            raise RuntimeError("subscribe: first/last message differ from those published")
    return {"count": count, "seconds": seconds, "timed_out": timed_out}


async def publish_async_phase(
    address: str, stream: str, payloads: Sequence[bytes], window: int, timeout: float
) -> dict[str, Any]:
    """``proto.API/PublishAsync``: one request per message (ackPolicy LEADER, a correlationId),
    at most ``window`` unacknowledged, every response read and checked in order."""
    n = len(payloads)
    sent = 0
    acked = 0
    waiting = False
    space = asyncio.Event()
    timed_out = False
    last_ack_time = 0.0
    async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = pb_grpc.APIStub(channel).PublishAsync()

        async def read_acks() -> None:
            nonlocal acked, last_ack_time
            while acked < n:
                read = await call.read()
                if read is grpc.aio.EOF:
                    return
                response = cast(pb.PublishResponse, read)
                if response.HasField("asyncError"):
                    raise RuntimeError(f"PublishAsync refused message {acked}: {response}")
                if response.ack.offset != acked:
                    raise RuntimeError(
                        f"PublishAsync ack {acked} has offset {response.ack.offset} "
                        f"(correlationId {response.correlationId!r})"
                    )
                acked += 1
                if waiting and sent - acked < window:
                    space.set()
            last_ack_time = time.perf_counter()

        start = time.perf_counter()
        deadline = start + timeout
        reader = asyncio.create_task(read_acks())
        try:
            for i, payload in enumerate(payloads):
                if i % BATCH == 0 and time.perf_counter() >= deadline:
                    timed_out = True
                    break
                while sent - acked >= window and not reader.done():
                    waiting = True
                    space.clear()
                    await space.wait()
                    waiting = False
                if reader.done():
                    break
                await call.write(
                    pb.PublishRequest(
                        stream=stream,
                        value=payload,
                        ackPolicy=pb.LEADER,
                        correlationId=str(i),
                        expectedOffset=-1,  # no check, as go-liftbridge sends by default
                    )
                )
                sent += 1
            await call.done_writing()
            if timed_out:  # stop counting at the deadline; drain what is in flight, unmeasured
                last_ack_time = time.perf_counter()
                count = acked
                reader.cancel()
            else:
                await asyncio.wait_for(reader, timeout + SAFETY)
                count = acked
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()
    if not timed_out and count != n:
        raise RuntimeError(f"PublishAsync: {count} acks for {n} messages")
    return {"count": count, "seconds": last_ack_time - start, "timed_out": timed_out}


def correlation_id() -> str:
    """A random 22-character id, as long as the ids go-liftbridge's clients send."""
    return secrets.token_urlsafe(16)[:22]


async def go_style_phase(
    address: str, stream: str, payloads: Sequence[bytes], window: int, timeout: float
) -> dict[str, Any]:
    """One PublishAsync stream used like go-liftbridge's ``PublishAsync``: every message gets a
    random correlationId and an ack callback registered under it, a permit of ``window`` is taken
    before the request is written and given back by the callback; a reader task hands each
    response to the callback its correlationId names, in whatever order they come."""
    n = len(payloads)
    permits = asyncio.Semaphore(window)
    handlers: dict[str, Any] = {}
    acked = 0
    failed: list[str] = []
    finished = asyncio.Event()
    last_ack_time = 0.0
    timed_out = False

    def on_ack(response: pb.PublishResponse) -> None:
        nonlocal acked, last_ack_time
        if response.HasField("asyncError"):
            failed.append(str(response.asyncError))
        acked += 1
        permits.release()
        if acked == n:
            last_ack_time = time.perf_counter()
            finished.set()

    async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = pb_grpc.APIStub(channel).PublishAsync()

        async def dispatch() -> None:
            while True:
                read = await call.read()
                if read is grpc.aio.EOF:
                    return
                response = cast(pb.PublishResponse, read)
                handler = handlers.pop(response.correlationId, None)
                if handler is None:
                    raise RuntimeError(f"an ack nobody waits for: {response}")
                handler(response)

        reader = asyncio.create_task(dispatch())
        start = time.perf_counter()
        deadline = start + timeout
        try:
            for i, payload in enumerate(payloads):
                if i % BATCH == 0 and time.perf_counter() >= deadline:
                    timed_out = True
                    break
                await permits.acquire()
                if reader.done():
                    break
                cid = correlation_id()
                handlers[cid] = on_ack
                await call.write(
                    pb.PublishRequest(
                        stream=stream,
                        value=payload,
                        ackPolicy=pb.LEADER,
                        correlationId=cid,
                        expectedOffset=-1,
                    )
                )
            await call.done_writing()
            if timed_out:
                last_ack_time = time.perf_counter()
            else:
                waiter = asyncio.create_task(finished.wait())
                await asyncio.wait(
                    {waiter, reader}, timeout=timeout + SAFETY, return_when="FIRST_COMPLETED"
                )
                waiter.cancel()
                if reader.done() and not finished.is_set():
                    reader.result()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()
    if failed:
        raise RuntimeError(f"PublishAsync refused {len(failed)} messages: {failed[0]}")
    if not timed_out and acked != n:
        raise RuntimeError(f"PublishAsync: {acked} acks for {n} messages")
    return {"count": acked, "seconds": last_ack_time - start, "timed_out": timed_out}


async def live_phase(
    server: TidelogServer,
    stream: str,
    size: int,
    rate: int,
    batch: int,
    seconds: float,
    timeout: float,
    profiler: Profiler,
) -> dict[str, Any]:
    """A live subscriber here; a paced publisher in a subprocess (this script, hidden mode)."""
    planned = int((LIVE_WARMUP_S + seconds) * rate) + batch
    state: dict[str, Any] = {"received": 0, "latencies": [], "sequences": []}
    handshake = asyncio.Event()
    async with grpc.aio.insecure_channel(server.address, options=GRPC_OPTIONS) as channel:
        call = v1_grpc.TidelogStub(channel).SubscribeBatches(
            v1.SubscribeBatchesRequest(
                stream=stream,
                start_position=v1.START_NEW_ONLY,
                stop_position=v1.STOP_ON_CANCEL,
            )
        )

        async def subscribe() -> None:
            first = await call.read()
            if first is grpc.aio.EOF:
                raise RuntimeError("live subscription ended before its handshake")
            handshake.set()
            latencies: list[int] = state["latencies"]
            sequences: list[int] = state["sequences"]
            while state["received"] < planned:
                read = await call.read()
                if read is grpc.aio.EOF:
                    return
                frame = cast(v1.RecordBatch, read)
                if frame.end:
                    return
                messages = decode(frame, stream, 0)
                now = time.time_ns()
                for message in messages:
                    value = message.value
                    latencies.append(now - int.from_bytes(value[:8], "little"))
                    sequences.append(int.from_bytes(value[8:16], "little"))
                state["received"] += len(messages)

        subscriber = asyncio.create_task(subscribe())
        publisher: asyncio.subprocess.Process | None = None
        try:
            await asyncio.wait_for(handshake.wait(), 30)
            config = {
                "address": server.address,
                "stream": stream,
                "size": size,
                "rate": rate,
                "batch": batch,
                "seconds": seconds,
                "warmup_seconds": LIVE_WARMUP_S,
                "timeout": timeout,
            }
            publisher = await asyncio.create_subprocess_exec(
                sys.executable,
                str(Path(__file__).resolve()),
                "--live-publisher",
                json.dumps(config),
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            profiler.attach("publisher", publisher.pid)
            publisher_cpu = 0.0
            out, _ = await asyncio.wait_for(publisher.communicate(), timeout + SAFETY)
            if publisher.returncode != 0:
                raise RuntimeError(f"live publisher failed (rc {publisher.returncode})")
            report = json.loads(out.decode().strip().splitlines()[-1])
            publisher_cpu = report.get("cpu_s", 0.0)
            total = report["sent"]
            drain_deadline = time.monotonic() + LIVE_DRAIN_S
            while state["received"] < total and time.monotonic() < drain_deadline:
                if subscriber.done():
                    subscriber.result()  # raises what failed it
                    break
                await asyncio.sleep(0.01)
        finally:
            if publisher is not None and publisher.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    publisher.kill()
                await publisher.wait()
            subscriber.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await subscriber
            call.cancel()
    warmup = report["warmup"]
    samples = sorted(
        lat / 1e6
        for lat, seq in zip(state["latencies"], state["sequences"], strict=True)
        if seq >= warmup
    )
    measured = report["sent"] - warmup
    return {
        "p50_ms": None if not samples else round(percentile(samples, 0.50) or 0.0, 3),
        "p99_ms": None if not samples else round(percentile(samples, 0.99) or 0.0, 3),
        "max_ms": None if not samples else round(samples[-1], 3),
        "samples": len(samples),
        "sent_measured": measured,
        "missing": measured - len(samples),
        "publisher": report,
        "publisher_cpu_s": publisher_cpu,
    }


def live_cpu_per_message(record: dict[str, Any]) -> None:
    """Add each process's CPU microseconds per measured message to a live phase's record."""
    count = record.get("sent_measured") or 0
    sent = record.get("publisher", {}).get("sent") or 0
    if not count or not sent:
        return
    # CPU seconds cover the warm-up too: divide by every message sent, not only the measured.
    for key, name in (
        ("server_cpu_s", "server"),
        ("client_cpu_s", "subscriber"),
        ("publisher_cpu_s", "publisher"),
    ):
        if record.get(key) is not None:
            record[f"{name}_cpu_us_per_msg"] = round(record[key] / sent * 1e6, 1)


async def live_of_args(
    server: TidelogServer, args: argparse.Namespace, profiler: Profiler
) -> dict[str, Any]:
    """:func:`live_phase` on ``STREAM_LIVE`` with the command line's size, rate and duration."""
    return await live_phase(
        server,
        STREAM_LIVE,
        max(args.size, LIVE_HEADER),
        args.live_rate,
        args.live_batch,
        args.live_seconds,
        args.timeout,
        profiler,
    )


async def live_on_fresh_server(
    args: argparse.Namespace, details: dict[str, Any], name: str, cpus: set[int] | None
) -> dict[str, Any]:
    """The live phase against a fresh server of its own; with ``cpus``, the server, every
    thread of this process and the publisher run on those CPUs only (for the phase)."""
    timeout = args.timeout
    with TidelogServer(args.flush_policy, *transport_flags(args), cpus=cpus) as server:
        async with AsyncClient(server.address) as client:
            await client.create_stream(STREAM_LIVE)
        with pinned_process(cpus):
            async with asyncio.timeout(timeout + 2 * SAFETY + LIVE_DRAIN_S):
                with Phase(name, server, details, args.profile, args.profile_native) as p:
                    r = await live_of_args(server, args, p.profiler)
                    p.record.update(r)
        server.stop()
    record = details[name]
    record["cpus"] = None if cpus is None else sorted(cpus)
    record["grpc_transport"] = args.grpc_transport
    live_cpu_per_message(record)
    return r


async def live_only(args: argparse.Namespace) -> dict[str, Any]:
    """``--only-live``: the live phase on a fresh server, then (``--pin-cpu``) pinned."""
    details: dict[str, Any] = {}
    out: dict[str, Any] = {}
    live = await live_on_fresh_server(args, details, "live", None)
    out["live_latency_p50_ms"], out["live_latency_p99_ms"] = live["p50_ms"], live["p99_ms"]
    if args.pin_cpu is not None:
        pinned = await live_on_fresh_server(args, details, "live_pinned", {args.pin_cpu})
        out["live_latency_pinned_p50_ms"] = pinned["p50_ms"]
        out["live_latency_pinned_p99_ms"] = pinned["p99_ms"]
    timed_out = [n for n in ("live", "live_pinned") if n in details]
    details["timed_out_phases"] = [n for n in timed_out if details[n]["publisher"]["timed_out"]]
    out["details"] = details
    return out


async def _live_publisher(config: dict[str, Any]) -> dict[str, Any]:
    """The paced publisher (run in its own process): ``batch`` messages per request on one
    ``PublishStream`` (``AsyncClient.publisher``) every ``batch / rate`` seconds on an absolute
    clock, requests in flight concurrently."""
    rate, batch = int(config["rate"]), int(config["batch"])
    interval = batch / rate
    warmup_batches = round(config["warmup_seconds"] * rate / batch)
    total_batches = warmup_batches + round(config["seconds"] * rate / batch)
    filler = os.urandom(max(int(config["size"]) - LIVE_HEADER, 0))
    stream = config["stream"]
    in_flight = asyncio.Semaphore(LIVE_MAX_IN_FLIGHT)
    pending: set[asyncio.Task[Any]] = set()
    behind_max = 0.0
    seq = 0
    timed_out = False
    async with AsyncClient(config["address"]) as client, client.publisher(stream) as publisher:
        await client.stream_info(stream)  # connected before the clock starts

        async def send(values: list[bytes]) -> None:
            try:
                await publisher.publish(values)
            finally:
                in_flight.release()

        cpu_start = time.process_time()
        start = time.perf_counter()
        deadline = start + float(config["timeout"])
        measured_start = start
        for k in range(total_batches):
            if k == warmup_batches:
                measured_start = time.perf_counter()
            target = start + k * interval
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                behind_max = max(behind_max, -delay)
            if time.perf_counter() >= deadline:
                timed_out = True
                break
            await in_flight.acquire()
            now = time.time_ns().to_bytes(8, "little")
            values = [now + (seq + i).to_bytes(8, "little") + filler for i in range(batch)]
            seq += batch
            task = asyncio.create_task(send(values))
            pending.add(task)
            task.add_done_callback(pending.discard)
        sending_s = time.perf_counter() - measured_start
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending), SAFETY)
    return {
        "sent": seq,
        "warmup": warmup_batches * batch,
        "measured_seconds": round(sending_s, 3),
        "achieved_msgs_per_s": _rate(seq - warmup_batches * batch, sending_s),
        "max_behind_schedule_ms": round(behind_max * 1e3, 3),
        "cpu_s": round(time.process_time() - cpu_start, 3),
        "timed_out": timed_out,
    }


async def tls_phases(
    args: argparse.Namespace,
    payloads: Sequence[bytes],
    plain: AsyncClient,
    details: dict[str, Any],
) -> None:
    """Batched publish and forward catch-up, plaintext (``plain``, the first server) and over
    mutual TLS (a second fresh server requiring client certificates, a client presenting one),
    in ``--tls-rounds`` rounds that alternate the two, each round on fresh streams of both.
    Pairing each TLS phase with a plaintext one seconds apart keeps the machine's load (shared,
    it moves) out of their ratio; the reported ratios are the medians of the rounds' ratios.
    The certificates live in a temporary directory, removed after. Fills ``details["tls"]``."""
    timeout = args.timeout
    rounds: list[dict[str, float]] = []
    record: dict[str, Any] = {"rounds": rounds, "timed_out": False, "loadavg_before": _loadavg()}
    details["tls"] = record
    pki = Path(tempfile.mkdtemp(prefix="e2e-pki-"))
    try:
        ca = make_ca(pki)
        server_cert, client_cert = issue(ca, pki, "server"), issue(ca, pki, "bench")
        flags = (
            *("--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)),
            *("--tls-client-ca", str(ca.cert), *transport_flags(args)),
        )
        with TidelogServer(args.flush_policy, *flags) as server:
            record["server_pid"] = server.pid
            tls = ClientTls(ca=ca.cert, cert=client_cert.cert, key=client_cert.key)
            async with AsyncClient(server.address, settings=ClientSettings(tls=tls)) as secured:
                for number in range(args.tls_rounds):
                    stream = f"{STREAM_TLS}-{number}"
                    sides = (("plain", plain), ("tls", secured))
                    rates: dict[str, float] = {}
                    stored: dict[str, int] = {}
                    for side, client in sides:
                        await client.create_stream(stream)
                        async with asyncio.timeout(timeout + SAFETY):
                            r = await publish_batch_phase(client, stream, payloads, timeout)
                        rates[f"{side}_publish"] = _rate(r["count"], r["seconds"])
                        stored[side] = r["count"]
                        record["timed_out"] |= r["timed_out"]
                    for side, client in sides:
                        async with asyncio.timeout(timeout + SAFETY):
                            r = await subscribe_phase(
                                client, stream, payloads, stored[side], timeout, reverse=False
                            )
                        rates[f"{side}_catchup"] = _rate(r["count"], r["seconds"])
                        record["timed_out"] |= r["timed_out"]
                    for _, client in sides:  # their disk space, for the rounds and phases after
                        await client.delete_stream(stream)
                    rounds.append(rates)
            server.stop()
            record["server_exit_code"] = server.exit_code
    finally:
        shutil.rmtree(pki, ignore_errors=True)
    record["loadavg_after"] = _loadavg()
    for kind in ("publish", "catchup"):
        ratios = [r[f"tls_{kind}"] / r[f"plain_{kind}"] for r in rounds if r[f"plain_{kind}"]]
        record[f"{kind}_ratio"] = round(statistics.median(ratios), 3) if ratios else None
        record[f"tls_{kind}_msgs_per_s"] = statistics.median(r[f"tls_{kind}"] for r in rounds)


async def tidelog_phases(args: argparse.Namespace, payloads: Sequence[bytes]) -> dict[str, Any]:
    details: dict[str, Any] = {}
    results: dict[str, Any] = {}
    timed_out_phases: list[str] = []
    profile_dir: Path | None = args.profile
    native = args.profile_native
    timeout = args.timeout
    n = len(payloads)
    async_payloads = payloads[: args.publish_async_messages]
    with TidelogServer(args.flush_policy, *transport_flags(args)) as server:
        details["server"] = {
            "pid": server.pid,
            "flush_policy": args.flush_policy,
            "grpc_transport": args.grpc_transport,
        }
        async with AsyncClient(server.address) as client:
            for name in (
                STREAM_BATCH,
                STREAM_PIPELINED,
                STREAM_ASYNC,
                STREAM_ASYNC_GO,
                STREAM_LIVE,
            ):
                await client.create_stream(name)

            def phase(name: str) -> Phase:
                return Phase(name, server, details, profile_dir, native)

            async with asyncio.timeout(timeout + SAFETY):
                with phase("publish_batch") as p:
                    r = await publish_batch_phase(client, STREAM_BATCH, payloads, timeout)
                    p.record.update(r, method=f"AsyncClient.publish_batch x{BATCH}, 1 in flight")
            results["publish_batch"] = r
            stored = r["count"]

            async with asyncio.timeout(timeout + SAFETY):
                with phase("publish_pipelined") as p:
                    r = await publish_pipelined_phase(
                        client, STREAM_PIPELINED, payloads, PIPELINE_WINDOW, timeout
                    )
                    p.record.update(
                        r,
                        method=f"AsyncClient.publisher x{BATCH}, {PIPELINE_WINDOW} in flight",
                    )
            results["publish_pipelined"] = r

            for name, reverse, columns in (
                ("subscribe_batch", False, True),
                ("subscribe_batch_decoded", False, False),
                ("subscribe_reverse", True, False),
            ):
                async with asyncio.timeout(timeout + SAFETY):
                    with phase(name) as p:
                        r = await subscribe_phase(
                            client,
                            STREAM_BATCH,
                            payloads,
                            stored,
                            timeout,
                            reverse=reverse,
                            columns=columns,
                        )
                        how = "columns (values.sizes)" if columns else "decode"
                        p.record.update(r, method=f"AsyncClient.subscribe_batches + {how}")
                results[name] = r

            if not args.skip_tls:
                await tls_phases(args, payloads, client, details)

            async with asyncio.timeout(timeout + 2 * SAFETY):
                with phase("publish_async") as p:
                    r = await publish_async_phase(
                        server.address,
                        STREAM_ASYNC,
                        async_payloads,
                        args.publish_async_window,
                        timeout,
                    )
                    p.record.update(
                        r,
                        method="proto.API/PublishAsync, ackPolicy LEADER",
                        window=args.publish_async_window,
                    )
            results["publish_async"] = r

            async with asyncio.timeout(timeout + 2 * SAFETY):
                with phase("publish_async_go_style") as p:
                    r = await go_style_phase(
                        server.address,
                        STREAM_ASYNC_GO,
                        async_payloads,
                        args.publish_async_window,
                        timeout,
                    )
                    p.record.update(
                        r,
                        method="proto.API/PublishAsync as go-liftbridge drives it: acks to "
                        "callbacks by correlationId, a permit per message",
                        window=args.publish_async_window,
                    )
            results["publish_async_go_style"] = r

            async with asyncio.timeout(timeout + 2 * SAFETY + LIVE_DRAIN_S):
                with phase("live") as p:
                    r = await live_of_args(server, args, p.profiler)
                    p.record.update(r)
            results["live"] = r
        server.stop()
        details["server"]["exit_code"] = server.exit_code
    live_cpu_per_message(details["live"])
    if args.pin_cpu is not None:
        results["live_pinned"] = await live_on_fresh_server(
            args, details, "live_pinned", {args.pin_cpu}
        )
    measured = [
        "publish_batch",
        "publish_pipelined",
        "subscribe_batch",
        "subscribe_batch_decoded",
        "subscribe_reverse",
        "publish_async",
        "publish_async_go_style",
    ]
    for name in measured:
        rec = details[name]
        rec["msgs_per_s"] = _rate(rec["count"], rec["seconds"])
        rec["seconds"] = round(rec["seconds"], 3)
        if rec["timed_out"]:
            timed_out_phases.append(name)
    for name in ("live", "live_pinned"):
        if name in details and details[name]["publisher"]["timed_out"]:
            timed_out_phases.append(name)
    if details.get("tls", {}).get("timed_out"):
        timed_out_phases.append("tls")
    details["publish_batch"]["messages"] = n
    details["timed_out_phases"] = timed_out_phases
    return {"results": results, "details": details}


# ---------------------------------------------------------------------------------------------
# Peers, ratios, environment


def _bench_module(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


def _peers() -> ModuleType:
    return _bench_module("peers")


def transport_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``tidelog serve`` flags choosing what serves the gRPC port (every phase's server)."""
    return ("--grpc-transport", args.grpc_transport)


def _live_publisher_argv(config: dict[str, Any]) -> list[str]:
    """This script's paced publisher (``--live-publisher``) for one configuration."""
    return [sys.executable, str(Path(__file__).resolve()), "--live-publisher", json.dumps(config)]


def liftbridge_phases(
    args: argparse.Namespace, payloads: Sequence[bytes], binaries: Any
) -> dict[str, Any]:
    """The Liftbridge phases on a fresh ``tidelog serve`` and on Liftbridge's own server, both
    running side by side (``benchmarks/liftbridge_side.py``); every record."""
    side = _bench_module("liftbridge_side")
    settings = side.Settings(
        publish_messages=args.publish_async_messages,
        window=args.publish_async_window,
        catchup_messages=args.liftbridge_catchup_messages,
        size=args.size,
        live_rate=args.live_rate,
        live_batch=args.live_batch,
        live_seconds=args.live_seconds,
        live_warmup=LIVE_WARMUP_S,
        live_publisher=args.liftbridge_live_publisher,
        rounds=args.liftbridge_rounds,
        timeout=args.timeout,
    )
    before = _loadavg()
    with (
        TidelogServer(args.flush_policy, *transport_flags(args)) as ours,
        side.LiftbridgeServer(binaries.liftbridge) as theirs,
    ):
        record: dict[str, Any] = side.measure(
            side.Target("tidelog", ours.address, ours.pid),
            side.Target("liftbridge", theirs.address, theirs.pid),
            binaries,
            settings,
            payloads,
            _live_publisher_argv,
        )
        record["pids"] = {"tidelog": ours.pid, "liftbridge": theirs.pid}
        record["directories"] = {
            "tidelog": str(ours.directory),
            "liftbridge": str(theirs.directory),
        }
        ours.stop()
        theirs.stop()
        record["exit_codes"] = {"tidelog": ours.exit_code, "liftbridge": theirs.exit_code}
    record["loadavg_before"], record["loadavg_after"] = before, _loadavg()
    record["summary"] = side.summary(record)
    return record


def ratio(value: float | None, base: float | None, target: float, compare: str) -> dict[str, Any]:
    """``value / base`` (or ``value`` itself when ``base`` is None and compare is "<=")."""
    measured = value
    if compare != "<=":
        measured = value / base if value is not None and base else None
    met = measured is not None and (measured >= target if compare == ">=" else measured <= target)
    return {
        "value": None if measured is None else round(measured, 3),
        "target": f"{compare} {target:g}",
        "met": bool(met),
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git() -> dict[str, Any]:
    def run(*argv: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(BENCH_DIR), *argv],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip()

    try:
        return {"commit": run("rev-parse", "HEAD") or None, "dirty": bool(run("status", "-s"))}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def environment() -> dict[str, Any]:
    try:
        from google.protobuf.internal import api_implementation

        protobuf_impl = api_implementation.Type()
    except ImportError:
        protobuf_impl = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "tidelog": _version("tidelog"),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "protobuf_implementation": protobuf_impl,
        "numpy": _version("numpy"),
        "git": _git(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--live-publisher"]:  # the live phase's publisher process
        report = asyncio.run(_live_publisher(json.loads(argv[1])))
        print(json.dumps(report), flush=True)
        return 0

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help="bytes per message")
    parser.add_argument("--skip-peers", action="store_true", help="do not run Redis and NATS")
    parser.add_argument(
        "--publish-async-messages",
        type=int,
        default=DEFAULT_ASYNC_MESSAGES,
        help="messages for the PublishAsync phase (at most --messages; default 200000)",
    )
    parser.add_argument("--publish-async-window", type=int, default=DEFAULT_ASYNC_WINDOW)
    parser.add_argument("--live-seconds", type=float, default=5.0)
    parser.add_argument("--live-rate", type=int, default=10_000, help="msgs/s")
    parser.add_argument("--live-batch", type=int, default=10, help="messages per publish")
    parser.add_argument(
        "--flush-policy", choices=("always", "interval", "never"), default="interval"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per phase (default 300)"
    )
    parser.add_argument("--profile", type=Path, help="py-spy every tidelog phase into this dir")
    parser.add_argument(
        "--profile-native", action="store_true", help="py-spy --native (pauses while sampling)"
    )
    parser.add_argument("--skip-tls", action="store_true", help="leave out the mutual-TLS phases")
    parser.add_argument(
        "--tls-rounds", type=int, default=3, help="paired plaintext/TLS rounds (default 3)"
    )
    parser.add_argument(
        "--skip-liftbridge", action="store_true", help="leave out Liftbridge side by side"
    )
    parser.add_argument(
        "--only-liftbridge", action="store_true", help="run Liftbridge side by side alone"
    )
    parser.add_argument(
        "--liftbridge-build",
        type=Path,
        default=None,
        help="where Go builds the driver and Liftbridge (default build/go, or $TIDELOG_GO_BUILD)",
    )
    parser.add_argument("--liftbridge-rounds", type=int, default=1)
    parser.add_argument(
        "--grpc-transport",
        choices=("grpcio", "native"),
        default="native",
        help="what serves tidelog's gRPC port in every phase's server (tidelog serve "
        "--grpc-transport; default native, the server's own default)",
    )
    parser.add_argument("--liftbridge-catchup-messages", type=int, default=1_000_000)
    parser.add_argument(
        "--liftbridge-live-publisher",
        choices=("native", "go"),
        default="native",
        help="live publishers: each server's fast path (default) or Go PublishAsync for both",
    )
    parser.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        metavar="N",
        help="also run the live phase with server, subscriber and publisher on CPU N only",
    )
    parser.add_argument(
        "--only-live", action="store_true", help="run the live phase (and --pin-cpu's) alone"
    )
    args = parser.parse_args(argv)
    if args.pin_cpu is not None and args.pin_cpu not in os.sched_getaffinity(0):
        parser.error(f"--pin-cpu {args.pin_cpu}: not a CPU this process may run on")
    if args.skip_liftbridge and args.only_liftbridge:
        parser.error("--skip-liftbridge and --only-liftbridge exclude each other")
    if args.liftbridge_rounds < 1 or args.liftbridge_catchup_messages < 1:
        parser.error("--liftbridge-rounds and --liftbridge-catchup-messages must be positive")
    if args.messages < 1 or args.size < 1:
        parser.error("--messages and --size must be positive")
    if args.publish_async_window < 1 or args.live_rate < 1 or args.live_batch < 1:
        parser.error("--publish-async-window, --live-rate and --live-batch must be positive")
    if args.tls_rounds < 1:
        parser.error("--tls-rounds must be positive")
    if args.live_seconds <= 0 or args.publish_async_messages < 1:
        parser.error("--live-seconds and --publish-async-messages must be positive")
    args.publish_async_messages = min(args.publish_async_messages, args.messages)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    # Go builds first (a second when built before), so that no phase shares the machine with
    # a compiler.
    binaries = (
        None
        if args.skip_liftbridge or args.only_live
        else _bench_module("liftbridge_side").build(args.liftbridge_build)
    )
    loadavg_start = _loadavg()
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    wall_start = time.perf_counter()
    if args.only_live:
        live_out = asyncio.run(live_only(args))
        live_out["environment"] = {
            **environment(),
            "started_utc": started_utc,
            "loadavg_start": loadavg_start,
            "loadavg_end": _loadavg(),
            "wall_seconds": round(time.perf_counter() - wall_start, 1),
        }
        json.dump(live_out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    peers = _peers()
    payloads = peers.make_payloads(args.messages, args.size)
    # The payloads are the benchmark's fixture, alive for the whole run: keep the garbage
    # collector from re-scanning them in every full collection during every phase (tidelog's
    # and the peers' alike), which would charge each phase for the fixture's size.
    gc.collect()
    gc.freeze()
    if args.only_liftbridge:
        liftbridge = liftbridge_phases(args, payloads, binaries)
        only: dict[str, Any] = {
            **liftbridge["summary"],
            "environment": {
                **environment(),
                "started_utc": started_utc,
                "loadavg_start": loadavg_start,
                "loadavg_end": _loadavg(),
                "wall_seconds": round(time.perf_counter() - wall_start, 1),
            },
            "details": {"liftbridge": liftbridge},
        }
        json.dump(only, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    tidelog = asyncio.run(tidelog_phases(args, payloads))
    results, details = tidelog["results"], tidelog["details"]

    redis: dict[str, Any] | None = None
    nats: dict[str, Any] | None = None
    if not args.skip_peers:
        details["peers_loadavg_before"] = _loadavg()
        redis = peers.measure_redis(payloads, timeout=args.timeout)
        nats = peers.measure_nats(payloads, timeout=args.timeout)
        details["peers_loadavg_after"] = _loadavg()
        details["peers"] = {"redis": redis, "nats": nats, "versions": peers.versions()}
    liftbridge: dict[str, Any] = {}
    if binaries is not None:
        liftbridge = liftbridge_phases(args, payloads, binaries)
        details["liftbridge"] = liftbridge

    def peer(result: dict[str, Any] | None, *keys: str) -> dict[str, Any]:
        return {k: None if result is None else result.get(k) for k in keys}

    redis_out = peer(redis, "publish_msgs_per_s", "read_msgs_per_s", "c_client_publish_msgs_per_s")
    nats_out = peer(nats, "publish_msgs_per_s", "read_msgs_per_s")
    publish_batch = details["publish_batch"]["msgs_per_s"]
    publish_pipelined = details["publish_pipelined"]["msgs_per_s"]
    publish_async = details["publish_async"]["msgs_per_s"]
    publish_async_go = details["publish_async_go_style"]["msgs_per_s"]
    forward = details["subscribe_batch"]["msgs_per_s"]
    forward_decoded = details["subscribe_batch_decoded"]["msgs_per_s"]
    reverse = details["subscribe_reverse"]["msgs_per_s"]
    live = results["live"]
    tls = details.get("tls", {})  # ratios already (medians of paired rounds): over 1
    tls_publish_ratio = ratio(tls.get("publish_ratio"), 1.0, TLS_TARGET, ">=")
    tls_catchup_ratio = ratio(tls.get("catchup_ratio"), 1.0, TLS_TARGET, ">=")

    out: dict[str, Any] = {
        "publish_batch_msgs_per_s": publish_batch,
        "publish_pipelined_msgs_per_s": publish_pipelined,
        "publish_async_msgs_per_s": publish_async,
        "publish_async_go_style_msgs_per_s": publish_async_go,
        "subscribe_batch_msgs_per_s": forward,
        "subscribe_batch_decoded_msgs_per_s": forward_decoded,
        "subscribe_reverse_msgs_per_s": reverse,
        "live_latency_p50_ms": live["p50_ms"],
        "live_latency_p99_ms": live["p99_ms"],
        "live_latency_pinned_p50_ms": results.get("live_pinned", {}).get("p50_ms"),
        "live_latency_pinned_p99_ms": results.get("live_pinned", {}).get("p99_ms"),
        "tls_publish_batch_msgs_per_s": tls.get("tls_publish_msgs_per_s"),
        "tls_subscribe_batch_msgs_per_s": tls.get("tls_catchup_msgs_per_s"),
        "tls_publish_ratio": tls_publish_ratio["value"],
        "tls_catchup_ratio": tls_catchup_ratio["value"],
        "peers": {"redis": redis_out, "nats": nats_out},
        "ratios": {
            "publish_batch_vs_redis_c_client": ratio(
                publish_batch, redis_out["c_client_publish_msgs_per_s"], 1, ">="
            ),
            "publish_pipelined_vs_redis_c_client": ratio(
                publish_pipelined, redis_out["c_client_publish_msgs_per_s"], 1, ">="
            ),
            "subscribe_batch_vs_redis_xrange": ratio(
                forward, redis_out["read_msgs_per_s"], 3, ">="
            ),
            "subscribe_batch_decoded_vs_redis_xrange": ratio(
                forward_decoded, redis_out["read_msgs_per_s"], 3, ">="
            ),
            "publish_async_vs_nats_publish": ratio(
                publish_async, nats_out["publish_msgs_per_s"], 1, ">="
            ),
            "publish_async_go_style_vs_nats_publish": ratio(
                publish_async_go, nats_out["publish_msgs_per_s"], 0.5, ">="
            ),
            "reverse_vs_forward_catch_up": ratio(reverse, forward_decoded, 0.9, ">="),
            "live_p99_ms": ratio(live["p99_ms"], None, 5, "<="),
            "live_pinned_p99_ms": ratio(
                results.get("live_pinned", {}).get("p99_ms"), None, 5, "<="
            ),
            "tls_publish_vs_plaintext": tls_publish_ratio,
            "tls_catchup_vs_plaintext": tls_catchup_ratio,
        },
        **liftbridge.get("summary", {}),
        "messages": args.messages,
        "message_bytes": args.size,
        "publish_async_messages": args.publish_async_messages,
        "live": {
            "rate_msgs_per_s": args.live_rate,
            "batch": args.live_batch,
            "seconds": args.live_seconds,
            "samples": live["samples"],
        },
        "peers_skipped": args.skip_peers,
        "environment": {
            **environment(),
            "started_utc": started_utc,
            "loadavg_start": loadavg_start,
            "loadavg_end": _loadavg(),
            "wall_seconds": round(time.perf_counter() - wall_start, 1),
        },
        "details": details,
    }
    if args.profile is not None:
        files = [f for f in sorted(args.profile.glob("*.txt")) if f.stat().st_size]
        summary = {f.stem: summarise_collapsed(f) for f in files}
        (args.profile / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        out["details"]["profile_dir"] = str(args.profile)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
