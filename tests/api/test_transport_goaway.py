"""The native transport's graceful stop, frame by frame: grpc's two-step GOAWAY.

A client written here from hyperframe frames and hpack (no HTTP/2 library on the client side:
h2 as a client refuses to open streams once it has seen a GOAWAY, which is exactly the race
this covers) talks to a :class:`NativeServer` on a loopback port. Checked: the first GOAWAY
names stream 2^31-1 and comes with a PING; a stream the client opens before acknowledging that
PING is served; the final GOAWAY names it as the last stream; a later stream is refused with
RST_STREAM REFUSED_STREAM (never processed: safe to retry elsewhere); the call in flight
finishes OK and the socket then closes. Without the PING's acknowledgement the final GOAWAY
still goes out after ``GOAWAY_PING_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from h2.errors import ErrorCodes
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

from tidelog.api.transport import NativeServer, connection
from tidelog.api.transport.messages import frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _handlers() -> grpc.GenericRpcHandler:
    async def sleepy(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(float(request))
        return b"slept"

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    return grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Sleepy": grpc.unary_unary_rpc_method_handler(sleepy),
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
        },
    )


class RawClient:
    """Frames in and out over one socket; headers encoded without indexing."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.seen: list[Frame] = []
        """Every frame :meth:`next` returned, in order."""

    async def start(self) -> None:
        self.writer.write(PREFACE + SettingsFrame(0).serialize())
        await self.writer.drain()

    async def call(self, stream_id: int, method: str, request: bytes) -> None:
        headers = [
            NeverIndexedHeaderTuple(name, value)
            for name, value in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", f"/t.T/{method}"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        ]
        head = HeadersFrame(stream_id, self.encoder.encode(headers), flags=["END_HEADERS"])
        body = DataFrame(stream_id, frame(request), flags=["END_STREAM"])
        self.writer.write(head.serialize() + body.serialize())
        await self.writer.drain()

    async def ack(self, ping: PingFrame) -> None:
        self.writer.write(PingFrame(0, ping.opaque_data, flags=["ACK"]).serialize())
        await self.writer.drain()

    async def next(self) -> Frame | None:
        """The next frame the server sent (SETTINGS and WINDOW_UPDATE skipped); None at EOF."""
        while True:
            try:
                head = await self.reader.readexactly(9)
            except asyncio.IncompleteReadError:
                return None
            parsed, length = Frame.parse_frame_header(memoryview(head))
            parsed.parse_body(memoryview(await self.reader.readexactly(length)))
            if isinstance(parsed, HeadersFrame):
                parsed.decoded = dict(self.decoder.decode(parsed.data, raw=True))  # type: ignore[attr-defined]
            if parsed.type not in (SettingsFrame.type, 0x8):
                self.seen.append(parsed)
                return parsed

    async def until(self, kind: type[Frame], stream_id: int | None = None) -> Any:
        while True:
            got = await asyncio.wait_for(self.next(), 5)
            assert got is not None, f"the connection closed before a {kind.__name__}"
            if isinstance(got, kind) and (stream_id is None or got.stream_id == stream_id):
                return got


async def _served() -> tuple[NativeServer, RawClient]:
    server = NativeServer()
    server.add_generic_rpc_handlers([_handlers()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = RawClient(*await asyncio.open_connection("127.0.0.1", port))
    await client.start()
    return server, client


def test_two_step_goaway_serves_streams_opened_before_the_ping_and_refuses_later_ones() -> None:
    async def main() -> None:
        server, client = await _served()
        try:
            await client.call(1, "Sleepy", b"0.5")
            await asyncio.sleep(0.1)
            stopping = asyncio.ensure_future(server.stop(5.0))
            first = await client.until(GoAwayFrame)
            assert first.last_stream_id == (1 << 31) - 1 and first.error_code == 0
            ping = await client.until(PingFrame)
            assert "ACK" not in ping.flags
            await client.call(3, "Echo", b"in time")  # opened before the client heard
            await client.ack(ping)
            final = await client.until(GoAwayFrame)
            assert final.last_stream_id == 3
            await client.call(5, "Echo", b"too late")
            refused = await client.until(RstStreamFrame, 5)
            assert refused.error_code == ErrorCodes.REFUSED_STREAM
            while await asyncio.wait_for(client.next(), 5) is not None:
                pass  # until the server closes the socket
            for stream_id, answer in ((3, b"in time"), (1, b"slept")):
                frames = [f for f in client.seen if f.stream_id == stream_id]
                data = b"".join(f.data for f in frames if isinstance(f, DataFrame))
                assert data == frame(answer)
                trailers = [f for f in frames if isinstance(f, HeadersFrame)][-1]
                assert "END_STREAM" in trailers.flags
                assert trailers.decoded[b"grpc-status"] == b"0"  # type: ignore[attr-defined]
            await asyncio.wait_for(stopping, 5)
        finally:
            client.writer.close()
            await server.stop(None)

    asyncio.run(main())


def test_the_final_goaway_goes_out_when_the_ping_is_not_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "GOAWAY_PING_TIMEOUT_S", 0.2)

    async def main() -> None:
        server, client = await _served()
        try:
            await client.call(1, "Echo", b"x")
            await client.until(HeadersFrame, 1)
            stopping = asyncio.ensure_future(server.stop(5.0))
            assert (await client.until(GoAwayFrame)).last_stream_id == (1 << 31) - 1
            final = await client.until(GoAwayFrame)  # no PING acknowledged
            assert final.last_stream_id == 1
            assert await asyncio.wait_for(client.next(), 5) is None  # closed: nothing open
            await asyncio.wait_for(stopping, 5)
        finally:
            client.writer.close()
            await server.stop(None)

    asyncio.run(main())
