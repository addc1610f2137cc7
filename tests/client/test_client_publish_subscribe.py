"""``Client`` / ``AsyncClient`` publishing and subscribing against a real server."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess

from tidelog.client import AsyncClient, Client, ClientError, Message, ReceivedMessage
from tidelog.client.aio import PUBLISH_CHUNK
from tidelog.client.codec import decode


def _values(messages: list[ReceivedMessage]) -> list[bytes]:
    return [m.value for m in messages]


def test_publish_chooses_the_partition_by_key_hash(server: ServerProcess, stream: str) -> None:
    keys = [f"key-{i}".encode() for i in range(40)]
    with Client(server.address) as creator:
        creator.create_stream(stream, partitions=4)
        assert creator.publish(stream, b"no key").partition == 0
        assert creator.publish(stream, b"explicit", key=b"key-1", partition=3).partition == 3
    # A client that did not create the stream learns the partition count from metadata.
    with Client(server.address) as client:
        acks = [client.publish(stream, k, key=k) for k in keys]
        assert [a.partition for a in acks] == [zlib.crc32(k) % 4 for k in keys]
        assert {a.stream for a in acks} == {stream}
        for number in range(4):
            mine = [k for k in keys if zlib.crc32(k) % 4 == number]
            got = list(client.subscribe(stream, number, start="earliest", stop="latest"))
            extra = {0: [(b"no key", None)], 3: [(b"explicit", b"key-1")]}.get(number, [])
            assert [(m.value, m.key) for m in got] == extra + [(k, k) for k in mine]
            assert [m.offset for m in got] == list(range(len(got)))
            assert [a.offset for a in acks if a.partition == number] == list(
                range(len(extra), len(got))
            )
            info = client.partition_info(stream, number)  # as the partition's leader has it
            assert (info.partition, info.high_watermark, info.newest_offset) == (
                number,
                len(got) - 1,
                len(got) - 1,
            )
            assert info == client.stream_info(stream).partitions[number]


def test_publish_batch_over_1000_messages_is_split_with_dense_acks(
    server: ServerProcess, stream: str
) -> None:
    count = 2 * PUBLISH_CHUNK + 500
    values = [f"m{i}".encode() for i in range(count)]
    with Client(server.address) as client:
        client.create_stream(stream)
        client.publish(stream, b"first")
        acks = client.publish_batch(stream, values)
        assert [(a.stream, a.partition, a.offset) for a in acks] == [
            (stream, 0, 1 + i) for i in range(count)
        ]
        got = list(client.subscribe(stream, start=1, stop="latest"))
        assert _values(got) == values
        # One request is one append with one broker timestamp: the timestamps change exactly
        # where the client cut the batch.
        stamps = [m.timestamp for m in got]
        assert stamps == sorted(stamps)
        cuts = [i for i in range(1, count) if stamps[i] != stamps[i - 1]]
        assert cuts == [PUBLISH_CHUNK, 2 * PUBLISH_CHUNK]


def test_publish_batch_acks_follow_the_messages_across_partitions(
    server: ServerProcess, stream: str
) -> None:
    """One ack per message, in the order of the messages (docs/api.md: ``publish_batch``
    returns ``list[Ack]``, "one ack per message"), also when keys spread them over partitions."""
    messages = [Message(f"v{i}".encode(), key=f"k{i}".encode()) for i in range(30)]
    with Client(server.address) as client:
        client.create_stream(stream, partitions=3)
        acks = client.publish_batch(stream, messages)
        assert len(acks) == len(messages)
        assert [a.partition for a in acks] == [zlib.crc32(m.key or b"") % 3 for m in messages]
        stored = {}
        for number in range(3):
            for m in client.subscribe(stream, number, start="earliest", stop="latest"):
                stored[(number, m.offset)] = m.value
        assert [stored[(a.partition, a.offset)] for a in acks] == [m.value for m in messages]


def test_messages_round_trip_with_keys_and_headers(server: ServerProcess, stream: str) -> None:
    sent = [
        Message(b"plain"),
        Message(b"", key=b"empty value"),
        Message(b"empty key", key=b""),
        Message(b"\x00\xffbinary", key=b"\x00\x01", headers={"h": b"\xff\x00", "empty": b""}),
        Message(b"unicode header", headers={"ключ": "значение".encode()}),
    ]
    with Client(server.address) as client:
        client.create_stream(stream)
        client.publish(stream, b"single", key=b"k", headers={"one": b"1", "two": b"2"})
        client.publish_batch(stream, [b"raw bytes", *sent])
        got = list(client.subscribe(stream, start="earliest", stop="latest"))
    assert [(m.value, m.key, dict(m.headers)) for m in got] == [
        (b"single", b"k", {"one": b"1", "two": b"2"}),
        (b"raw bytes", None, {}),
        *((m.value, m.key, dict(m.headers)) for m in sent),
    ]
    assert {(m.stream, m.partition) for m in got} == {(stream, 0)}
    assert got[0].time.tzinfo is not None
    assert abs(got[0].time.timestamp() - got[0].timestamp / 1e9) < 1e-3


def test_subscribe_forward_and_reverse_with_stops(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        for i in range(10):
            client.publish(stream, f"v{i}".encode())
            if i in (3, 6):
                time.sleep(0.02)  # clear gaps around ts(3)/ts(4) and ts(6)/ts(7)
        every = list(client.subscribe(stream, start="earliest", stop="latest"))
        ts = [m.timestamp for m in every]

        def at(ns: float) -> datetime:
            return datetime.fromtimestamp(ns / 1e9, tz=UTC)

        def offsets(**kwargs: object) -> list[int]:
            return [m.offset for m in client.subscribe(stream, **kwargs)]  # type: ignore[arg-type]

        assert [m.offset for m in every] == list(range(10))
        assert offsets(start=3, stop=5) == [3, 4, 5]
        assert offsets(start="latest", stop="latest") == [9]
        assert offsets(start="earliest", stop=at((ts[6] + ts[7]) / 2)) == list(range(7))
        assert offsets(start=at((ts[3] + ts[4]) / 2), stop=6) == [4, 5, 6]
        assert offsets(reverse=True, start="latest") == list(range(9, -1, -1))
        assert offsets(reverse=True) == list(range(9, -1, -1))  # "new": from the newest
        assert offsets(reverse=True, start=5, stop=2) == [5, 4, 3, 2]
        assert offsets(reverse=True, start=at((ts[6] + ts[7]) / 2)) == list(range(6, -1, -1))
        assert offsets(reverse=True, start="latest", stop=at((ts[3] + ts[4]) / 2)) == [
            9, 8, 7, 6, 5, 4,
        ]  # fmt: skip
        batches = list(client.subscribe_batches(stream, start="earliest", stop="latest"))
        decoded = [m for b in batches for m in decode(b, stream, 0)]
        assert [(m.offset, m.value) for m in decoded] == [(m.offset, m.value) for m in every]


def test_async_client_publishes_and_subscribes(server: ServerProcess, stream: str) -> None:
    async def body() -> None:
        async with AsyncClient(server.address) as client:
            await client.create_stream(stream, partitions=2)
            acks = await client.publish_batch(stream, [b"a", b"b", b"c"], partition=1)
            assert [(a.partition, a.offset) for a in acks] == [(1, 0), (1, 1), (1, 2)]
            ack = await client.publish(stream, b"d", partition=1, headers={"x": b"y"})
            assert (ack.partition, ack.offset) == (1, 3)
            forward = [
                (m.offset, m.value)
                async for m in client.subscribe(stream, 1, start="earliest", stop="latest")
            ]
            assert forward == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
            backward = [m.offset async for m in client.subscribe(stream, 1, reverse=True)]
            assert backward == [3, 2, 1, 0]
            streams = {s.name: s for s in await client.list_streams()}
            assert [p.newest_offset for p in streams[stream].partitions] == [-1, 3]
            assert "__cursors" in streams
            assert await client.fetch_cursor("c", stream, 1) == -1
            await client.set_cursor("c", stream, 1, 2)
            assert await client.fetch_cursor("c", stream, 1) == 2

    asyncio.run(asyncio.wait_for(body(), 60))


def test_live_subscription_gets_messages_published_later(
    server: ServerProcess, stream: str
) -> None:
    with Client(server.address) as client, Client(server.address) as publisher:
        client.create_stream(stream)
        publisher.publish(stream, b"before")
        subscription = client.subscribe(stream, start="earliest")
        assert next(subscription).value == b"before"
        timer = threading.Timer(0.3, lambda: publisher.publish_batch(stream, [b"x", b"y"]))
        timer.start()
        try:
            assert [next(subscription).value for _ in range(2)] == [b"x", b"y"]
        finally:
            timer.join()
            subscription.close()  # cancels the server side


def test_a_stopped_subscriber_does_not_stall_the_next_one(
    server: ServerProcess, stream: str
) -> None:
    """A subscriber that waits for new messages and goes away (breaks out, is cancelled) must not
    stop another subscriber of the same partition from receiving what is published next."""
    with Client(server.address) as client, Client(server.address) as publisher:
        client.create_stream(stream)
        publisher.publish(stream, b"0")
        first = client.subscribe(stream, start="earliest")
        assert next(first).offset == 0
        time.sleep(0.3)  # the server side is now waiting for offset 1
        first.close()
        time.sleep(0.3)
        received: list[int] = []
        second = client.subscribe(stream, start=1)

        def read_one() -> None:
            received.append(next(second).offset)

        reader = threading.Thread(target=read_one, daemon=True)
        reader.start()
        time.sleep(0.5)  # subscribed and waiting, before anything is published
        publisher.publish(stream, b"1")
        reader.join(10)
        alive = reader.is_alive()
        if alive:  # unblock the reader thread: publishing more wakes a working subscriber only
            client.close()
        assert not alive and received == [1], "the waiting subscriber never got offset 1"
        second.close()


def test_context_managers_close_cleanly(server: ServerProcess, stream: str) -> None:
    def client_threads() -> int:
        return sum(t.name == "tidelog-client" for t in threading.enumerate())

    before = client_threads()
    with Client(server.address) as client:
        assert client_threads() == before + 1
        client.create_stream(stream)
        client.publish_batch(stream, [b"a", b"b", b"c"])
        # Leaving a live subscription early closes it; the client stays usable.
        live = client.subscribe(stream, start="earliest")
        assert next(live).value == b"a"
        live.close()
        assert [m.value for m in client.subscribe(stream, start=2, stop="latest")] == [b"c"]
    assert client_threads() == before
    client.close()  # idempotent

    async def body() -> None:
        async with AsyncClient(server.address) as aclient:
            assert len((await aclient.stream_info(stream)).partitions) == 1
            agen = aclient.subscribe(stream, start="earliest")
            assert (await agen.__anext__()).value == b"a"
            await agen.aclose()
        assert aclient._channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN

    asyncio.run(asyncio.wait_for(body(), 30))


def test_datetimes_become_exact_nanoseconds() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from tidelog.client.codec import _ns

    moment = datetime(2026, 11, 22, 3, 0, 0, 123457, tzinfo=UTC)
    assert _ns(moment) == 1_795_316_400_123_457_000  # float arithmetic gives ...024
    plus_two = moment.astimezone(timezone(timedelta(hours=2)))
    assert _ns(plus_two) == _ns(moment)
    naive = datetime(2026, 11, 22, 3, 0, 0, 123457)
    assert _ns(naive) == _ns(naive.astimezone())


def test_a_publish_to_a_hung_server_fails_at_its_deadline_and_an_idempotent_retry_is_safe(
    tmp_path: Path,
) -> None:
    """SIGSTOP freezes the server without closing its socket (a hung broker): a publish with a
    timeout fails with DEADLINE_EXCEEDED instead of waiting forever; once the server runs again,
    retrying the same idempotent batch stores it exactly once."""
    process = ServerProcess(tmp_path / "data").start()
    try:
        with Client(process.address) as client:
            client.create_stream("hung")
            os.kill(process.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(ClientError) as failed:
                    client.publish_batch(
                        "hung", [b"a", b"b"], producer_id="p", producer_sequence=1, timeout=0.5
                    )
                assert failed.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
                assert time.monotonic() - started < 10
            finally:
                os.kill(process.pid, signal.SIGCONT)
            acks = client.publish_batch(
                "hung", [b"a", b"b"], producer_id="p", producer_sequence=1, timeout=10
            )
            values = [m.value for m in client.subscribe("hung", start="earliest", stop="latest")]
            assert values == [b"a", b"b"]
            assert list(acks.offsets) == [0, 1]
    finally:
        process.kill()
