"""A slow subscriber holds back only itself (docs/api.md: gRPC flow control, pull from the log).

Two subscribers stop reading almost at once (one raw ``proto.API/Subscribe``, one
``tidelog.v1`` through the client) and stay stuck until the publishers and the fast subscribers
are done; ~6 MB are published meanwhile, far beyond what flow control lets the server push ahead.
Then they read slowly and must still get every message exactly once, in order. Bounds are
generous completion guards, not speed checks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import AsyncClient
from tidelog.client.codec import decode

TOTAL = 3000
SIZE = 2048
GUARD_S = 30.0


def value(n: int) -> bytes:
    return f"{n:08d}".encode().ljust(SIZE, b"~")


@dataclass
class Reader:
    name: str
    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)

    def take(self, offset: int, payload: bytes) -> None:
        self.offsets.append(offset)
        self.values.append(payload)

    def check(self, acked: dict[int, bytes]) -> None:
        assert self.offsets == list(range(TOTAL)), f"{self.name}: gaps, duplicates or disorder"
        assert all(acked[o] == v for o, v in zip(self.offsets, self.values, strict=True)), (
            f"{self.name}: a value differs from the acknowledged one"
        )


async def publish(client: AsyncClient, first: int, count: int, acked: dict[int, bytes]) -> None:
    sent = 0
    while sent < count:
        values = [value(first + sent + i) for i in range(min(50, count - sent))]
        for ack, v in zip(
            await client.publish_batch("s", values, partition=0), values, strict=True
        ):
            acked[ack.offset] = v
        sent += len(values)
        await asyncio.sleep(0)


async def fast_client(address: str, reader: Reader) -> None:
    async with AsyncClient(address) as client:
        async for m in client.subscribe("s", start="earliest", stop=TOTAL - 1):
            reader.take(m.offset, m.value)


async def fast_raw(address: str, reader: Reader) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.APIStub(channel).Subscribe(
            pb.SubscribeRequest(stream="s", startPosition=pb.EARLIEST)
        )
        async for m in call:
            if m.value:  # after the handshake
                reader.take(m.offset, m.value)
                if m.offset == TOTAL - 1:
                    break
        call.cancel()


async def slow_raw(address: str, reader: Reader, gate: asyncio.Event, ready: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.APIStub(channel).Subscribe(
            pb.SubscribeRequest(stream="s", startPosition=pb.EARLIEST)
        )
        assert await call.read() == pb.Message()
        while reader.offsets[-1:] != [TOTAL - 1]:
            m = await call.read()
            assert m is not grpc.aio.EOF
            reader.take(m.offset, m.value)
            if len(reader.offsets) == 10:
                ready.set()
                await gate.wait()  # stuck: reads nothing more until the others are done
            elif len(reader.offsets) % 100 == 0:
                await asyncio.sleep(0.002)
        call.cancel()


async def slow_client(
    address: str, reader: Reader, gate: asyncio.Event, ready: asyncio.Event
) -> None:
    async with AsyncClient(address) as client:
        async for batch in client.subscribe_batches(
            "s", start="earliest", stop=TOTAL - 1, max_messages=20
        ):
            for m in decode(batch, "s", 0):
                reader.take(m.offset, m.value)
            if not ready.is_set():
                ready.set()
                await gate.wait()
            else:
                await asyncio.sleep(0.002)


def test_a_stuck_subscriber_holds_back_only_itself(server: ServerProcess) -> None:
    async def scenario() -> None:
        acked: dict[int, bytes] = {}
        gate = asyncio.Event()
        raw_ready, client_ready = asyncio.Event(), asyncio.Event()
        slow = [Reader("slow raw"), Reader("slow client")]
        fast = [Reader("fast client 1"), Reader("fast client 2"), Reader("fast raw")]
        async with AsyncClient(server.address) as client:
            await client.create_stream("s")
            await client.publish_batch("s", [value(i) for i in range(20)], partition=0)
            for ack in range(20):
                acked[ack] = value(ack)
            slow_tasks = [
                asyncio.create_task(slow_raw(server.address, slow[0], gate, raw_ready)),
                asyncio.create_task(slow_client(server.address, slow[1], gate, client_ready)),
            ]
            await asyncio.wait_for(asyncio.gather(raw_ready.wait(), client_ready.wait()), GUARD_S)
            fast_tasks = [
                asyncio.create_task(fast_client(server.address, fast[0])),
                asyncio.create_task(fast_client(server.address, fast[1])),
                asyncio.create_task(fast_raw(server.address, fast[2])),
            ]
            half = (TOTAL - 20) // 2
            publishers = asyncio.gather(
                publish(client, 20, half, acked),
                publish(client, 20 + half, TOTAL - 20 - half, acked),
            )
            await asyncio.wait_for(publishers, GUARD_S)  # publishing was never blocked
            await asyncio.wait_for(asyncio.gather(*fast_tasks), GUARD_S)
            # The stuck ones really were stuck while all that happened.
            assert [len(r.offsets) for r in slow] == [10, 20]
            gate.set()
            await asyncio.wait_for(asyncio.gather(*slow_tasks), GUARD_S)
            assert sorted(acked) == list(range(TOTAL))
            for reader in fast + slow:
                reader.check(acked)

    asyncio.run(scenario())
