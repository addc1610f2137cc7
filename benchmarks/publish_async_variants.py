#!/usr/bin/env python3
"""``proto.API/PublishAsync`` transports side by side, with nats-py's acked publish in the same run.

An experiment for issue 12 (item 11), kept so that the numbers in ``docs/performance.md`` can be
reproduced. Each server variant runs in its own process (this script, hidden ``--serve`` mode)
with its own broker in a fresh temporary directory (default settings, ``interval`` flush), serving
PublishAsync only; every client variant then publishes the same N payloads of S bytes (default
100,000 x 100 B) on one fresh stream, one ``PublishRequest`` per message, ackPolicy LEADER, at
most ``--window`` (1,000) unacknowledged, every response checked. Servers are stopped by PID.

Server variants (``--servers``):

- ``aio-queue``: grpc.aio, the PublishAsync of commit 8415b63 (before issue 12): an async
  generator behind the guard's ``async for``, a pump task moving each request through an
  ``asyncio.Queue``, acks built with a stream lookup each.
- ``aio-rw``: grpc.aio, the reader/writer form: one reader task appends requests to a deque
  (``context.read()``), the handler takes everything queued per wakeup, appends it and writes the
  acks with ``context.write``; no generator step, no queue hop per request.
- ``service``: whatever ``LiftbridgeService.PublishAsync`` is in this tree.
- ``sync-thread``: a synchronous ``grpc.server`` (thread pool) serving only PublishAsync, a thread
  per stream reading requests and the handler yielding the acks; the broker's appends run on an
  asyncio loop in another thread (one hop per group of requests, not per request).
- ``sync-hint``: ``sync-thread`` sending every ack of a group but the last with grpc's
  write-buffer hint (through a private hook of grpc's sync server; grpc.aio cannot set it), so
  grpc's core may put a group's acks into fewer socket writes.

``+uvloop`` after an aio server's or a client's name runs its event loop on uvloop (not a
dependency of tidelog: install it into the venv to try).

Client variants (``--clients``): ``bench`` is ``e2e_throughput.publish_async_phase`` (writes
and reads in order, offsets checked); ``go`` is ``e2e_throughput.go_style_phase``, publishing as
go-liftbridge's ``PublishAsync`` does (acks matched to callbacks by correlationId).

Prints one JSON object: per (server, client) msgs/s, server and client CPU seconds, load average
before and after; nats-py's ``publish_msgs_per_s`` (``peers.measure_nats``, same payloads) and
each ratio to it (to the highest nats-py rate of the run when there are several rounds).

    python benchmarks/publish_async_variants.py [--messages 100000] [--size 100] [--window 1000]
        [--servers aio-queue,aio-rw,sync-thread] [--clients bench,go] [--skip-nats] [--rounds 1]
        [--timeout 120]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from grpc._cython import cygrpc

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from e2e_throughput import (  # noqa: E402
    _loadavg,
    go_style_phase,
    process_cpu_seconds,
    publish_async_phase,
)
from tidelog._proto.liftbridge import api_pb2 as pb  # noqa: E402
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc  # noqa: E402
from tidelog.api.decoding import GuardedRegistry  # noqa: E402
from tidelog.api.liftbridge import LiftbridgeService  # noqa: E402
from tidelog.api.settings import ServerSettings  # noqa: E402
from tidelog.broker import Broker  # noqa: E402
from tidelog.control import Advertised, SingleBroker  # noqa: E402
from tidelog.wire import MAX_FRAME  # noqa: E402

SERVERS = ("aio-queue", "aio-rw", "service", "sync-thread", "sync-hint")
CLIENTS = ("bench", "go")
UVLOOP = "+uvloop"  # a suffix for an aio server or a client: its event loop is uvloop's
STREAM = "variants"
READY = "variant listening on "
_BATCH = 1000
METHOD = "/proto.API/PublishAsync"
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_FRAME),
    ("grpc.max_send_message_length", MAX_FRAME),
    ("grpc.so_reuseport", 0),
]


# ---------------------------------------------------------------------------------------------
# Server variants


class QueueService(LiftbridgeService):
    """PublishAsync as of commit 8415b63: async generator, pump task, asyncio.Queue."""

    async def PublishAsync(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.PublishRequest], context: Any
    ) -> AsyncIterator[pb.PublishResponse]:
        queue: asyncio.Queue[pb.PublishRequest | None] = asyncio.Queue(maxsize=4 * _BATCH)
        broken: list[BaseException] = []

        async def pump() -> None:
            try:
                async for request in request_iterator:
                    await queue.put(request)
            except Exception as error:
                broken.append(error)
            await queue.put(None)

        reader = asyncio.create_task(pump())
        try:
            ended = False
            while not ended:
                head = await queue.get()
                if head is None:
                    break
                group = [head]
                while len(group) < _BATCH and not queue.empty():
                    item = queue.get_nowait()
                    if item is None:
                        ended = True
                        break
                    group.append(item)
                for response in await self._publish_group(group):
                    yield response
            if broken:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, repr(broken[0]))
        finally:
            reader.cancel()


class ReaderWriterService(LiftbridgeService):
    """PublishAsync in the reader/writer form: a reader task filling a deque, the handler taking
    all that is queued per wakeup and writing each ack with ``context.write``."""

    async def PublishAsync(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.PublishRequest], context: Any
    ) -> None:
        queued: collections.deque[pb.PublishRequest] = collections.deque()
        ready = asyncio.Event()
        room = asyncio.Event()
        broken: list[BaseException] = []
        ended = False

        async def read() -> None:
            nonlocal ended
            try:
                while True:
                    request = await context.read()
                    if request is grpc.aio.EOF:
                        break
                    queued.append(request)
                    ready.set()
                    if len(queued) >= 4 * _BATCH:
                        room.clear()
                        await room.wait()
            except Exception as error:
                broken.append(error)
            finally:
                ended = True
                ready.set()

        reader = asyncio.create_task(read())
        try:
            while True:
                if not queued:
                    if ended:
                        break
                    ready.clear()
                    await ready.wait()
                    continue
                count = min(len(queued), _BATCH)
                group = [queued.popleft() for _ in range(count)]
                room.set()
                for response in await self._publish_group(group):
                    await context.write(response)
            if broken:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, repr(broken[0]))
        finally:
            reader.cancel()


async def _serve_aio(variant: str, data_dir: Path) -> None:
    settings = ServerSettings(data_dir=data_dir, port=0, metrics_port=0)
    broker = Broker(settings.broker_config())
    await broker.start()
    server = grpc.aio.server(options=SERVER_OPTIONS)
    port = server.add_insecure_port("127.0.0.1:0")
    advertised = Advertised(broker.broker_id, "127.0.0.1", port)
    service_class = {
        "aio-queue": QueueService,
        "aio-rw": ReaderWriterService,
        "service": LiftbridgeService,
    }[variant]
    pb_grpc.add_APIServicer_to_server(
        service_class(SingleBroker(broker, advertised)), GuardedRegistry(server)
    )
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"{READY}{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(1)
        await broker.close()


def _serve_sync(data_dir: Path, hint: bool) -> None:
    """A synchronous grpc server for PublishAsync (and CreateStream, to set up); the broker on an
    asyncio loop in its own thread. With ``hint``, every ack but the last of a group is sent with
    grpc's write-buffer hint, set through a private hook of grpc's sync server (an experiment
    only: grpc.aio has no way to set it)."""
    if hint:
        from grpc import _server as sync_server

        def flags(state: Any) -> int:
            return int(cygrpc.WriteFlag.buffer_hint) if getattr(state, "buffer_next", False) else 0

        sync_server._get_send_message_op_flags_from_state = flags  # type: ignore[assignment]

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="broker-loop", daemon=True).start()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    settings = ServerSettings(data_dir=data_dir, port=0, metrics_port=0)
    broker = Broker(settings.broker_config())
    on_loop(broker.start())
    service = LiftbridgeService(SingleBroker(broker, Advertised(broker.broker_id, "127.0.0.1", 0)))

    def create_stream(request: pb.CreateStreamRequest, context: Any) -> pb.CreateStreamResponse:
        broker.create_stream(request.name)
        return pb.CreateStreamResponse()

    def publish_async(
        requests: Iterator[pb.PublishRequest], context: Any
    ) -> Iterator[pb.PublishResponse]:
        queued: collections.deque[pb.PublishRequest | None] = collections.deque()
        ready = threading.Condition()

        def read() -> None:  # a thread per stream
            try:
                for request in requests:
                    with ready:
                        queued.append(request)
                        ready.notify()
            finally:
                with ready:
                    queued.append(None)
                    ready.notify()

        threading.Thread(target=read, daemon=True).start()
        while True:
            with ready:
                while not queued:
                    ready.wait()
                group = []
                while queued and len(group) < _BATCH:
                    group.append(queued.popleft())
            ended = group and group[-1] is None
            group = [r for r in group if r is not None]
            if group:
                responses = on_loop(service._publish_group(cast(list[pb.PublishRequest], group)))
                last = len(responses) - 1
                for i, response in enumerate(responses):
                    if hint:
                        context._state.buffer_next = i < last
                    yield response
            if ended:
                return

    handlers = {
        "PublishAsync": grpc.stream_stream_rpc_method_handler(
            publish_async,
            request_deserializer=pb.PublishRequest.FromString,
            response_serializer=pb.PublishResponse.SerializeToString,
        ),
        "CreateStream": grpc.unary_unary_rpc_method_handler(
            create_stream,
            request_deserializer=pb.CreateStreamRequest.FromString,
            response_serializer=pb.CreateStreamResponse.SerializeToString,
        ),
    }
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=8), options=SERVER_OPTIONS
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("proto.API", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"{READY}{port}", flush=True)
    stop.wait()
    server.stop(1).wait()
    on_loop(broker.close())
    loop.call_soon_threadsafe(loop.stop)


class VariantServer:
    """This script in ``--serve VARIANT`` mode, stopped by PID, its directory removed."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.directory = Path(tempfile.mkdtemp(prefix="variants-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> VariantServer:
        argv = [sys.executable, __file__, "--serve", self.variant, str(self.directory / "d")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_")}
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if line.startswith(READY):
                self.port = int(line[len(READY) :])
                return self
            if not line:
                break
        self.__exit__()
        raise RuntimeError(f"server variant {self.variant} did not start")

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else process_cpu_seconds(self.proc.pid)


# ---------------------------------------------------------------------------------------------
# Client variants


async def _create_stream(address: str, name: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await pb_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(name=name, subject=name))


def _variant(name: str) -> tuple[str, bool]:
    return name.removesuffix(UVLOOP), name.endswith(UVLOOP)


def _loop_factory(uvloop: bool) -> Any:
    if not uvloop:
        return None
    import uvloop as module

    return module.new_event_loop


def run_one(
    server_variant: str, client: str, payloads: Sequence[bytes], window: int, timeout: float
) -> dict[str, Any]:
    with VariantServer(server_variant) as server:
        address = f"127.0.0.1:{server.port}"
        asyncio.run(_create_stream(address, STREAM))
        name, uvloop = _variant(client)
        phase = publish_async_phase if name == "bench" else go_style_phase
        before = _loadavg()
        server_cpu = server.cpu_seconds()
        client_cpu = time.process_time()
        with asyncio.Runner(loop_factory=_loop_factory(uvloop)) as runner:
            result = runner.run(phase(address, STREAM, payloads, window, timeout))
        record = {
            "server": server_variant,
            "client": client,
            "msgs_per_s": round(result["count"] / result["seconds"], 1),
            "count": result["count"],
            "seconds": round(result["seconds"], 3),
            "timed_out": result["timed_out"],
            "server_cpu_s": round((server.cpu_seconds() or 0) - (server_cpu or 0), 3),
            "client_cpu_s": round(time.process_time() - client_cpu, 3),
            "loadavg_before": before,
            "loadavg_after": _loadavg(),
        }
    print(json.dumps(record), file=sys.stderr, flush=True)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        (variant, uvloop), data_dir = _variant(argv[1]), Path(argv[2])
        if variant.startswith("sync-"):
            _serve_sync(data_dir, hint=variant == "sync-hint")
        else:
            with asyncio.Runner(loop_factory=_loop_factory(uvloop)) as runner:
                runner.run(_serve_aio(variant, data_dir))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--servers", default="aio-queue,aio-rw,sync-thread")
    parser.add_argument("--clients", default="bench,go")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    clients = [c for c in args.clients.split(",") if c]
    unknown = {_variant(s)[0] for s in servers} - set(SERVERS)
    unknown |= {_variant(c)[0] for c in clients} - set(CLIENTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")

    import peers

    payloads = peers.make_payloads(args.messages, args.size)
    gc.collect()
    gc.freeze()
    out: dict[str, Any] = {
        "messages": args.messages,
        "message_bytes": args.size,
        "window": args.window,
        "loadavg_start": _loadavg(),
        "runs": [],
    }
    nats_rates: list[float] = []
    for _ in range(args.rounds):
        for server_variant in servers:
            for client in clients:
                out["runs"].append(
                    run_one(server_variant, client, payloads, args.window, args.timeout)
                )
        if not args.skip_nats:
            before = _loadavg()
            nats = peers.measure_nats(payloads, timeout=args.timeout)
            nats_rates.append(nats["publish_msgs_per_s"])
            print(json.dumps({"nats": nats["publish_msgs_per_s"], "loadavg_before": before}),
                  file=sys.stderr, flush=True)  # fmt: skip
    nats_rate = max(nats_rates) if nats_rates else None
    out["nats_publish_msgs_per_s"] = nats_rates
    for record in out["runs"]:
        record["ratio_to_nats"] = round(record["msgs_per_s"] / nats_rate, 3) if nats_rate else None
    out["loadavg_end"] = _loadavg()
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
