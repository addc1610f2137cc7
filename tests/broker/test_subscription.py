"""Subscription lifecycle in-process: RESUMING -> LIVE -> RESUMING, and how pause, read-only,
delete and shutdown end a subscription (with the errors docs/api.md maps to statuses)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tests.broker.brokertools import Partition0, broker_config, running, settle, start_run

from tidelog.api.status import status_of
from tidelog.broker import StartPosition, StopPosition, SubscribeRequest
from tidelog.broker import subscription as subscription_module
from tidelog.broker.subscription import SubscriberState
from tidelog.errors import (
    BrokerClosed,
    PartitionNotFound,
    PartitionPaused,
    PartitionReadonly,
    ReadonlyEnd,
    StopReached,
    StreamDeleted,
    StreamNotFound,
)

EARLIEST = SubscribeRequest(start=StartPosition.EARLIEST)


def test_states_resuming_live_resuming(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            part = Partition0(broker, "s")
            part.append([0, 1, 2], [3])
            subscription = broker.subscribe("s", 0, EARLIEST, max_messages=2)
            assert subscription.state is SubscriberState.RESUMING
            seen: list[tuple[list[int], SubscriberState]] = []

            async def consume() -> None:
                async for batch in subscription.batches():
                    # The generator is suspended at its yield: the state is the one it delivers in.
                    seen.append((batch.offsets.tolist(), subscription.state))

            task = asyncio.create_task(consume())
            await settle(task, subscription)
            assert subscription.state is SubscriberState.LIVE
            assert broker.partition("s", 0).subscribers == 1
            assert seen == [([0, 1], SubscriberState.RESUMING), ([2, 3], SubscriberState.RESUMING)]

            part.append([4])
            for _ in range(100):  # let the woken subscriber read, but not yet settle again
                await asyncio.sleep(0)
                if len(seen) == 3:
                    break
            assert seen[2] == ([4], SubscriberState.RESUMING)
            await settle(task, subscription)
            assert subscription.state is SubscriberState.LIVE

            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert subscription.state is SubscriberState.STOPPED
            assert broker.partition("s", 0).subscribers == 0

    asyncio.run(body())


def test_stop_reached_ends_in_done(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1, 2])
            request = SubscribeRequest(
                start=StartPosition.EARLIEST, stop=StopPosition.OFFSET, stop_offset=1
            )
            run = await start_run(broker, "s", request)
            assert run.task is not None and run.task.done()
            assert isinstance(run.task.exception(), StopReached)
            assert run.offsets == [0, 1]
            assert run.subscription is not None
            assert run.subscription.state is SubscriberState.STOPPED
            assert broker.partition("s", 0).subscribers == 0

    asyncio.run(body())


async def _ended_with(run_task: asyncio.Task[None] | None) -> BaseException | None:
    assert run_task is not None
    try:
        await asyncio.wait_for(asyncio.shield(run_task), 5)
    except BaseException as error:  # the subscription's ending is what the test inspects
        return error
    return None


def test_pause_ends_a_live_subscription(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1])
            run = await start_run(broker, "s", EARLIEST)
            assert run.end().name == "WAITS"
            broker.pause("s", None, resume_all=False)
            error = await _ended_with(run.task)
            assert isinstance(error, PartitionPaused)
            assert status_of(error)[0] is grpc.StatusCode.FAILED_PRECONDITION
            assert run.offsets == [0, 1]
            assert broker.partition("s", 0).subscribers == 0

    asyncio.run(body())


def test_pause_ends_a_subscription_holding_a_batch(tmp_path: Path) -> None:
    """A slow subscriber (suspended with a batch in hand) ends at its next read after a pause."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1, 2, 3, 4])
            subscription = broker.subscribe("s", 0, EARLIEST, max_messages=2)
            batches = subscription.batches()
            first = await batches.__anext__()
            assert first.offsets.tolist() == [0, 1]
            broker.pause("s", None, resume_all=False)
            with pytest.raises(PartitionPaused):
                await batches.__anext__()
            assert subscription.state is SubscriberState.FAILED

    asyncio.run(body())


def test_pause_then_resume_before_the_subscriber_runs(tmp_path: Path) -> None:
    """Pause, then a publish that resumes the partition, both before the live subscriber wakes:
    the subscription was ended by a pause, so it must end with PartitionPaused
    (FAILED_PRECONDITION), not with the closed log's LogClosed (UNAVAILABLE, "shutting down")."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1])
            run = await start_run(broker, "s", EARLIEST)
            broker.pause("s", None, resume_all=False)
            await broker.publish("s", 0, [b"wakes the partition"])  # resumes it
            error = await _ended_with(run.task)
            assert isinstance(error, PartitionPaused), repr(error)

    asyncio.run(body())


def test_readonly_ends_a_live_subscription_once_caught_up(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1])
            run = await start_run(broker, "s", EARLIEST)
            assert run.end().name == "WAITS"
            broker.set_readonly("s", None, True)
            error = await _ended_with(run.task)
            assert isinstance(error, ReadonlyEnd)
            assert status_of(error) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "end of readonly partition",
            )
            assert run.offsets == [0, 1]

    asyncio.run(body())


def test_readonly_partition_delivers_everything_then_ends(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0, 1, 2], [3, 4])
            broker.set_readonly("s", None, True)
            with pytest.raises(PartitionReadonly, match="readonly partition"):
                await broker.publish("s", 0, [b"refused"])
            forward = await start_run(broker, "s", EARLIEST)
            assert isinstance(await _ended_with(forward.task), ReadonlyEnd)
            assert forward.offsets == [0, 1, 2, 3, 4]
            # A stop inside the partition is reached first.
            stop = SubscribeRequest(
                start=StartPosition.OFFSET,
                start_offset=1,
                stop=StopPosition.OFFSET,
                stop_offset=2,
            )
            bounded = await start_run(broker, "s", stop)
            assert isinstance(await _ended_with(bounded.task), StopReached)
            assert bounded.offsets == [1, 2]
            # Reverse subscriptions end as usual (OK) after the oldest message.
            reverse = await start_run(
                broker, "s", SubscribeRequest(start=StartPosition.LATEST, reverse=True)
            )
            assert await _ended_with(reverse.task) is None
            assert reverse.offsets == [4, 3, 2, 1, 0]
            # Clearing the flag makes it writable and endless again.
            broker.set_readonly("s", None, False)
            assert list((await broker.publish("s", 0, [b"accepted"])).offsets) == [5]
            live = await start_run(broker, "s", EARLIEST)
            assert live.end().name == "WAITS"
            assert live.offsets == [0, 1, 2, 3, 4, 5]
            await live.cancel()

    asyncio.run(body())


def test_delete_ends_a_subscription(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0])
            run = await start_run(broker, "s", EARLIEST)
            await broker.delete_stream("s")
            error = await _ended_with(run.task)
            assert isinstance(error, StreamDeleted)
            assert status_of(error)[0] is grpc.StatusCode.NOT_FOUND
            with pytest.raises(StreamNotFound):
                broker.subscribe("s", 0, EARLIEST)

    asyncio.run(body())


def test_drain_ends_subscriptions_as_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            broker.create_stream("t")
            Partition0(broker, "s").append([0])
            runs = [await start_run(broker, name, EARLIEST) for name in ("s", "t")]
            broker.drain()
            for run in runs:
                error = await _ended_with(run.task)
                assert isinstance(error, BrokerClosed)
                assert status_of(error)[0] is grpc.StatusCode.UNAVAILABLE
            # Publishing continues until close.
            assert list((await broker.publish("s", 0, [b"late"])).offsets) == [1]

    asyncio.run(body())


def test_subscribe_errors_come_before_anything_is_delivered(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            Partition0(broker, "s").append([0])
            with pytest.raises(StreamNotFound):
                broker.subscribe("nope", 0, EARLIEST)
            with pytest.raises(PartitionNotFound):
                broker.subscribe("s", 1, EARLIEST)
            with pytest.raises(PartitionNotFound):
                broker.subscribe("s", -1, EARLIEST)
            broker.pause("s", None, resume_all=False)
            with pytest.raises(PartitionPaused) as paused:
                broker.subscribe("s", 0, EARLIEST)
            assert status_of(paused.value)[0] is grpc.StatusCode.FAILED_PRECONDITION
            assert broker.partition("s", 0).paused
            resumed = broker.subscribe("s", 0, EARLIEST, resume=True)
            assert not broker.partition("s", 0).paused
            batches = resumed.batches()
            assert (await batches.__anext__()).offsets.tolist() == [0]
            await batches.aclose()

    asyncio.run(body())


def test_cancelling_one_live_subscriber_leaves_the_others_alone(tmp_path: Path) -> None:
    """Live subscribers of one partition wait on the same commit signal; a client going away
    (its task cancelled) must not end or stall the others."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            part = Partition0(broker, "s")
            part.append([0])
            runs = [await start_run(broker, "s", EARLIEST) for _ in range(3)]
            await runs[1].cancel()
            part.append([1, 2])
            for run in (runs[0], runs[2]):
                assert run.task is not None and run.subscription is not None
                await settle(run.task, run.subscription)
                assert run.end().name == "WAITS", run.task
                assert run.offsets == [0, 1, 2]
            assert broker.partition("s", 0).subscribers == 2
            for run in runs:
                await run.cancel()

    asyncio.run(body())


def test_the_broker_arms_its_delivery_delay_only_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read loop's test fault point (docs/operations.md) is armed by ``Broker.start`` from
    ``TIDELOG_TEST_READ_DELAY_S``, and stays off without it."""
    monkeypatch.setattr(subscription_module, "faults", subscription_module.DeliveryFaults())

    async def start_and_close(data_dir: Path) -> None:
        async with running(broker_config(data_dir)):
            pass

    monkeypatch.delenv("TIDELOG_TEST_READ_DELAY_S", raising=False)
    asyncio.run(start_and_close(tmp_path / "off"))
    assert subscription_module.faults.delivery_delay_s == 0.0

    monkeypatch.setenv("TIDELOG_TEST_READ_DELAY_S", "0.25")
    asyncio.run(start_and_close(tmp_path / "on"))
    assert subscription_module.faults.delivery_delay_s == 0.25
