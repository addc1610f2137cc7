"""The console's live tail (``console/messages.py``, ``tail``) against a scripted client: it goes
on from the server's token, polls again at once only after a full (or budget-cut) poll, waits
after an empty one, says so when the server is out of reach and goes on from where it was."""

from __future__ import annotations

import asyncio
from typing import Any

from tidelog.client import BrowsePage, ReceivedMessage, Unavailable
from tidelog.console import messages
from tidelog.console.messages import LIVE_END, TAIL_BATCH, TailStep, tail
from tidelog.console.query import MessageQuery


def message(offset: int) -> ReceivedMessage:
    return ReceivedMessage(offset, 7, None, b"v", {}, 0, "s")


class Scripted:
    """Answers ``browse`` from a script (a page, or an error to raise) and records each call."""

    def __init__(self, script: list[BrowsePage | Exception]) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []

    async def browse(self, stream: str, **kwargs: Any) -> BrowsePage:
        self.calls.append(kwargs)
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def page(count: int, token: str | None, exhausted: bool = False) -> BrowsePage:
    return BrowsePage(tuple(message(i) for i in range(count)), token, count, exhausted, None)


async def run(client: Scripted, start: Any, steps: int) -> tuple[list[TailStep], list[float]]:
    waits: list[float] = []
    real_wait_for = asyncio.wait_for

    async def wait_for(awaitable: Any, timeout: float) -> None:
        waits.append(timeout)
        awaitable.close()
        raise TimeoutError

    messages.asyncio.wait_for = wait_for  # type: ignore[assignment]
    got: list[TailStep] = []
    try:
        stream = tail(client, "s", MessageQuery(), start, 0.5, asyncio.Event())  # type: ignore[arg-type]
        async for step in stream:
            got.append(step)
            if len(got) == steps:
                break
    finally:
        messages.asyncio.wait_for = real_wait_for  # type: ignore[assignment]
    return got, waits


def test_a_full_poll_goes_on_at_once_from_its_token_and_an_empty_one_waits() -> None:
    client = Scripted(
        [page(TAIL_BATCH, "t1"), page(3, "t2", exhausted=True), page(0, "t2"), page(0, "t2")]
    )
    steps, waits = asyncio.run(run(client, (5, 0, 9), 4))
    assert client.calls[0]["anchor"] == (5, 0, 9) and client.calls[0]["token"] is None
    assert [c["token"] for c in client.calls[1:]] == ["t1", "t2", "t2"]
    assert [len(s.messages) for s in steps] == [TAIL_BATCH, 3, 0, 0]
    assert steps[0].messages[0].offset == TAIL_BATCH - 1  # newest first
    assert waits == [0.5]  # only after the empty poll (the last step is not waited after)


def test_without_a_row_it_starts_at_the_live_end() -> None:
    client = Scripted([page(0, "t1")])
    asyncio.run(run(client, None, 1))
    assert client.calls[0]["anchor"] == LIVE_END


def test_out_of_reach_it_says_so_and_goes_on_from_its_cursor() -> None:
    client = Scripted([Unavailable("connection refused"), page(1, "t2")])
    steps, waits = asyncio.run(run(client, "t1", 2))
    assert steps[0].trouble is not None and "connection refused" in steps[0].trouble
    assert steps[0].cursor == "t1"
    assert [c["token"] for c in client.calls] == ["t1", "t1"]
    assert waits[0] == messages.TAIL_RETRY_S
    assert len(steps[1].messages) == 1 and steps[1].cursor == "t2"


def test_it_ends_when_nothing_can_come_any_more() -> None:
    client = Scripted([page(2, None)])
    steps, _ = asyncio.run(run(client, "t1", 5))
    assert len(steps) == 1 and len(steps[0].messages) == 2 and steps[0].ended
