"""One Replicate stream of a sender (``sender.py``): the call, and the task reading the replies.

Invariants: the reader task is the only reader of the call, so it alone hands the sender the
sink's acks (each to ``on_ack``, which may raise to end the stream) and snapshot applies
(``applied`` only rises); once the stream ended, :meth:`Link.check` raises what ended it, so a
sender waiting on the link never outlives its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.sites.negotiation import NONE
from tidelog.sites.routed import RoutedColumns, to_wire
from tidelog.sites.windows import Framed

Call = grpc.aio.StreamStreamCall[v1.ReplicationRequest, v1.ReplicationReply]
REFUSALS: Final = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE}
)
"""How a sink that refuses what it was sent ends the stream (not how a lost one ends)."""


class Link:
    """One Replicate stream: the call, and the task reading the sink's replies."""

    def __init__(self, call: Call, on_ack: Callable[[int], None], *, packed: bool) -> None:
        self.call = call
        self.packed = packed
        """The sink reads packed delta batches (it said so in its progress)."""
        self.applied = NONE
        """The newest snapshot the sink said it applied on this stream."""
        self.changed = asyncio.Event()
        self.reader = asyncio.create_task(self._read(on_ack))

    async def _read(self, on_ack: Callable[[int], None]) -> None:
        while True:
            reply = await self.call.read()
            if not isinstance(reply, v1.ReplicationReply):
                return  # the end of the stream
            if reply.HasField("acked"):
                on_ack(reply.acked)
            elif reply.HasField("snapshot_applied"):
                self.applied = max(self.applied, reply.snapshot_applied)
                self.changed.set()

    def wire(self, batch: Framed[RoutedColumns]) -> v1.DeltaBatch:
        return to_wire(batch.prev, batch.current, batch.entries, packed=self.packed)

    def check(self) -> None:
        """Raise what ended the stream, if it ended."""
        if self.reader.done():
            self.reader.result()
            raise ConnectionError("the sink closed the stream")

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


def describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__
