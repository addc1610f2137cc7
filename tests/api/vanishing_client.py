"""A client that vanishes mid-stream, for ``test_vanishing_clients.py``: run as
``python -m tests.api.vanishing_client ADDRESS STREAM``, it opens a Subscribe from EARLIEST and a
PublishAsync that keeps sending (long correlation ids, so its unread acks fill gRPC's window
soon), reads neither past its first answer, prints ``ready`` and waits
to be killed (SIGKILL: no goodbye on the wire)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc


async def requests(stream: str) -> AsyncIterator[pb.PublishRequest]:
    for n in range(1_000_000):
        yield pb.PublishRequest(
            stream=stream, value=b"v" * 200, ackPolicy=pb.LEADER, correlationId=f"{n:0>1000}"
        )


async def main(address: str, stream: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.APIStub(channel)
        subscribe = stub.Subscribe(pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST))
        await subscribe.read()  # the handshake
        publish = stub.PublishAsync(requests(stream))
        await publish.read()  # one ack: the server is publishing for this call
        print("ready", flush=True)
        await asyncio.sleep(120)  # bounded, but the test kills it long before


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
