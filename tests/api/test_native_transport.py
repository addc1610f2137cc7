"""The native gRPC transport (``tidelog.api.transport``) against grpcio's own client.

Each test serves a few byte-level methods (no serializers) on a :class:`NativeServer` bound to a
free loopback port and calls them with ``grpc.aio``: framing of large and split messages,
Framed passthrough, statuses (unknown method, abort, an exception, oversize messages both ways),
deadlines and resets cancelling the handler, a slow reader bounding what the server buffers,
GOAWAY on stop with the in-flight call finishing, and TLS with the client's certificate in the
auth context as grpcio gives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.security.pki import make_pki

from tidelog.api.framed import Framed
from tidelog.api.transport import NativeServer
from tidelog.api.transport.call import HIGH_WATER
from tidelog.api.transport.messages import frame
from tidelog.security.tls import ServerTls, TlsFiles

Context = Any


class Probe:
    """What the handlers saw."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.yielded = 0
        self.auth: dict[str, list[bytes]] = {}
        self.peer = ""
        self.metadata: tuple[tuple[str, Any], ...] = ()
        self.saw_cancelled: bool | None = None
        """What ``context.cancelled()`` said in a handler being cancelled."""


def _handlers(probe: Probe) -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: Context) -> bytes:
        probe.auth = context.auth_context()
        probe.peer = context.peer()
        probe.metadata = context.invocation_metadata()
        return request

    async def fail(request: bytes, context: Context) -> bytes:
        if request == b"abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no, 100% not")
        raise ValueError("boom")

    async def sleepy(request: bytes, context: Context) -> bytes:
        try:
            await asyncio.sleep(float(request))
        except asyncio.CancelledError:
            probe.saw_cancelled = context.cancelled()
            probe.cancelled.set()
            raise
        return b"slept"

    async def give_up(request: bytes, context: Context) -> bytes:
        raise asyncio.CancelledError  # the handler's own, not the call's

    async def framed(request: bytes, context: Context) -> AsyncIterator[object]:
        assert context.takes_framed is True
        yield b"single"
        yield Framed(frame(b"a") + frame(b"bb") + frame(b""), 3)
        yield Framed.of_message([b"in ", bytes(40_000), b" pieces"])

    async def flood(request: bytes, context: Context) -> AsyncIterator[bytes]:
        try:
            while True:
                probe.yielded += 1
                yield bytes(int(request))
        finally:  # closed (GeneratorExit) when the call's task is cancelled
            probe.cancelled.set()

    async def sizes(request: bytes, context: Context) -> AsyncIterator[object]:
        for i, size in enumerate(int(part) for part in request.split(b",")):
            data = bytes([i % 256]) * size
            yield Framed(frame(data), 1) if i % 2 else data

    async def total(requests: AsyncIterator[bytes], context: Context) -> bytes:
        size = 0
        async for request in requests:
            size += len(request)
        return str(size).encode()

    async def chat(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request[::-1]

    return grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Sleepy": grpc.unary_unary_rpc_method_handler(sleepy),
            "GiveUp": grpc.unary_unary_rpc_method_handler(give_up),
            "Framed": grpc.unary_stream_rpc_method_handler(framed),
            "Flood": grpc.unary_stream_rpc_method_handler(flood),
            "Sizes": grpc.unary_stream_rpc_method_handler(sizes),
            "Total": grpc.stream_unary_rpc_method_handler(total),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )


Scenario = Callable[[grpc.aio.Channel, Probe, NativeServer], Awaitable[None]]


def run(
    scenario: Scenario,
    *,
    limit: int = 64 << 20,
    tls: ServerTls | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    async def main() -> None:
        probe = Probe()
        server = NativeServer(max_message_length=limit)
        server.add_generic_rpc_handlers([_handlers(probe)])
        if tls is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", tls.ssl_context(alpn=("h2",)))
        await server.start()
        address = f"localhost:{port}"
        channel = (
            grpc.aio.secure_channel(address, credentials)
            if credentials is not None
            else grpc.aio.insecure_channel(address)
        )
        try:
            await scenario(channel, probe, server)
        finally:
            await channel.close()
            await server.stop(None)

    asyncio.run(main())


def _unary(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/t.T/{name}")


def test_unary_messages_of_every_size_round_trip() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        echo = _unary(channel, "Echo")
        for size in (0, 1, 5, 16383, 16384, 70000, 3 << 20):
            payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            assert await echo(payload, metadata=(("k", "v"), ("b-bin", b"\x00\xff"))) == payload
        assert ("k", "v") in probe.metadata
        assert ("b-bin", b"\x00\xff") in probe.metadata
        assert probe.peer.startswith("ipv4:127.0.0.1:")
        assert probe.auth["transport_security_type"] == [b"insecure"]

    run(scenario)


def test_client_and_bidi_streams() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        total = channel.stream_unary("/t.T/Total")
        assert await total(iter([b"a" * 100_000] * 30)) == b"3000000"
        chat = channel.stream_stream("/t.T/Chat")
        answers = [answer async for answer in chat(iter([b"ab", b"cde", b""]))]
        assert answers == [b"ba", b"edc", b""]

    run(scenario)


def test_framed_responses_pass_through_as_messages() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        call = channel.unary_stream("/t.T/Framed")(b"")
        expected = [b"single", b"a", b"bb", b"", b"in " + bytes(40_000) + b" pieces"]
        assert [m async for m in call] == expected
        assert await call.code() == grpc.StatusCode.OK

    run(scenario)


def test_large_responses_of_concurrent_streams_arrive_whole_and_in_order() -> None:
    sizes = [5, 300_000, 16_384, 16_385, 0, 70_000, 1 << 20, 3, 262_144]

    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        request = ",".join(map(str, sizes)).encode()
        expected = [bytes([i % 256]) * size for i, size in enumerate(sizes)]

        async def one() -> list[bytes]:
            return [m async for m in channel.unary_stream("/t.T/Sizes")(request)]

        answers = await asyncio.gather(*(one() for _ in range(4)))
        assert all(answer == expected for answer in answers)

    run(scenario)


def test_statuses_unknown_method_abort_and_exception() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _unary(channel, "Nope")(b"")
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.aio.AioRpcError) as aborted:
            await _unary(channel, "Fail")(b"abort")
        assert aborted.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert aborted.value.details() == "no, 100% not"  # percent-encoded on the wire
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _unary(channel, "Fail")(b"")
        assert raised.value.code() == grpc.StatusCode.UNKNOWN
        assert raised.value.details() == "Unexpected <class 'ValueError'>: boom"

    run(scenario)


def test_a_cancelled_error_the_handler_raises_ends_the_call_cancelled() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, server: NativeServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await _unary(channel, "GiveUp")(b"", timeout=5)
        assert ended.value.code() == grpc.StatusCode.CANCELLED
        assert ended.value.details() == "handler cancelled"
        await asyncio.sleep(0.1)
        assert all(not c.calls for c in server.connections)

    run(scenario)


def test_a_client_reset_is_seen_as_cancelled_by_the_handler() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        call = _unary(channel, "Sleepy")(b"30")
        await asyncio.sleep(0.3)  # the handler is sleeping
        call.cancel()
        await asyncio.wait_for(probe.cancelled.wait(), 5)
        assert probe.saw_cancelled is True

    run(scenario)


def test_oversize_messages_are_resource_exhausted_both_ways() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as received:
            await _unary(channel, "Echo")(bytes(2000))
        assert received.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max (2000 vs. 1000)" in (received.value.details() or "")
        call = channel.unary_stream("/t.T/Flood")(b"1500")
        with pytest.raises(grpc.aio.AioRpcError) as sent:
            async for _ in call:
                pass
        assert sent.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await _unary(channel, "Echo")(b"still serving") == b"still serving"

    run(scenario, limit=1000)


def test_deadline_cancels_the_handler() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await _unary(channel, "Sleepy")(b"30", timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(probe.cancelled.wait(), 5)

    run(scenario)


def test_a_reset_stream_cancels_the_handler_and_a_slow_reader_bounds_the_buffer() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, server: NativeServer) -> None:
        call = channel.unary_stream("/t.T/Flood")(b"1024")
        await call.read()  # started; now read nothing more
        await asyncio.sleep(1.0)
        stalled_at = probe.yielded
        await asyncio.sleep(0.5)
        assert probe.yielded == stalled_at, "the handler kept yielding into a full window"
        (connection,) = server.connections
        (served,) = connection.calls.values()
        assert len(served.pending) <= HIGH_WATER + 1029
        # what left the server is bounded by the windows the client opened (grpc's BDP probe
        # grows them up to 16 MiB at most)
        assert stalled_at * 1029 <= HIGH_WATER + (32 << 20)
        call.cancel()
        await asyncio.wait_for(probe.cancelled.wait(), 5)
        await asyncio.sleep(0.1)
        assert not connection.calls

    run(scenario)


def test_stop_says_goaway_and_lets_the_call_in_flight_finish() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, server: NativeServer) -> None:
        assert await _unary(channel, "Echo")(b"warm") == b"warm"
        in_flight = asyncio.ensure_future(_unary(channel, "Sleepy")(b"0.5", timeout=10))
        await asyncio.sleep(0.2)
        stopping = asyncio.ensure_future(server.stop(5.0))
        assert await in_flight == b"slept"
        await stopping
        with pytest.raises(grpc.aio.AioRpcError) as after:
            await _unary(channel, "Echo")(b"x", timeout=2)
        assert after.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )

    run(scenario)


def test_stop_cancels_what_outlives_the_grace() -> None:
    async def scenario(channel: grpc.aio.Channel, probe: Probe, server: NativeServer) -> None:
        in_flight = asyncio.ensure_future(_unary(channel, "Sleepy")(b"30", timeout=10))
        await asyncio.sleep(0.2)
        await server.stop(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await in_flight
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
        assert probe.cancelled.is_set()

    run(scenario)


def test_mutual_tls_gives_grpcios_auth_context(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = ServerTls(TlsFiles(pki.server.cert, pki.server.key, pki.ca.cert))
    credentials = grpc.ssl_channel_credentials(
        pki.ca.cert.read_bytes(), pki.alice.key.read_bytes(), pki.alice.cert.read_bytes()
    )

    async def scenario(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        assert await _unary(channel, "Echo")(b"hi") == b"hi"
        assert probe.auth["transport_security_type"] == [b"ssl"]
        assert probe.auth["x509_common_name"] == [b"alice"]
        assert probe.auth["x509_subject_alternative_name"][0] == b"alice"
        assert probe.auth["x509_pem_cert"][0].startswith(b"-----BEGIN CERTIFICATE-----")

    run(scenario, tls=tls, credentials=credentials)
    # without a client certificate the handshake is refused
    anonymous = grpc.ssl_channel_credentials(pki.ca.cert.read_bytes())

    async def refused(channel: grpc.aio.Channel, probe: Probe, _: NativeServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await _unary(channel, "Echo")(b"hi", timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

    run(refused, tls=tls, credentials=anonymous)
