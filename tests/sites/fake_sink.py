"""A sink's end of one ``Replicate`` stream, in memory: the sender under test says hello, gets the
progress given here, and whatever it writes is kept. The sender's own code runs whole (hello,
what it learns, negotiation, shipping, snapshot requests); only the gRPC channel is replaced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.sites.negotiation import NONE
from tidelog.sites.routed import from_wire
from tidelog.sites.sender import Sender


def progress(**reported: int) -> v1.SinkProgress:
    """A sink's answer to the hello: ``NONE`` for what is not given (as a sink says it; the
    message's own defaults are 0), and packed deltas."""
    fields = dict.fromkeys(
        ("snapshot_started", "snapshot_transferred", "snapshot_applied", "last_processed"), NONE
    )
    return v1.SinkProgress(**{**fields, **reported}, packed_deltas=True)


class FakeCall:
    """The stream: the first read answers the hello with ``progress``; later reads wait for
    :meth:`reply`."""

    def __init__(self, progress: v1.SinkProgress) -> None:
        self.written: list[v1.ReplicationRequest] = []
        self._replies: asyncio.Queue[v1.ReplicationReply] = asyncio.Queue()
        self._replies.put_nowait(v1.ReplicationReply(progress=progress))

    async def write(self, request: v1.ReplicationRequest) -> None:
        self.written.append(request)

    async def read(self) -> v1.ReplicationReply:
        return await self._replies.get()

    def reply(self, reply: v1.ReplicationReply) -> None:
        self._replies.put_nowait(reply)

    def delta_positions(self) -> list[int]:
        """The positions of every delta entry written, in order."""
        return [
            int(at)
            for request in self.written
            if request.HasField("deltas")
            for at in from_wire(request.deltas).positions.tolist()
        ]


class _Channel:
    async def __aenter__(self) -> _Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


@contextmanager
def answering(monkeypatch: pytest.MonkeyPatch, calls: list[FakeCall]) -> Iterator[None]:
    """Every connection a sender makes gets the next of ``calls`` (the last one again once
    they run out)."""
    used = iter(calls)

    def replicate() -> Any:
        return next(used, calls[-1])

    monkeypatch.setattr(grpc.aio, "insecure_channel", lambda address, **_: _Channel())
    monkeypatch.setattr(
        v1_grpc, "TidelogStub", lambda channel: SimpleNamespace(Replicate=replicate)
    )
    yield


async def run_until(sender: Sender, done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Run ``sender`` until ``done()`` holds (or the time is up), then stop it."""
    sender.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await sender.stop()
