"""``Consumer``: prefetching reads with flow permits and safe seeking (``tidelog.v1/Consume``).

The consumer raises its epoch **before** it drops its buffer and only then tells the server to
seek; every batch the server sends carries the epoch it was read under, and the consumer keeps
only batches of its current epoch. So after ``seek()`` returns, the next message
``receive()`` hands out is the one at the seek position, and nothing read before the seek is
ever handed out, however the seek races with batches in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, Literal

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.codec import decode
from tidelog.client.errors import ClientError, InvalidArgument, Unavailable, from_rpc_error
from tidelog.client.models import ReceivedMessage, Start

DEFAULT_PREFETCH: Final = 1000
"""Messages a consumer lets the server send ahead of ``receive()`` (its flow permits) when not
told otherwise."""

SetCursor = Callable[[str, str, int, int], Awaitable[None]]
"""``set_cursor(cursor_id, stream, partition, offset)``: how ``commit()`` stores its offset."""

Route = Callable[[], Awaitable[v1_grpc.TidelogStub]]
"""Where the consume stream opens: the partition's leader in a cluster (looked up then)."""

Failed = Callable[[grpc.RpcError], Awaitable[None]]
"""Told of the error that ended the consume stream, so the next consumer opens at the leader
the cluster has now."""


def _position(start: Start) -> tuple[int, int, int]:
    """(StartPosition, offset, timestamp) for a start or seek target."""
    if isinstance(start, datetime):
        return v1.START_TIMESTAMP, 0, int(start.timestamp() * 1_000_000_000)
    if isinstance(start, int) and not isinstance(start, bool):
        return v1.START_OFFSET, start, 0
    named = {"earliest": v1.START_EARLIEST, "latest": v1.START_LATEST, "new": v1.START_NEW_ONLY}
    if isinstance(start, str) and start in named:
        return named[start], 0, 0
    raise InvalidArgument(
        f"a position is 'earliest', 'latest', 'new', an offset or a time: {start!r}"
    )


class Consumer:
    """Use ``async with client.consumer(...) as consumer``."""

    def __init__(
        self,
        route: v1_grpc.TidelogStub | Route,
        set_cursor: SetCursor,
        stream: str,
        partition: int,
        *,
        start: Start,
        reverse: bool,
        prefetch: int,
        name: str,
        failed: Failed | None = None,
    ) -> None:
        """``route``: the stub to open the consume stream on, or how to find it when it
        opens; ``failed``: told of the error that ends the stream, if any."""
        self._route = route
        self._failed = failed
        self._set_cursor = set_cursor
        self.stream = stream
        self.partition = partition
        self.name = name
        self._start = start
        self._reverse = reverse
        self._prefetch = max(prefetch, 1)
        self.epoch = 0
        self.last_offset: int | None = None
        """Offset of the last message ``receive()`` handed out."""
        self.at_end = False
        """A reverse consumer passed the oldest message (until the next seek)."""
        self._buffer: deque[tuple[int, ReceivedMessage]] = deque()
        self._ready = asyncio.Event()
        self._taken = 0
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._failure: ClientError | None = None

    async def __aenter__(self) -> Consumer:
        kind, offset, timestamp = _position(self._start)
        stub = await self._route() if callable(self._route) else self._route
        self._call = stub.Consume()  # type: ignore[call-arg]
        await self._write(
            v1.ConsumeRequest(
                start=v1.ConsumeStart(
                    stream=self.stream,
                    partition=self.partition,
                    start_position=kind,  # type: ignore[arg-type]
                    start_offset=offset,
                    start_timestamp=timestamp,
                    reverse=self._reverse,
                )
            )
        )
        await self._write(v1.ConsumeRequest(permits=self._prefetch))
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _write(self, request: v1.ConsumeRequest) -> None:
        try:
            await self._call.write(request)
        except grpc.RpcError as error:
            await self._tell(error)
            raise from_rpc_error(error) from None

    async def _tell(self, error: grpc.RpcError) -> None:
        """Tell ``failed`` (the client's router) of the error that ended the stream."""
        if self._failed is not None and error.code() != grpc.StatusCode.CANCELLED:
            with contextlib.suppress(Exception):  # a lookup that fails is made again
                await self._failed(error)

    async def _read(self) -> None:
        try:
            async for frame in self._call:
                if frame.epoch < self.epoch:
                    continue  # read before the latest seek
                if frame.batch.end:
                    self.at_end = True
                messages = decode(frame.batch, self.stream, self.partition)
                self._buffer.extend((frame.epoch, m) for m in messages)
                self._ready.set()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                self._failure = from_rpc_error(error)
                await self._tell(error)
        finally:
            if self._failure is None:
                self._failure = Unavailable("the consume stream ended")
            self._ready.set()

    async def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next message, or None if none arrives within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            while self._buffer:
                epoch, message = self._buffer.popleft()
                if epoch < self.epoch:
                    continue
                self._taken += 1
                if self._taken * 2 >= self._prefetch:
                    granted, self._taken = self._taken, 0
                    await self._write(v1.ConsumeRequest(permits=granted))
                self.last_offset = message.offset
                return message
            if self._failure is not None and (self._reader is None or self._reader.done()):
                raise self._failure
            self._ready.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), remaining)

    async def seek(
        self,
        offset: int | None = None,
        *,
        timestamp: datetime | None = None,
        to: Literal["earliest", "latest"] | None = None,
    ) -> None:
        """Continue from ``offset``, the first message at or after ``timestamp`` (reverse: at or
        before), or the earliest / latest message. Exactly one target."""
        targets = [t for t in (offset, timestamp, to) if t is not None]
        if len(targets) != 1:
            raise InvalidArgument("seek takes exactly one of offset, timestamp or to")
        kind, position, moment = _position(targets[0])
        self.epoch += 1  # first: anything read under an older epoch is dropped from now on
        self._buffer.clear()
        self._taken = 0
        self.at_end = False
        await self._write(
            v1.ConsumeRequest(
                seek=v1.Seek(
                    epoch=self.epoch,
                    position=kind,  # type: ignore[arg-type]
                    offset=position,
                    timestamp=moment,
                    permits=self._prefetch,
                )
            )
        )

    async def commit(self) -> None:
        """Store the last received offset as cursor ``name`` (FetchCursor reads it back)."""
        if self.last_offset is not None:
            await self._set_cursor(self.name, self.stream, self.partition, self.last_offset)

    async def close(self) -> None:
        if self._call is None:
            return
        call, self._call = self._call, None
        call.cancel()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
