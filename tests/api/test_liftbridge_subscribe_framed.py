"""``proto.API/Subscribe`` driven in process with a context that takes Framed (as tidelog's own
transport's does) against one that does not (grpcio's): the handshake first, then the same
messages, in the same order, for catch-up over many batches, reverse reads and live appends;
each Framed holds whole messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.broker.brokertools import broker_config

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.api.framed import Framed
from tidelog.api.liftbridge import LiftbridgeService
from tidelog.api.liftbridge_frames import PREFIX_SIZE
from tidelog.broker import Broker, StreamConfig
from tidelog.control import Advertised, SingleBroker
from tidelog.errors import StopReached
from tidelog.log import NewRecord

GUARD_S = 20.0


class Context:
    """grpcio's side: a context without ``takes_framed``."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class FramedContext(Context):
    takes_framed = True


def records(start: int, count: int) -> list[NewRecord]:
    out = []
    for i in range(start, start + count):
        key = None if i % 3 else f"k{i}".encode()
        headers = {"h": str(i).encode(), "é": b""} if i % 17 == 0 else {}
        out.append(NewRecord(bytes([i % 256]) * (100 if i % 5 else i % 700), key, headers))
    return out


def parsed(items: list[object]) -> tuple[pb.Message, list[pb.Message]]:
    """The handshake and every message after it, Framed split by their prefixes."""
    handshake, *rest = items
    assert isinstance(handshake, pb.Message)
    messages: list[pb.Message] = []
    for item in rest:
        if isinstance(item, pb.Message):
            messages.append(item)
            continue
        assert isinstance(item, Framed)
        data, at, count = bytes(item.data), 0, 0
        while at < len(data):
            assert data[at] == 0
            length = int.from_bytes(data[at + 1 : at + PREFIX_SIZE], "big")
            messages.append(
                pb.Message.FromString(data[at + PREFIX_SIZE : at + PREFIX_SIZE + length])
            )
            at += PREFIX_SIZE + length
            count += 1
        assert at == len(data) and count == item.count
    return handshake, messages


async def collect(call: AsyncIterator[object], messages: int | None = None) -> list[object]:
    """Every item of a call that ends by itself, or (its handshake already taken) its items
    until ``messages`` arrived."""
    items: list[object] = []
    seen = 0
    async with asyncio.timeout(GUARD_S):
        try:
            async for item in call:
                items.append(item)
                seen += item.count if isinstance(item, Framed) else 1
                if messages is not None and seen >= messages:
                    break
        except StopReached:  # a forward read's end after its stop (the guard answers it)
            pass
    await call.aclose()  # type: ignore[attr-defined]
    return items


def test_framed_and_per_message_subscribe_send_the_same_messages(tmp_path: Path) -> None:
    async def scenario() -> None:
        # A small subscriber buffer: catch-up arrives in many batches.
        broker = Broker(broker_config(tmp_path, subscriber_buffer_bytes=16 * 1024))
        await broker.start()
        try:
            broker.create_stream("s", StreamConfig(partitions=2, subject="subj"))
            for partition in (0, 1):
                for start in range(0, 3000, 500):
                    await broker.publish("s", partition, records(start, 500))
            service = LiftbridgeService(SingleBroker(broker, Advertised("b", "127.0.0.1", 1)))

            def call(context: Context, **fields: Any) -> AsyncIterator[object]:
                request = pb.SubscribeRequest(stream="s", **fields)
                return service.Subscribe(request, context)  # type: ignore[arg-type]

            for fields in (
                {"partition": 1, "startPosition": pb.EARLIEST, "stopPosition": pb.STOP_LATEST},
                {"partition": 0, "startPosition": pb.EARLIEST, "stopPosition": pb.STOP_LATEST},
                {"partition": 1, "startPosition": pb.LATEST, "reverse": True},
            ):
                framed_items = await collect(call(FramedContext(), **fields))
                plain_items = await collect(call(Context(), **fields))
                assert any(isinstance(i, Framed) for i in framed_items), fields
                assert not any(isinstance(i, Framed) for i in plain_items), fields
                framed_handshake, framed = parsed(framed_items)
                plain_handshake, plain = parsed(plain_items)
                assert framed_handshake == plain_handshake == pb.Message()
                assert len(framed) == 3000, fields
                assert framed == plain, fields
                assert framed[0].subject == "subj" and framed[0].stream == "s"
                assert [m.partition for m in framed] == [fields["partition"]] * 3000

            # Live: subscribed at the newest message, then more are published.
            live = call(FramedContext(), partition=0, startPosition=pb.NEW_ONLY)
            plain_live = call(Context(), partition=0, startPosition=pb.NEW_ONLY)
            assert isinstance(await anext(live), pb.Message)  # handshakes: subscribed
            assert isinstance(await anext(plain_live), pb.Message)
            got = asyncio.ensure_future(collect(live, 400))
            plain_got = asyncio.ensure_future(collect(plain_live, 400))
            for start in range(3000, 3400, 40):
                await broker.publish("s", 0, records(start, 40))
            _, framed = parsed([pb.Message(), *await got])
            _, plain = parsed([pb.Message(), *await plain_got])
            assert [m.offset for m in framed] == list(range(3000, 3400))
            assert framed == plain
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), 3 * GUARD_S))
