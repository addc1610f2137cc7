"""The listener's read-ahead inbox without sockets: a ``StreamReader`` fed by hand. A request that
waits is cancelled when the stream ends, bytes that arrive meanwhile (pipelined requests) are
kept in order, reading ahead stops at its bound, and no byte is lost or repeated for any split of
the stream into reads and waits (hypothesis)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.kafka.kafka_wire import run

from tidelog.kafka.inbox import Inbox, PeerClosed


class Waiting:
    """A handler that waits until released, and says whether it was cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled = False

    async def __call__(self) -> str:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "answer"


def test_the_end_of_the_stream_cancels_the_waiting_request() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader)
        handler = Waiting()
        served = asyncio.create_task(inbox.unless_closed(handler()))
        await asyncio.sleep(0.01)
        assert not served.done()
        reader.feed_eof()
        with pytest.raises(PeerClosed):
            await served
        assert handler.cancelled

    run(scenario)


def test_bytes_sent_while_a_request_waits_are_kept_for_the_next_frames() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader)
        handler = Waiting()
        served = asyncio.create_task(inbox.unless_closed(handler()))
        reader.feed_data(b"next-")
        await asyncio.sleep(0.01)
        reader.feed_data(b"request")
        await asyncio.sleep(0.01)
        assert inbox.buffered == len(b"next-request")
        handler.release.set()
        assert await served == "answer" and not handler.cancelled
        reader.feed_data(b"-and-more")
        assert await inbox.readexactly(4) == b"next"
        assert await inbox.readexactly(12) == b"-request-and"  # buffer, then the reader
        assert inbox.buffered == 0
        assert await inbox.readexactly(5) == b"-more"

    run(scenario)


def test_a_stream_that_ends_behind_pipelined_bytes_still_cancels_and_the_bytes_stay() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader)
        handler = Waiting()
        reader.feed_data(b"pipelined")
        reader.feed_eof()
        with pytest.raises(PeerClosed):
            await inbox.unless_closed(handler())
        assert handler.cancelled
        assert await inbox.readexactly(9) == b"pipelined"
        with pytest.raises(asyncio.IncompleteReadError):
            await inbox.readexactly(1)

    run(scenario)


def test_reading_ahead_stops_at_its_bound_and_the_request_goes_on() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader, read_ahead=8)
        handler = Waiting()
        served = asyncio.create_task(inbox.unless_closed(handler()))
        reader.feed_data(b"0123456789abcdef")
        await asyncio.sleep(0.01)
        assert inbox.buffered == 8  # no more is taken from the reader
        reader.feed_eof()  # behind the bound: not seen until the next read
        await asyncio.sleep(0.01)
        assert not served.done()
        handler.release.set()
        assert await served == "answer"
        assert await inbox.readexactly(16) == b"0123456789abcdef"
        with pytest.raises(asyncio.IncompleteReadError):
            await inbox.readexactly(1)

    run(scenario)


def test_cancelling_the_connection_cancels_the_waiting_request() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader)
        handler = Waiting()
        served = asyncio.create_task(inbox.unless_closed(handler()))
        await asyncio.sleep(0.01)
        served.cancel()
        with pytest.raises(asyncio.CancelledError):
            await served
        await asyncio.sleep(0)
        assert handler.cancelled

    run(scenario)


def test_a_request_that_fails_raises_its_own_error() -> None:
    async def failing() -> None:
        raise ValueError("the handler's bug")

    async def scenario() -> None:
        inbox = Inbox(asyncio.StreamReader())
        with pytest.raises(ValueError, match="the handler's bug"):
            await inbox.unless_closed(failing())

    run(scenario)


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=300),
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=20),
    reads=st.lists(st.integers(1, 50), min_size=1, max_size=20),
    waits=st.lists(st.booleans(), min_size=1, max_size=20),
    bound=st.integers(1, 64),
)
def test_no_byte_is_lost_or_repeated_for_any_split_of_reads_and_waits(
    data: bytes, chunks: list[int], reads: list[int], waits: list[bool], bound: int
) -> None:
    async def scenario() -> bytes:
        reader = asyncio.StreamReader()
        inbox = Inbox(reader, read_ahead=bound)

        async def feed() -> None:
            at, i = 0, 0
            while at < len(data):
                size = chunks[i % len(chunks)]
                reader.feed_data(data[at : at + size])
                at, i = at + size, i + 1
                await asyncio.sleep(0)
            reader.feed_eof()

        async def quick() -> None:
            for _ in range(3):
                await asyncio.sleep(0)

        feeding = asyncio.create_task(feed())
        got = bytearray()
        i = 0
        while True:
            if waits[i % len(waits)]:
                # the end may come while it waits: the bytes before it stay
                with contextlib.suppress(PeerClosed):
                    await inbox.unless_closed(quick())
            try:
                got += await inbox.readexactly(reads[i % len(reads)])
            except asyncio.IncompleteReadError as short:
                got += short.partial
                break
            i += 1
        await feeding
        return bytes(got)

    assert run(scenario) == data
