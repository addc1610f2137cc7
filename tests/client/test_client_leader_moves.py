"""The client follows a partition's leader when it moves (``tidelog.client.leaders``), under
the one retry rule (``tidelog.client.retry``), against two in-process fake brokers that answer
metadata naming a leader the test sets, refuse publishes as non-leaders do, and can be told to
lose a call or be stopped. The real processes are in ``tests/cluster/test_client_failover.py``;
here each case is exact: which broker got which call."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import AsyncClient, ClientSettings, FailedPrecondition, Unavailable
from tidelog.client.retry import NotSent, Status, Verdict, verdict
from tidelog.wire import columns

SETTINGS = ClientSettings(retry_budget_s=5.0, retry_first_backoff_s=0.01)
NOT_LEADER = "Server not partition leader for s/0"


class Fake:
    """Two brokers, ``a`` and ``b``; ``leader`` leads partition 0 of every stream."""

    def __init__(self) -> None:
        self.leader = "a"
        self.ports: dict[str, int] = {}
        self.servers: dict[str, grpc.aio.Server] = {}
        self.brokers: dict[str, FakeBroker] = {}
        self.stored: list[tuple[str, bytes]] = []
        """(broker, value) of every publish stored, in order."""

    def metadata(self, request: pb.FetchMetadataRequest) -> pb.FetchMetadataResponse:
        answer = pb.FetchMetadataResponse(
            brokers=[pb.Broker(id=b, host="127.0.0.1", port=p) for b, p in self.ports.items()]
        )
        for name in request.streams or ["s"]:
            meta = answer.streamMetadata.add(name=name, subject=name)
            meta.partitions[0].id = 0
            meta.partitions[0].leader = self.leader
        return answer

    def address(self, broker: str) -> str:
        return f"127.0.0.1:{self.ports[broker]}"

    async def start(self) -> None:
        for name in ("a", "b"):
            broker = self.brokers[name] = FakeBroker(self, name)
            server = self.servers[name] = grpc.aio.server()
            pb_grpc.add_APIServicer_to_server(broker, server)
            v1_grpc.add_TidelogServicer_to_server(broker, server)
            self.ports[name] = server.add_insecure_port("127.0.0.1:0")
            await server.start()

    async def kill(self, name: str) -> None:
        await self.servers[name].stop(None)

    async def close(self) -> None:
        for server in self.servers.values():
            await server.stop(None)


class FakeBroker(pb_grpc.APIServicer, v1_grpc.TidelogServicer):  # type: ignore[misc]
    def __init__(self, fake: Fake, name: str) -> None:
        self.fake = fake
        self.name = name
        self.calls: Counter[str] = Counter()
        self.lose_next = 0
        """Publishes to store and then answer UNAVAILABLE, as if the answer was lost."""

    async def FetchMetadata(self, request: Any, context: Any) -> pb.FetchMetadataResponse:
        self.calls["FetchMetadata"] += 1
        return self.fake.metadata(request)

    def _store(self, request: v1.PublishBatchRequest) -> v1.PublishBatchResponse:
        values = columns.unpack(request.messages)[0]
        first = len(self.fake.stored)
        self.fake.stored += [(self.name, bytes(v)) for v in values]
        return v1.PublishBatchResponse(first_offset=first, count=len(values))

    def _publish(self, request: v1.PublishBatchRequest) -> v1.PublishBatchResponse | None:
        """The answer to a publish, or None when this broker does not lead the partition."""
        return self._store(request) if self.fake.leader == self.name else None

    async def PublishBatch(self, request: Any, context: Any) -> v1.PublishBatchResponse:
        self.calls["PublishBatch"] += 1
        if self.lose_next:
            self.lose_next -= 1
            self._store(request)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the answer was lost")
        answer = self._publish(request)
        if answer is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, NOT_LEADER)
        return answer

    async def PublishStream(
        self, requests: AsyncIterator[v1.PublishBatchRequest], context: Any
    ) -> AsyncIterator[v1.PublishBatchResponse]:
        self.calls["PublishStream"] += 1
        async for request in requests:
            answer = self._publish(request)
            if answer is None:
                code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
                answer = v1.PublishBatchResponse(error_code=code, error_message=NOT_LEADER)
            yield answer

    async def ListGroups(self, request: Any, context: Any) -> v1.ListGroupsResponse:
        self.calls["ListGroups"] += 1
        return v1.ListGroupsResponse()


def run(body: Callable[[Fake, AsyncClient], Awaitable[None]]) -> Fake:
    async def main() -> Fake:
        fake = Fake()
        await fake.start()
        try:
            async with AsyncClient(fake.address("a"), settings=SETTINGS) as client:
                await asyncio.wait_for(body(fake, client), 30)
        finally:
            await fake.close()
        return fake

    return asyncio.run(main())


def test_a_lost_plain_publish_is_not_sent_again_but_the_next_goes_to_the_new_leader() -> None:
    """Stored, then its answer lost while the leader changed: not sent again (it would be
    stored twice), and the dead leader's route is forgotten, so the next publish goes straight
    to the new leader, which before the fix it reached only when the old one came back or
    refused it."""

    async def body(fake: Fake, client: AsyncClient) -> None:
        await client.publish("s", b"one", partition=0)
        fake.brokers["a"].lose_next = 1
        fake.leader = "b"
        with pytest.raises(Unavailable, match="not retried"):
            await client.publish("s", b"two", partition=0)
        await client.publish("s", b"three", partition=0)
        assert fake.brokers["a"].calls["PublishBatch"] == 2  # never asked again
        assert fake.brokers["b"].calls["PublishBatch"] == 1

    fake = run(body)
    assert fake.stored == [("a", b"one"), ("a", b"two"), ("b", b"three")]  # each once


async def noticed_gone(client: AsyncClient, address: str) -> None:
    """Until the client's channel to ``address`` has seen its connection close. A publish sent
    in the moment before, over the connection that was about to close, counts as lost, never
    as not sent (``test_a_lost_plain_publish_...``)."""
    channel = client._router.channel(address)
    while channel.get_state() == grpc.ChannelConnectivity.READY:
        await asyncio.sleep(0.01)


def test_a_plain_publish_that_could_not_be_sent_goes_to_the_new_leader() -> None:
    """The leader is gone: the publish cannot connect, so nothing was sent and it goes to the
    new leader within the same call, stored once. Likewise a refusal by a broker that no
    longer leads: nothing was stored, it goes to the leader."""

    async def body(fake: Fake, client: AsyncClient) -> None:
        await client.publish_batch("s", [b"one"], partition=0)
        fake.leader = "b"
        await fake.kill("a")
        await noticed_gone(client, fake.address("a"))
        acks = await client.publish_batch("s", [b"two", b"three"], partition=0)
        assert [a.offset for a in acks] == [1, 2]
        fake.leader = "a"  # refused by b, which says a leads, and a is down: gives up
        with pytest.raises(Unavailable, match=r"nothing was sent \(gave up after .* 1 s\)"):
            await client.publish_batch("s", [b"never"], partition=0, timeout=1.0)

    fake = run(body)
    assert fake.stored == [("a", b"one"), ("b", b"two"), ("b", b"three")]


def test_the_publisher_moves_to_the_new_leader_and_sends_no_batch_twice() -> None:
    async def body(fake: Fake, client: AsyncClient) -> None:
        async with client.publisher("s", 0) as publisher:
            assert list((await publisher.publish([b"one"])).offsets) == [0]
            fake.leader = "b"  # a refuses in the stream: nothing stored, not sent again
            with pytest.raises(FailedPrecondition, match="not partition leader"):
                await publisher.publish([b"refused"])
            assert list((await publisher.publish([b"two"])).offsets) == [1]
            fake.leader = "a"
            await fake.kill("b")  # its stream breaks; a leads again
            with contextlib.suppress(Unavailable):  # if the batch went on the broken stream
                await publisher.publish([b"three"])
            assert (await publisher.publish([b"four"])).offsets.start >= 2
        assert fake.brokers["a"].calls["PublishStream"] == 2
        assert fake.brokers["b"].calls["PublishStream"] == 1

    fake = run(body)
    values = [value for _, value in fake.stored]
    assert values[:2] == [b"one", b"two"] and values[-1] == b"four"
    assert b"refused" not in values and len(values) == len(set(values))


def test_calls_any_broker_answers_move_on_when_the_given_broker_dies() -> None:
    async def body(fake: Fake, client: AsyncClient) -> None:
        assert await client.list_groups() == []  # its first call learnt both brokers
        await fake.kill("a")
        assert await client.list_groups() == []
        assert [s.name for s in await client.list_streams()] == ["s"]

    fake = run(body)
    assert fake.brokers["a"].calls["ListGroups"] == 1
    assert fake.brokers["b"].calls["ListGroups"] == 1


UNAVAILABLE = Status(grpc.StatusCode.UNAVAILABLE, "the connection broke")
CANCELLED = Status(grpc.StatusCode.CANCELLED, "the server is shutting down")
REFUSED = Status(grpc.StatusCode.FAILED_PRECONDITION, NOT_LEADER)
READONLY = Status(grpc.StatusCode.FAILED_PRECONDITION, "readonly partition")
LATE = Status(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
NOT_SENT = NotSent("127.0.0.1:1")


@pytest.mark.parametrize(
    ("error", "routed", "repeatable", "expected"),
    [
        (NOT_SENT, False, False, Verdict.AGAIN),  # nothing left the client
        (NOT_SENT, True, False, Verdict.AGAIN),
        (REFUSED, True, False, Verdict.AGAIN),  # the broker did nothing
        (REFUSED, False, True, Verdict.RAISE),  # not routed: the refusal is the answer
        (UNAVAILABLE, True, True, Verdict.AGAIN),
        (CANCELLED, False, True, Verdict.AGAIN),
        (UNAVAILABLE, True, False, Verdict.LOST),  # maybe stored: never twice
        (CANCELLED, True, False, Verdict.LOST),
        (READONLY, True, True, Verdict.RAISE),
        (LATE, True, True, Verdict.RAISE),  # the call's own timeout passed
    ],
)
def test_the_one_rule(
    error: grpc.RpcError, routed: bool, repeatable: bool, expected: Verdict
) -> None:
    assert verdict(error, routed=routed, repeatable=repeatable) is expected
