"""Which calls retry and how (``tidelog.client.retry``), against a scripted in-process server
that answers UNAVAILABLE as told: the outcomes a real outage makes only by chance (an attempt
that was applied but not answered) happen here every time. Plus the retry bookkeeping alone."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import (
    AlreadyExists,
    AsyncClient,
    ClientSettings,
    NotFound,
    Unavailable,
)
from tidelog.client.retry import RetryBudget
from tidelog.wire import columns

FAST = ClientSettings(retry_budget_s=5.0, retry_first_backoff_s=0.01, retry_max_backoff_s=0.05)

Answer = grpc.StatusCode | None
"""What the scripted server does with one call: fail with this code, or (None) answer."""


class Scripted(pb_grpc.APIServicer, v1_grpc.TidelogServicer):  # type: ignore[misc]
    """Answers each call with the next entry of ``script[method]`` (answers normally once the
    script is used up) and counts the calls."""

    def __init__(self, script: dict[str, list[Answer]]) -> None:
        self.script = script
        self.calls: Counter[str] = Counter()
        self.partitions = 1

    async def _next(self, method: str, context: Any) -> None:
        self.calls[method] += 1
        answers = self.script.get(method, [])
        code = answers.pop(0) if answers else None
        if code is not None:
            await context.abort(code, f"scripted {code.name} for {method}")

    async def CreateStream(self, request: Any, context: Any) -> pb.CreateStreamResponse:
        await self._next("CreateStream", context)
        return pb.CreateStreamResponse()

    async def DeleteStream(self, request: Any, context: Any) -> pb.DeleteStreamResponse:
        await self._next("DeleteStream", context)
        return pb.DeleteStreamResponse()

    async def FetchMetadata(self, request: Any, context: Any) -> pb.FetchMetadataResponse:
        await self._next("FetchMetadata", context)
        meta = pb.StreamMetadata(name=request.streams[0], subject=request.streams[0])
        for number in range(self.partitions):
            meta.partitions[number].id = number
        return pb.FetchMetadataResponse(streamMetadata=[meta])

    async def FetchCursor(self, request: Any, context: Any) -> pb.FetchCursorResponse:
        await self._next("FetchCursor", context)
        return pb.FetchCursorResponse(offset=7)

    async def DropView(self, request: Any, context: Any) -> v1.DropViewResponse:
        await self._next("DropView", context)
        return v1.DropViewResponse()

    async def PublishBatch(self, request: Any, context: Any) -> v1.PublishBatchResponse:
        await self._next("PublishBatch", context)
        return v1.PublishBatchResponse(
            first_offset=0, count=len(columns.unpack(request.messages)[0])
        )

    async def SubscribeBatches(self, request: Any, context: Any) -> AsyncIterator[v1.RecordBatch]:
        await self._next("SubscribeBatches", context)
        yield v1.RecordBatch()  # the handshake
        yield v1.RecordBatch(end=v1.END_REASON_STOP)


async def _with_server(
    script: dict[str, list[Answer]],
    body: Callable[[AsyncClient, Scripted], Awaitable[None]],
    settings: ClientSettings = FAST,
) -> Scripted:
    scripted = Scripted(script)
    server = grpc.aio.server()
    pb_grpc.add_APIServicer_to_server(scripted, server)
    v1_grpc.add_TidelogServicer_to_server(scripted, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}", settings=settings) as client:
            await asyncio.wait_for(body(client, scripted), 30)
    finally:
        await server.stop(None)
    return scripted


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_reads_are_retried_until_they_answer() -> None:
    async def body(client: AsyncClient, _: Scripted) -> None:
        assert len((await client.stream_info("s")).partitions) == 1
        assert await client.fetch_cursor("c", "s") == 7
        batches = [b async for b in client.subscribe_batches("s", start="earliest")]
        assert batches == []  # the scripted subscription ends at once, empty

    script: dict[str, list[Answer]] = {
        "FetchCursor": [UNAVAILABLE, UNAVAILABLE],
        # The first call's lookup of __cursors (it learns a cluster's brokers), then
        # stream_info's own call, twice.
        "FetchMetadata": [None, UNAVAILABLE],
        "SubscribeBatches": [UNAVAILABLE],
    }
    calls = asyncio.run(_with_server(script, body))
    assert calls.calls == {"FetchCursor": 3, "FetchMetadata": 3, "SubscribeBatches": 2}


def test_other_errors_are_not_retried() -> None:
    async def body(client: AsyncClient, _: Scripted) -> None:
        with pytest.raises(NotFound):
            await client.fetch_cursor("c", "s")
        with pytest.raises(AlreadyExists):
            await client.create_stream("s")  # on the first attempt: a real conflict
        with pytest.raises(NotFound):
            await client.delete_stream("s")
        with pytest.raises(NotFound):
            await client.drop_view("s", "v")

    script: dict[str, list[Answer]] = {
        "FetchCursor": [grpc.StatusCode.NOT_FOUND],
        "CreateStream": [grpc.StatusCode.ALREADY_EXISTS],
        "DeleteStream": [grpc.StatusCode.NOT_FOUND],
        "DropView": [grpc.StatusCode.NOT_FOUND],
    }
    calls = asyncio.run(_with_server(script, body))
    assert calls.calls == {
        "FetchMetadata": 1,  # the first call's lookup of __cursors
        "FetchCursor": 1,
        "CreateStream": 1,
        "DeleteStream": 1,
        "DropView": 1,
    }


def test_create_after_an_unanswered_attempt_accepts_the_stream_it_asked_for() -> None:
    """UNAVAILABLE, then ALREADY_EXISTS: the first attempt created the stream. Accepted when
    the stream has the partitions and subject asked for, else AlreadyExists saying why."""

    async def body(client: AsyncClient, scripted: Scripted) -> None:
        scripted.partitions = 3
        await client.create_stream("s", partitions=3)
        with pytest.raises(AlreadyExists, match=r"has 3 partitions .* not 2") as different:
            await client.create_stream("s", partitions=2)
        assert "went unanswered" in str(different.value)

    script: dict[str, list[Answer]] = {
        "CreateStream": [UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS] * 2
    }
    calls = asyncio.run(_with_server(script, body))
    assert calls.calls["CreateStream"] == 4


def test_delete_and_drop_after_an_unanswered_attempt_count_not_found_as_done() -> None:
    async def body(client: AsyncClient, _: Scripted) -> None:
        await client.delete_stream("s")
        await client.drop_view("s", "v")

    script: dict[str, list[Answer]] = {
        "DeleteStream": [UNAVAILABLE, grpc.StatusCode.NOT_FOUND],
        "DropView": [UNAVAILABLE, UNAVAILABLE, grpc.StatusCode.NOT_FOUND],
    }
    calls = asyncio.run(_with_server(script, body))
    assert calls.calls == {"FetchMetadata": 1, "DeleteStream": 2, "DropView": 3}


def test_only_idempotent_publishes_are_retried() -> None:
    async def body(client: AsyncClient, _: Scripted) -> None:
        acks = await client.publish_batch(
            "s", [b"a", b"b"], partition=0, producer_id="p", producer_sequence=1
        )
        assert list(acks.offsets) == [0, 1]
        with pytest.raises(Unavailable, match="not retried"):
            await client.publish_batch("s", [b"a"], partition=0)
        with pytest.raises(Unavailable, match="not retried"):
            await client.publish("s", b"a", partition=0)

    script: dict[str, list[Answer]] = {
        "PublishBatch": [UNAVAILABLE, None, UNAVAILABLE, UNAVAILABLE]
    }
    calls = asyncio.run(_with_server(script, body))
    assert calls.calls["PublishBatch"] == 4  # two for the idempotent batch, one each after


def test_a_call_the_server_cancelled_is_retried_like_an_unavailable_one() -> None:
    """A server shutting down cancels the calls it accepted but had not started (gRPC core
    answers CANCELLED, not UNAVAILABLE): a retryable call tries again, the others fail with
    ``Unavailable`` saying what happened, not a bare CANCELLED."""

    async def body(client: AsyncClient, _: Scripted) -> None:
        assert await client.fetch_cursor("c", "s") == 7
        acks = await client.publish_batch(
            "s", [b"a"], partition=0, producer_id="p", producer_sequence=1
        )
        assert list(acks.offsets) == [0]
        with pytest.raises(Unavailable, match="server cancelled the call"):
            await client.publish_batch("s", [b"a"], partition=0)

    cancelled = grpc.StatusCode.CANCELLED
    script: dict[str, list[Answer]] = {
        "FetchCursor": [cancelled],
        "PublishBatch": [cancelled, None, cancelled],
    }
    calls = asyncio.run(_with_server(script, body))
    assert (calls.calls["FetchCursor"], calls.calls["PublishBatch"]) == (2, 3)


def test_a_server_that_keeps_answering_unavailable_is_given_up_on_after_the_budget() -> None:
    """Connected but refusing (a server shutting down): attempts are spaced by the growing
    pause, so a 1 s budget makes a handful of attempts, not thousands."""
    settings = ClientSettings(retry_budget_s=1.0, retry_first_backoff_s=0.05)

    async def body(client: AsyncClient, _: Scripted) -> None:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"gave up after \d+ attempts"):
            await client.fetch_cursor("c", "s")
        assert 0.9 <= time.monotonic() - started < 3

    calls = asyncio.run(_with_server({"FetchCursor": [UNAVAILABLE] * 100}, body, settings))
    # 0.05 + 0.1 + 0.2 + 0.4 = 0.75 s of pauses, then the budget's last 0.25 s: 5 or 6.
    assert 4 <= calls.calls["FetchCursor"] <= 7


def test_retry_budget_pauses_double_up_to_the_cap_and_stop_at_the_deadline() -> None:
    settings = ClientSettings(
        retry_budget_s=2.0, retry_first_backoff_s=0.1, retry_max_backoff_s=0.5
    )
    budget = RetryBudget.start(settings, None, now=100.0)
    assert budget.attempt_timeout(100.0) is None  # no timeout of its own: no deadline
    assert [budget.next_pause(100.0) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert budget.next_pause(101.8) == pytest.approx(0.2)  # never past the deadline
    assert budget.next_pause(102.0) is None
    assert budget.next_pause(150.0) is None


def test_a_call_timeout_is_its_budget_and_bounds_each_attempt() -> None:
    budget = RetryBudget.start(ClientSettings(retry_budget_s=10), 3.0, now=0.0)
    assert budget.deadline == 3.0
    assert budget.attempt_timeout(0.0) == 3.0
    assert budget.attempt_timeout(2.5) == 0.5
    assert budget.attempt_timeout(4.0) == 0.0
    assert budget.next_pause(3.0) is None


def test_settings_become_channel_options_and_are_checked() -> None:
    options = dict(
        ClientSettings(
            reconnect_initial_s=0.2,
            reconnect_max_s=0.5,
            channel_options=(("grpc.keepalive_time_ms", 60_000),),
        ).grpc_options()
    )
    assert options["grpc.initial_reconnect_backoff_ms"] == 200
    assert options["grpc.max_reconnect_backoff_ms"] == 500
    assert options["grpc.min_reconnect_backoff_ms"] == 20_000  # the connect timeout
    assert options["grpc.keepalive_time_ms"] == 60_000
    assert options["grpc.max_receive_message_length"] == 64 << 20
    for bad in (
        {"reconnect_initial_s": 0},
        {"reconnect_initial_s": 2.0, "reconnect_max_s": 1.0},
        {"connect_timeout_s": 0.01},
        {"retry_budget_s": -1},
        {"retry_first_backoff_s": 2.0, "retry_max_backoff_s": 1.0},
    ):
        with pytest.raises(ValueError):
            ClientSettings(**bad)  # type: ignore[arg-type]


def test_calls_routed_to_a_leader_pause_at_most_a_quarter_second(monkeypatch) -> None:
    """A failover ends when the controller elects: routed retries look the leader up again at
    least every 0.25 s, where other calls back off up to ``retry_max_backoff_s``."""
    from tidelog.client import retry

    class Down(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    def run(routed: bool) -> list[float]:
        pauses: list[float] = []

        async def sleep(seconds: float) -> None:
            pauses.append(seconds)

        async def attempt(timeout: float | None, number: int) -> str:
            if number <= 8:
                raise Down()
            return "answered"

        async def relocate(error: grpc.RpcError) -> None:
            pass

        monkeypatch.setattr(retry.asyncio, "sleep", sleep)
        answer = asyncio.run(
            retry.retrying(
                attempt,
                channel=None,
                settings=ClientSettings(retry_budget_s=60),
                after_failure=relocate if routed else None,
            )
        )
        monkeypatch.undo()
        assert answer == "answered"
        return pauses

    assert run(routed=True) == [0.05, 0.1, 0.2, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert run(routed=False) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
