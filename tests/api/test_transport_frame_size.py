"""The native transport takes frames up to the size it advertised as soon as the peer may use it.

The server's SETTINGS raise the largest frame it accepts to ``MAX_FRAME_SIZE``; a client may send
frames that large once it has received them, and it acknowledges them in the same write as its
first large DATA frame (grpcio's client does, between tidelog servers). h2 sizes its frame parser
once per read, so the server used to refuse that frame with FRAME_SIZE_ERROR and close the whole
connection.
"""

from __future__ import annotations

import asyncio

from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, SettingsFrame, WindowUpdateFrame
from tests.api.test_transport_goaway import _served

from tidelog.api.transport.h2setup import MAX_FRAME_SIZE
from tidelog.api.transport.messages import frame


def test_a_large_frame_in_the_read_that_acknowledges_the_settings_is_taken() -> None:
    request = b"r" * 40_000  # one read with the ACKs (loopback reads come in 64 KiB)
    assert 16_384 < len(request) < MAX_FRAME_SIZE

    async def main() -> None:
        server, client = await _served()
        try:
            await asyncio.sleep(0.2)  # the server's SETTINGS have arrived (unread: no matter)
            acks = 2 * SettingsFrame(0, flags=["ACK"]).serialize()  # its two SETTINGS frames
            head = HeadersFrame(
                1,
                client.encoder.encode(
                    [
                        (":method", "POST"),
                        (":scheme", "http"),
                        (":path", "/t.T/Echo"),
                        (":authority", "localhost"),
                        ("content-type", "application/grpc"),
                        ("te", "trailers"),
                    ]
                ),
                flags=["END_HEADERS"],
            )
            body = DataFrame(1, frame(request), flags=["END_STREAM"])
            room = b"".join(  # for the echo coming back
                WindowUpdateFrame(stream, window_increment=1 << 20).serialize() for stream in (0, 1)
            )
            client.writer.write(acks + head.serialize() + body.serialize() + room)  # one write
            await client.writer.drain()
            trailers = None
            while trailers is None:
                got = await asyncio.wait_for(client.next(), 5)
                assert got is not None, "the server closed the connection"
                assert not isinstance(got, GoAwayFrame), f"GOAWAY {got.error_code}"
                if isinstance(got, HeadersFrame) and "END_STREAM" in got.flags:
                    trailers = got
            data = b"".join(f.data for f in client.seen if isinstance(f, DataFrame))
            assert data == frame(request)
            assert trailers.decoded[b"grpc-status"] == b"0"  # type: ignore[attr-defined]
        finally:
            client.writer.close()
            await server.stop(None)

    asyncio.run(main())
