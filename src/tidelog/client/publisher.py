"""``Publisher``: pipelined publishing to one partition over ``PublishStream`` calls.

Theory of operation. Batches are written to one long-lived call to the partition's leader and
answered in order, so the publisher pairs each answer with the oldest batch in flight on that
call. A batch is written once and never again by the publisher: it carries no producer id, and
a batch lost with its call may have been stored (``tidelog.client.retry``, the same rule as a
plain publish). What follows a leader change is the call:

- its broker died or shut down (the call fails, UNAVAILABLE): every batch in flight on it fails
  with ``Unavailable`` (it may have been stored);
- a batch is refused because the broker does not lead the partition (the call stays open): that
  batch fails with ``FailedPrecondition`` (nothing was stored), and the call takes no more;
  it still answers the batches written to it before.

Either way the client's router is told (a leader that cannot be reached is forgotten, the
leaders are looked up again) and the next ``send`` opens a new call at the leader, as every
routed call is opened: opening sends no batch, so it is retried within the retry budget, and a
call that could not be opened raises ``Unavailable`` from that ``send``. A batch whose write
finds the call already ended was not sent: it goes on the new call. Batches on an old call and
on the new one are not ordered against each other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client.codec import pack_messages
from tidelog.client.errors import ClientError, Unavailable, error_for_number
from tidelog.client.leaders import not_leader
from tidelog.client.models import Acks, Message
from tidelog.client.retry import NOT_IDEMPOTENT, Status, lost

OpenCall = Callable[[], Awaitable[Any]]
"""Opens a ``PublishStream`` call at the partition's leader (retried as a routed call)."""
Relocate = Callable[[grpc.RpcError], Awaitable[None]]
"""Tells the client's router why a call takes no more batches (``LeaderRouter.after_failure``)."""


class _Lane:
    """One ``PublishStream`` call and the batches in flight on it, oldest first."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: deque[asyncio.Future[Acks]] = deque()
        self.reader: asyncio.Task[None] | None = None
        self.closed: grpc.RpcError | None = None
        """Why the call takes no more batches (its failure, a not-leader refusal); None: open."""

    async def why_closed(self) -> grpc.RpcError | None:
        if self.closed is None and self.call.done():
            self.closed = Status(await self.call.code(), await self.call.details() or "")
        return self.closed


class Publisher:
    """Publishes batches to one partition, pipelined; use ``async with client.publisher(...)``."""

    def __init__(
        self,
        open_call: OpenCall,
        relocate: Relocate,
        stream: str,
        partition: int,
        ack_policy: v1.AckPolicy.ValueType = v1.ACK_POLICY_LEADER,
    ) -> None:
        self._open_call = open_call
        self._relocate = relocate
        self._ack_policy = ack_policy
        self.stream = stream
        self.partition = partition
        self._lane: _Lane | None = None
        self._retired: list[_Lane] = []
        """Calls that take no more batches, until they have answered those they hold."""
        self._write_lock = asyncio.Lock()

    async def __aenter__(self) -> Publisher:
        async with self._write_lock:
            self._lane = await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, messages: Sequence[bytes | Message]) -> Acks:
        """Send one batch and wait for its acks (other publishes may be in flight meanwhile)."""
        return await (await self.send(messages))

    async def send(self, messages: Sequence[bytes | Message]) -> asyncio.Future[Acks]:
        """Send one batch; the returned future resolves to its acks, or to its error. Raises
        ``Unavailable`` when no call to the leader could be opened, or the batch was lost as it
        was written (not sent again: it may have been stored)."""
        if self._lane is None:
            raise RuntimeError("use the publisher inside 'async with'")
        request = v1.PublishBatchRequest(
            ack_policy=self._ack_policy,
            stream=self.stream,
            partition=self.partition,
            messages=pack_messages(messages),
            expected_offset=-1,
        )
        loop = asyncio.get_running_loop()
        async with self._write_lock:
            while True:
                lane = await self._current()
                future: asyncio.Future[Acks] = loop.create_future()
                lane.pending.append(future)  # before the write: its answer may come at once
                try:
                    await lane.call.write(request)
                    return future
                except asyncio.InvalidStateError:
                    _withdraw(lane, future)  # the call had ended: nothing was sent
                except grpc.RpcError as error:
                    _withdraw(lane, future)
                    lane.closed = error
                    raise lost(error, NOT_IDEMPOTENT) from None

    async def _current(self) -> _Lane:
        """The call batches go to now: a new one at the leader if the last takes no more."""
        lane = self._lane
        assert lane is not None
        why = await lane.why_closed()
        if why is None:
            return lane
        await self._relocate(why)
        self._retired = [old for old in self._retired if old.reader and not old.reader.done()]
        self._retired.append(lane)
        with contextlib.suppress(grpc.RpcError):
            await lane.call.done_writing()
        self._lane = await self._open()
        return self._lane

    async def _open(self) -> _Lane:
        lane = _Lane(await self._open_call())
        lane.reader = asyncio.create_task(self._read_acks(lane))
        return lane

    async def _read_acks(self, lane: _Lane) -> None:
        failure: ClientError | None = None
        try:
            async for response in lane.call:
                future = lane.pending.popleft()
                if response.error_code:
                    refused = error_for_number(response.error_code, response.error_message)
                    refusal = Status(refused.code, response.error_message)
                    if not_leader(refusal):
                        lane.closed = refusal
                    if not future.done():
                        future.set_exception(refused)
                elif not future.done():
                    first = response.first_offset
                    future.set_result(
                        Acks(self.stream, self.partition, range(first, first + response.count))
                    )
        except grpc.RpcError as error:
            if lane.closed is None:
                lane.closed = error
            failure = lost(error, NOT_IDEMPOTENT)
        finally:
            while lane.pending:
                future = lane.pending.popleft()
                if not future.done():
                    future.set_exception(
                        failure or Unavailable("the publish stream ended before this batch")
                    )

    async def close(self) -> None:
        """Wait for every in-flight batch's ack, then end the stream."""
        async with self._write_lock:
            if self._lane is None:
                return
            lanes = [*self._retired, self._lane]
            self._lane, self._retired = None, []
            for lane in lanes:
                with contextlib.suppress(grpc.RpcError):
                    await lane.call.done_writing()
        for lane in lanes:
            if lane.reader is not None:
                await lane.reader


def _withdraw(lane: _Lane, future: asyncio.Future[Acks]) -> None:
    """Take back a batch's future whose write failed: the error is raised, or the batch goes on
    another call, so nobody waits for this future."""
    with contextlib.suppress(ValueError):
        lane.pending.remove(future)
    if future.done():
        if not future.cancelled():
            future.exception()  # retrieved: the failure is reported by ``send``
    else:
        future.cancel()


__all__ = ["Publisher"]
