"""The native transport against clients that misbehave, frame by frame (the attack review's cases).

A :class:`NativeServer` serving a few byte-level methods runs in the test's loop on a loopback
port; a raw client (``h2`` as the client's state machine over asyncio streams, or hand-built
hyperframe frames where h2 would refuse to send them) does what an attacker or a racing client
does. Each test checks that the connection (or only the one call) ends the way grpcio's server
ends it, and that bystander calls on the same connection are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame, PingFrame, RstStreamFrame, SettingsFrame

from tidelog.api.transport import NativeServer, call, connection, h2setup, limits
from tidelog.api.transport.limits import (
    CONNECTION_PENDING,
    PING_STRIKES,
    UNEXPECTED_LOG_INTERVAL_S,
    RateLimited,
)
from tidelog.api.transport.messages import frame

Context = Any


def _handlers() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: Context) -> bytes:
        return request

    async def total(requests: AsyncIterator[bytes], context: Context) -> bytes:
        size = 0
        async for request in requests:
            size += len(request)
        return str(size).encode()

    async def flood(request: bytes, context: Context) -> AsyncIterator[bytes]:
        while True:
            yield bytes(int(request))

    return grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Total": grpc.stream_unary_rpc_method_handler(total),
            "Flood": grpc.unary_stream_rpc_method_handler(flood),
        },
    )


def headers(method: str, extra: list[tuple[bytes, bytes]] | None = None) -> list[Any]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", f"/t.T/{method}".encode()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *(extra or []),
    ]


class Client:
    """h2 on the client side over one asyncio connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.events: list[Event] = []
        self.closed = False

    async def start(self, settings: dict[int, int] | None = None) -> None:
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        await self.flush()

    async def flush(self, extra: bytes = b"") -> None:
        self.writer.write(self.h2.data_to_send() + extra)
        await self.writer.drain()

    async def unary(self, stream_id: int, method: str, body: bytes, **kw: Any) -> None:
        self.h2.send_headers(stream_id, headers(method, kw.get("extra")))
        self.h2.send_data(stream_id, frame(body), end_stream=True)
        await self.flush()

    async def read(self, timeout: float = 5.0) -> bool:
        """One read's events into ``events``; False at EOF (or a reset socket)."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.events += self.h2.receive_data(data)
        out = self.h2.data_to_send()
        if out:
            self.writer.write(out)
        return True

    def status(self, stream_id: int) -> tuple[str, str] | None:
        """(grpc-status, grpc-message) of a stream, ("RST", code), or None yet."""
        for event in self.events:
            if isinstance(event, ResponseReceived | TrailersReceived) and (
                event.stream_id == stream_id
            ):
                found = dict(event.headers or [])
                if b"grpc-status" in found:
                    return found[b"grpc-status"].decode(), found.get(b"grpc-message", b"").decode()
            if isinstance(event, StreamReset) and event.stream_id == stream_id:
                return "RST", str(event.error_code)
        return None

    async def status_of(self, stream_id: int, timeout: float = 5.0) -> tuple[str, str] | None:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while self.status(stream_id) is None and loop.time() < until:
            if not await self.read(until - loop.time()):
                break
        return self.status(stream_id)

    @property
    def terminated(self) -> bool:
        return any(isinstance(event, ConnectionTerminated) for event in self.events)

    def close(self) -> None:
        self.writer.close()


Scenario = Callable[[NativeServer, int], Awaitable[None]]


def serve(scenario: Scenario, **kwargs: Any) -> None:
    async def main() -> None:
        server = NativeServer(**kwargs)
        server.add_generic_rpc_handlers([_handlers()])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await scenario(server, port)
        finally:
            await server.stop(None)

    asyncio.run(main())


async def connect(port: int, settings: dict[int, int] | None = None) -> Client:
    client = Client(*await asyncio.open_connection("127.0.0.1", port))
    await client.start(settings)
    return client


def test_data_and_a_reset_in_one_read_cost_neither_the_connection_nor_a_log_storm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """h2 forgets a stream reset in the same read as its DATA (a new stream opening prunes
    it); reopening its window then found no stream. Bystander calls go on."""

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        for round_ in range(3):
            sid = 1 + 4 * round_
            client.h2.send_headers(sid, headers("Total"))
            await client.flush()
            data = DataFrame(sid, frame(b"x" * 100)).serialize()
            reset = RstStreamFrame(sid, error_code=8).serialize()  # CANCEL
            client.h2.send_headers(sid + 2, headers("Echo"))
            client.h2.send_data(sid + 2, frame(b"hello"), end_stream=True)
            opened = client.h2.data_to_send()
            client.writer.write(data + reset + opened)
            await client.writer.drain()
            assert await client.status_of(sid + 2) == ("0", ""), client.events[-3:]
            client.h2.streams.pop(sid, None)  # the client's h2 never saw its own raw reset
        assert not client.closed and not client.terminated
        client.close()

    with caplog.at_level(logging.DEBUG):
        serve(scenario)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_unexpected_error_closes_that_connection_only_and_is_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = RateLimited(logging.getLogger("tidelog.api.transport"), UNEXPECTED_LOG_INTERVAL_S)
    monkeypatch.setattr(connection, "_unexpected", fresh)

    async def scenario(server: NativeServer, port: int) -> None:
        bystander = await connect(port)
        await bystander.unary(1, "Echo", b"a")
        assert await bystander.status_of(1) == ("0", "")

        def broken(method: str, metadata: object) -> None:
            raise RuntimeError("a bug in routing")

        lookup = server.lookup
        server.lookup = broken  # type: ignore[method-assign]
        victims = []
        for _ in range(3):
            victim = await connect(port)
            await victim.unary(1, "Echo", b"b")
            victims.append(victim)
        for victim in victims:
            assert await victim.status_of(1) is None
            assert victim.closed
            victim.close()
        server.lookup = lookup  # type: ignore[method-assign]
        await bystander.unary(3, "Echo", b"c")
        assert await bystander.status_of(3) == ("0", "")
        bystander.close()

    with caplog.at_level(logging.WARNING):
        serve(scenario)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert warnings[0].name == "tidelog.api.transport"
    assert warnings[0].exc_info is not None and "a bug in routing" in caplog.text
    assert "Fatal error" not in caplog.text  # asyncio's own handler never saw it


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_client_that_never_reads_pins_a_bounded_amount_whatever_its_streams() -> None:
    """100 endless server streams of 64 KiB messages to a client whose windows stay shut:
    the writes stop at the connection's budget (they used to stop at 1 MiB per call)."""
    streams = 100
    size = 64 << 10

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port, {SettingCodes.INITIAL_WINDOW_SIZE: 0})
        await client.read()
        before = rss_mb()
        for n in range(streams):
            await client.unary(1 + 2 * n, "Flood", str(size).encode())
        await asyncio.sleep(1.0)  # ample for every handler to fill what it may
        grown = rss_mb() - before
        assert grown < 32, f"{streams} stalled streams grew the process by {grown:.0f} MB"
        (conn,) = server.connections
        held = conn.pending_bytes
        queued = sum(len(call.pending) for call in conn.calls.values())
        assert len(conn.calls) == streams
        assert held == queued
        assert held <= CONNECTION_PENDING + streams * (size + 5), held
        client.close()

    serve(scenario)


def test_writes_waiting_for_the_connection_budget_go_on_when_a_reader_catches_up() -> None:
    async def scenario(server: NativeServer, port: int) -> None:
        stalled = await connect(port, {SettingCodes.INITIAL_WINDOW_SIZE: 0})
        await stalled.read()
        for n in range(12):  # 12 x 1 MiB: over the budget
            await stalled.unary(1 + 2 * n, "Flood", str(1 << 20).encode())
        await asyncio.sleep(0.5)
        (conn,) = server.connections
        assert conn.over_budget
        stalled.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        stalled.h2.increment_flow_control_window(64 << 20)
        await stalled.flush()
        got = 0
        while got < 40 << 20:
            assert await stalled.read()
            for event in stalled.events:
                if isinstance(event, DataReceived):
                    got += event.flow_controlled_length or 0
                    stalled.h2.acknowledge_received_data(
                        event.flow_controlled_length or 0, event.stream_id
                    )
            stalled.events.clear()
            await stalled.flush()
        stalled.close()

    serve(scenario)


async def _flood(client: Client, frame_bytes: bytes, count: int) -> None:
    """``count`` copies of a frame, written without reading (a stalled write is fine)."""
    chunk = frame_bytes * 1000
    with contextlib.suppress(TimeoutError, ConnectionError):
        for _ in range(count // 1000):
            client.writer.write(chunk)
            await asyncio.wait_for(client.writer.drain(), 2.0)


async def _closed_by_server(client: Client, within: float) -> bool:
    """Whether the server closed the connection within ``within`` seconds (reading on)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    with contextlib.suppress(TimeoutError):
        while await client.read(until - loop.time()):
            pass
        return True
    return False


@pytest.mark.parametrize(
    ("flooded", "reason"),
    [
        (PingFrame(0, b"12345678").serialize(), "too_many_pings"),
        (
            SettingsFrame(0, settings={SettingCodes.INITIAL_WINDOW_SIZE: 65535}).serialize(),
            "too_many_settings",
        ),
    ],
)
def test_a_control_frame_flood_ends_with_enhance_your_calm(
    flooded: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The GOAWAY itself may be lost to the client: the server closes with the flood unread
    in its socket, and the kernel then resets the connection."""

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        await _flood(client, flooded, 200_000)
        assert await _closed_by_server(client, 5.0)
        for event in client.events:
            if isinstance(event, ConnectionTerminated):
                assert event.error_code == ErrorCodes.ENHANCE_YOUR_CALM
                assert event.additional_data == reason.encode()
        await asyncio.sleep(0.1)
        assert not server.connections
        client.close()

    with caplog.at_level(logging.DEBUG, logger="tidelog.api.transport"):
        serve(scenario)
    assert f"{reason}; closing" in caplog.text


def test_pings_between_calls_and_a_keepalive_pace_are_answered() -> None:
    """BDP pings ride with data, keepalive pings come seconds apart: neither is a strike."""

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        for n in range(3 * PING_STRIKES):
            client.h2.ping(b"%08d" % n)
            await client.unary(1 + 2 * n, "Echo", b"x")
            assert await client.status_of(1 + 2 * n) == ("0", "")
        assert not client.terminated and not client.closed
        client.close()

    serve(scenario)


def test_a_client_that_does_not_read_is_not_read_either(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no strike limit, a PING flood from a client that never reads stops being read
    once the socket's buffer is full: the answers do not pile up in the server."""
    monkeypatch.setattr(limits, "PING_STRIKES", 1 << 40)

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        client.writer.transport.set_write_buffer_limits(high=1 << 30)
        await _flood(client, PingFrame(0, b"12345678").serialize(), 2_000_000)  # 34 MB
        await asyncio.sleep(0.5)
        (conn,) = server.connections
        transport = conn._transport
        assert transport is not None
        assert transport.get_write_buffer_size() < 4 << 20
        client.close()

    serve(scenario)


def test_metadata_over_the_limit_fails_that_call_only() -> None:
    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        await client.flush()  # our acknowledgement of the server's SETTINGS
        await client.unary(1, "Echo", b"a")
        assert await client.status_of(1) == ("0", "")
        await client.unary(3, "Echo", b"big", extra=[(b"x-big", b"v" * 20000)])
        await client.unary(5, "Echo", b"bystander")
        code, message = await client.status_of(3) or ("", "")
        assert code == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        assert "metadata size exceeds hard limit" in message
        assert await client.status_of(5) == ("0", "")
        assert not client.terminated and not client.closed
        client.close()

    serve(scenario)


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [
        (b"\xb2S", ("13", "Error parsing 'grpc-timeout' metadata")),  # '²'.isdigit()
        (b"\xb9\xb2m", ("13", "Error parsing 'grpc-timeout' metadata")),
        (b"10x", ("13", "Error parsing 'grpc-timeout' metadata")),
        (b"-1S", ("13", "Error parsing 'grpc-timeout' metadata")),
        (b"S", ("13", "Error parsing 'grpc-timeout' metadata")),
        (b"0n", ("4", "Deadline Exceeded")),
        (b"0S", ("4", "Deadline Exceeded")),
        (b"123456789S", ("0", "")),  # nine digits: grpcio takes it
        (b"5S", ("0", "")),
    ],
)
def test_grpc_timeout_is_ascii_digits_and_a_unit_as_grpcio_reads_it(
    timeout: bytes, expected: tuple[str, str]
) -> None:
    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()
        await client.unary(1, "Echo", b"a", extra=[(b"grpc-timeout", timeout)])
        assert await client.status_of(1) == expected
        await client.unary(3, "Echo", b"b")
        assert await client.status_of(3) == ("0", "")
        client.close()

    serve(scenario)


def test_a_connection_that_sends_no_preface_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "PREFACE_TIMEOUT_S", 0.3)

    async def scenario(server: NativeServer, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        half, half_writer = await asyncio.open_connection("127.0.0.1", port)
        half_writer.write(b"PRI * HTTP/2.0\r\n")  # half a preface, then silence
        live = await connect(port)
        await live.read()
        await asyncio.sleep(0.6)
        await live.unary(1, "Echo", b"a")  # a client that said its preface stays
        assert await live.status_of(1) == ("0", "")
        for silent in (reader, half):
            await asyncio.wait_for(silent.read(), 2.0)  # to EOF (after the server's SETTINGS)
            assert silent.at_eof()
        assert len(server.connections) == 1
        for w in (writer, half_writer):
            w.close()
        live.close()

    serve(scenario)


def test_connections_over_the_cap_are_closed_at_once() -> None:
    async def scenario(server: NativeServer, port: int) -> None:
        first, second = await connect(port), await connect(port)
        for client in (first, second):
            await client.read()
        third = await connect(port)
        assert not await third.read(2.0)  # closed without a byte
        await first.unary(1, "Echo", b"a")
        assert await first.status_of(1) == ("0", "")
        second.close()
        await asyncio.sleep(0.2)
        fourth = await connect(port)
        await fourth.read()
        await fourth.unary(1, "Echo", b"b")
        assert await fourth.status_of(1) == ("0", "")
        for client in (first, third, fourth):
            client.close()

    serve(scenario, max_connections=2)


def test_small_requests_reopen_the_stream_window_in_steps_not_one_update_each() -> None:
    """A client streaming small requests (a paced publisher) gets no WINDOW_UPDATE per request:
    the stream's window is given back a step at a time, and a stream of several windows'
    worth of requests still flows to the end (the peer never waits on held-back credit)."""

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        client.h2.send_headers(1, headers("Total"))
        small = frame(bytes(100))
        for _ in range(200):  # 20 KB: under a step
            client.h2.send_data(1, small)
            await client.flush()
        await client.unary(3, "Echo", b"sync")  # answered after the 200 requests were read
        assert (await client.status_of(3)) == ("0", "")
        updates = [e for e in client.events if isinstance(e, WindowUpdated) and e.stream_id == 1]
        assert updates == []

        body = frame(bytes(60_000))
        sent = 200 * len(small)
        payload = 200 * 100
        total = 3 * h2setup.STREAM_WINDOW  # three windows: needs credit back to finish
        while sent < total:
            while client.h2.local_flow_control_window(1) < len(body):
                assert await client.read(5.0)
            client.h2.send_data(1, body)
            await client.flush()
            sent += len(body)
            payload += 60_000
        client.h2.end_stream(1)
        await client.flush()
        assert (await client.status_of(1))[0] == "0"
        updates = [e for e in client.events if isinstance(e, WindowUpdated) and e.stream_id == 1]
        assert all(e.delta >= call.WINDOW_STEP for e in updates)
        assert len(updates) >= 2
        answer = next(e for e in client.events if isinstance(e, DataReceived) and e.stream_id == 1)
        assert int(answer.data[5:]) == payload
        client.close()

    serve(scenario)


async def _push(client: Client, stream_id: int, data: bytes, stall: float = 0.5) -> int:
    """Send ``data`` on ``stream_id`` as the windows allow; how much went before the windows
    stayed shut for ``stall`` seconds."""
    sent = 0
    while sent < len(data):
        window = min(client.h2.local_flow_control_window(stream_id), 64 << 10)
        if window <= 0:
            try:
                if not await client.read(stall):
                    break
            except TimeoutError:
                break
            continue
        chunk = data[sent : sent + window]
        client.h2.send_data(stream_id, chunk)
        await client.flush()
        sent += len(chunk)
    return sent


def test_partial_messages_of_many_streams_stop_at_the_connection_receive_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Request bytes received and not taken count against the connection's budget, the part
    of a message still arriving too: past it only one stream at a time gets its window back
    (so a message larger than the budget still arrives), the others wait for it, then go on."""
    budget = 1 << 20
    monkeypatch.setattr(connection, "RECEIVE_BUDGET", budget, raising=False)
    size = 4 << 20
    first = frame(bytes(size))
    second = frame(b"\x01" * size)

    async def scenario(server: NativeServer, port: int) -> None:
        client = await connect(port)
        await client.read()  # the server's SETTINGS and connection window
        client.h2.send_headers(1, headers("Total"))
        client.h2.send_headers(3, headers("Total"))
        await client.flush()
        head = 3 << 20
        assert await _push(client, 1, first[:head]) == head  # past the budget: stream 1's
        stalled = await _push(client, 3, second)
        assert stalled <= h2setup.STREAM_WINDOW  # no credit back past the budget
        assert await _push(client, 1, first[head:]) == len(first) - head
        client.h2.end_stream(1)
        await client.flush()
        assert await client.status_of(1) == ("0", "")
        assert await _push(client, 3, second[stalled:]) == len(second) - stalled
        client.h2.end_stream(3)
        await client.flush()
        assert await client.status_of(3) == ("0", "")
        totals = {
            e.stream_id: int(e.data[5:])
            for e in client.events
            if isinstance(e, DataReceived) and e.stream_id in (1, 3)
        }
        assert totals == {1: size, 3: size}
        client.close()

    serve(scenario)
