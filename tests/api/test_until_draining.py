"""A publish stream's requests until the broker drains (``api/draining.py``): every request is
yielded whole or left unread, a drain while the stream waits for its next request ends it with
``BrokerClosed`` at once, a drain while a request is handled ends it before the next is read, and
a cancellation that is not the drain's stays a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tidelog.api.draining import until_draining
from tidelog.errors import BrokerClosed


class Control:
    """The one thing ``until_draining`` asks of a control: a drain callback."""

    def __init__(self, *, draining: bool = False) -> None:
        self.draining = draining
        self.callbacks: set[Callable[[], None]] = set()

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        if self.draining:
            callback()
            return lambda: None
        self.callbacks.add(callback)
        return lambda: self.callbacks.discard(callback)

    def drain(self) -> None:
        self.draining = True
        for callback in list(self.callbacks):
            callback()


class Requests:
    """A request stream the test feeds; ``taken`` counts the requests handed over."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()
        self.taken = 0

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> int:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        self.taken += 1
        return item


async def collect(control: Any, requests: AsyncIterator[int], got: list[int]) -> None:
    async for request in until_draining(control, requests):
        got.append(request)
        await asyncio.sleep(0)  # handled across a turn of the loop


def test_every_request_then_the_end() -> None:
    async def main() -> None:
        control, requests, got = Control(), Requests(), []
        for item in (1, 2, 3, None):
            requests.queue.put_nowait(item)
        await collect(control, requests, got)
        assert got == [1, 2, 3]
        assert not control.callbacks  # withdrawn

    asyncio.run(main())


def test_a_drain_while_waiting_ends_the_stream_and_reads_nothing_more() -> None:
    async def main() -> None:
        control, requests, got = Control(), Requests(), []
        requests.queue.put_nowait(1)
        task = asyncio.create_task(collect(control, requests, got))
        for _ in range(5):
            await asyncio.sleep(0)
        assert got == [1]  # now waiting for the next request
        control.drain()
        requests.queue.put_nowait(2)  # arrives with the drain: never read
        with pytest.raises(BrokerClosed):
            await task
        assert got == [1] and requests.taken == 1 and requests.queue.qsize() == 1
        assert not control.callbacks
        assert task.cancelling() == 0  # the drain's cancellation was taken back

    asyncio.run(main())


def test_a_drain_while_handling_ends_before_the_next_read() -> None:
    async def main() -> None:
        control, requests, got = Control(), Requests(), []
        for item in (1, 2):
            requests.queue.put_nowait(item)
        with pytest.raises(BrokerClosed):
            async for request in until_draining(control, requests):
                got.append(request)
                control.drain()  # while this request is handled
        assert got == [1] and requests.taken == 1

    asyncio.run(main())


def test_already_draining_reads_nothing() -> None:
    async def main() -> None:
        requests = Requests()
        requests.queue.put_nowait(1)
        with pytest.raises(BrokerClosed):
            await collect(Control(draining=True), requests, [])
        assert requests.taken == 0

    asyncio.run(main())


def test_another_cancellation_stays_one() -> None:
    async def main() -> None:
        control, requests, got = Control(), Requests(), []
        task = asyncio.create_task(collect(control, requests, got))
        await asyncio.sleep(0)
        task.cancel()  # the client went away, say
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not control.callbacks

    asyncio.run(main())


def test_a_drain_and_another_cancellation_together_stay_a_cancellation() -> None:
    async def main() -> None:
        control, requests, got = Control(), Requests(), []
        task = asyncio.create_task(collect(control, requests, got))
        await asyncio.sleep(0)
        task.cancel()
        control.drain()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


class Translating(Requests):
    """A stream that turns a cancelled read into an error of its own (as a transport may)."""

    async def __anext__(self) -> int:
        try:
            return await super().__anext__()
        except asyncio.CancelledError:
            raise RuntimeError("the read was cancelled") from None


def test_a_drain_is_a_drain_whatever_the_stream_makes_of_the_cancelled_read() -> None:
    async def main() -> None:
        control, requests, got = Control(), Translating(), []
        task = asyncio.create_task(collect(control, requests, got))
        for _ in range(3):
            await asyncio.sleep(0)
        control.drain()
        with pytest.raises(BrokerClosed):
            await task
        assert task.cancelling() == 0

    asyncio.run(main())
