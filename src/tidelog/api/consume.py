"""One ``tidelog.v1/Consume`` call: flow permits, seeking, and epoch-stamped batches.

Theory. The client owns the epoch. It raises it before it drops its buffered messages and only
then sends ``Seek(epoch, position)``; the server switches to a reader at the new position and
stamps every batch with the epoch current **when the batch was read**. A batch read before the
seek (even one still in flight, or delayed) therefore carries an older epoch, and the client
drops it; the first batch the client accepts after a seek starts at the seek position. Permits
bound what the server sends: it never reads more than the client granted, and a seek resets the
grant to the amount the seek carries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.api.frames import record_batch
from tidelog.broker import Broker, Partition, StartPosition, StopPosition, SubscribeRequest
from tidelog.broker.subscription import resolve
from tidelog.errors import (
    InvalidArgument,
    TidelogError,
)
from tidelog.log import ForwardReader, ReverseReader

DEFAULT_MAX_MESSAGES = 1000
MAX_BYTES = 1 << 20


class ConsumeSession:
    def __init__(self, broker: Broker, read_delay_s: float = 0.0) -> None:
        self.broker = broker
        self.read_delay_s = read_delay_s
        """Test hook: wait this long between reading a batch and sending it."""
        self.epoch = 0
        self.permits = 0
        self.changed = asyncio.Event()
        self.ended = False
        self.failure: BaseException | None = None

    def _wake(self, _: object) -> None:
        self.changed.set()

    def _reader(
        self, partition: Partition, position: SubscribeRequest
    ) -> ForwardReader | ReverseReader | None:
        bounds = resolve(partition.log, position)
        if bounds.empty:
            return None
        if bounds.reverse:
            return partition.log.reverse_reader(bounds.start_offset)
        return partition.log.forward_reader(bounds.start_offset)

    async def run(
        self, requests: AsyncIterator[v1.ConsumeRequest]
    ) -> AsyncIterator[v1.ConsumeBatch]:
        try:
            first = await anext(requests, None)
        except Exception as error:  # an unparsable frame
            raise InvalidArgument(f"malformed Consume request: {error!r}") from None
        if first is None or first.WhichOneof("kind") != "start":
            raise InvalidArgument("a Consume call starts with a ConsumeStart request")
        start = first.start
        partition = self.broker.partition(start.stream, start.partition)
        reverse = start.reverse
        limit = start.max_messages or DEFAULT_MAX_MESSAGES

        def position(kind: int, offset: int, timestamp: int) -> SubscribeRequest:
            return SubscribeRequest(
                start=StartPosition(kind),
                start_offset=offset,
                start_timestamp=timestamp,
                stop=StopPosition.ON_CANCEL,
                reverse=reverse,
            )

        self.reader = self._reader(
            partition, position(start.start_position, start.start_offset, start.start_timestamp)
        )

        async def pump() -> None:
            try:
                async for request in requests:
                    kind = request.WhichOneof("kind")
                    if kind == "permits":
                        self.permits += request.permits
                    elif kind == "seek":
                        seek = request.seek
                        if seek.epoch <= self.epoch:
                            continue  # a stale seek, from before a newer one
                        self.reader = self._reader(
                            partition, position(seek.position, seek.offset, seek.timestamp)
                        )
                        self.epoch = seek.epoch
                        self.permits = seek.permits
                    else:
                        raise InvalidArgument("ConsumeStart may only open a Consume call")
                    self.changed.set()
            except TidelogError as error:
                self.failure = error
            except Exception as error:  # an unparsable frame
                self.failure = InvalidArgument(f"malformed Consume request: {error!r}")
            finally:
                self.ended = True
                self.changed.set()

        reader_task = asyncio.create_task(pump())
        try:
            while True:
                if self.failure is not None:
                    raise self.failure
                if self.ended:
                    return
                partition.check_serving()
                reader = self.reader
                woken = partition.signal.current()
                if self.permits <= 0 or reader is None or reader.done:
                    self.changed.clear()
                    await self.changed.wait()
                    continue
                epoch = self.epoch
                batch = reader.read(min(self.permits, limit), MAX_BYTES)
                if not batch:
                    if reader.done:  # a reverse read passed the oldest record
                        yield v1.ConsumeBatch(
                            epoch=epoch, batch=v1.RecordBatch(end=v1.END_REASON_OLDEST)
                        )
                        continue
                    # Wait for new data (the partition's commit signal) or a request.
                    self.changed.clear()
                    woken.add_done_callback(self._wake)
                    try:
                        await self.changed.wait()
                    finally:
                        woken.remove_done_callback(self._wake)
                    continue
                if self.read_delay_s:
                    await asyncio.sleep(self.read_delay_s)
                if epoch == self.epoch:
                    self.permits -= len(batch)
                yield v1.ConsumeBatch(epoch=epoch, batch=record_batch(batch))
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader_task
