"""The hand-over from catching up to live, raced: several publishers append batches of random size
at random moments while subscribers join at random points (EARLIEST, an acknowledged OFFSET, or
NEW_ONLY / LATEST). Every subscriber must see a gap-free, duplicate-free, ordered run of offsets
that ends at the last one and whose values are exactly what the acknowledgements say is there.

Bounded: 20,000 messages per scenario (two scenarios); a 30 s guard turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import grpc
import pytest
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import AsyncClient

TOTAL = 20_000
PUBLISHERS = 4
SUBSCRIBERS = 10
GUARD_S = 30.0


@dataclass
class Model:
    """What the acknowledgements say the partition holds."""

    values: dict[int, bytes] = field(default_factory=dict)

    async def reached(self, count: int) -> None:
        while len(self.values) < count:  # polls the model only; bounded by the test's guard
            await asyncio.sleep(0.001)


async def publisher(client: AsyncClient, model: Model, number: int, rng: random.Random) -> None:
    share = TOTAL // PUBLISHERS
    sent = 0
    while sent < share:
        size = min(rng.choice((1, 1, 2, 7, 50, 300, 900)), share - sent)
        values = [f"p{number}-{sent + i}".encode() for i in range(size)]
        acks = await client.publish_batch("h", values, partition=0)
        assert [a.offset for a in acks] == list(range(acks[0].offset, acks[0].offset + size))
        for ack, value in zip(acks, values, strict=True):
            assert ack.offset not in model.values, "an offset was acknowledged twice"
            model.values[ack.offset] = value
        sent += size
        await asyncio.sleep(rng.random() * 0.004)


@dataclass
class Received:
    how: str
    start: int | None
    """The offset the subscription had to start at, when that is fixed at subscribe time."""
    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)


async def client_subscriber(address: str, model: Model, how: str, start_at: int) -> Received:
    await model.reached(start_at)
    start: str | int
    if how == "offset":
        start = max(model.values)  # an acknowledged offset (the newest so far)
    else:
        start = {"earliest": "earliest", "new": "new", "latest": "latest"}[how]
    got = Received(f"client-{how}", start if isinstance(start, int) else None)
    if how == "earliest":
        got.start = 0
    async with AsyncClient(address) as client:
        # Half of them stop on their own at the last offset; the others are cancelled there.
        stop = TOTAL - 1 if start_at % 2 else None
        async for m in client.subscribe("h", start=start, stop=stop):
            got.offsets.append(m.offset)
            got.values.append(m.value)
            if m.offset >= TOTAL - 1:
                break
    return got


async def raw_subscriber(address: str, model: Model, how: str, start_at: int) -> Received:
    await model.reached(start_at)
    request = pb.SubscribeRequest(stream="h")
    got = Received(f"raw-{how}", None)
    if how == "offset":
        request.startPosition = pb.OFFSET
        request.startOffset = got.start = max(model.values)
    elif how == "earliest":
        request.startPosition = pb.EARLIEST
        got.start = 0
    else:
        request.startPosition = pb.NEW_ONLY if how == "new" else pb.LATEST
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.APIStub(channel).Subscribe(request)
        first = True
        async for m in call:
            if first:
                assert m == pb.Message(), "the handshake comes first"
                first = False
                continue
            got.offsets.append(m.offset)
            got.values.append(m.value)
            if m.offset >= TOTAL - 1:
                break
        call.cancel()
    return got


def check(got: Received, model: Model) -> None:
    assert got.offsets, f"{got.how}: received nothing"
    first = got.offsets[0]
    if got.start is not None:
        assert first == got.start, f"{got.how}: started at {first}, not {got.start}"
    expected = list(range(first, TOTAL))
    if got.offsets != expected:
        seen = set()
        dupes = [o for o in got.offsets if o in seen or seen.add(o)]  # type: ignore[func-returns-value]
        missing = sorted(set(expected) - set(got.offsets))
        pytest.fail(
            f"{got.how}: {len(got.offsets)} messages from {first}; duplicates {dupes[:5]}, "
            f"missing {missing[:5]}, out of order: {got.offsets != sorted(got.offsets)}"
        )
    wrong = [o for o, v in zip(got.offsets, got.values, strict=True) if model.values[o] != v]
    assert not wrong, f"{got.how}: values differ from the acknowledged ones at {wrong[:5]}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_subscribers_joining_during_publishing_see_every_message_once(
    server: ServerProcess, seed: int
) -> None:
    rng = random.Random(seed)

    async def scenario() -> tuple[Model, list[Received]]:
        model = Model()
        async with AsyncClient(server.address) as client:
            await client.create_stream("h")
            subscribers = []
            for i in range(SUBSCRIBERS):
                how = ("earliest", "offset", "new", "latest")[i % 4]
                start_at = rng.randrange(1, TOTAL - 1000)  # joins while publishing goes on
                run = client_subscriber if i % 2 else raw_subscriber
                subscribers.append(asyncio.create_task(run(server.address, model, how, start_at)))
            await asyncio.gather(
                *(
                    publisher(client, model, p, random.Random(seed * 100 + p))
                    for p in range(PUBLISHERS)
                )
            )
            return model, list(await asyncio.gather(*subscribers))

    async def guarded() -> tuple[Model, list[Received]]:
        return await asyncio.wait_for(scenario(), GUARD_S)

    model, received = asyncio.run(guarded())
    assert sorted(model.values) == list(range(TOTAL)), "acknowledged offsets are dense"
    assert len(received) == SUBSCRIBERS
    for got in received:
        check(got, model)
