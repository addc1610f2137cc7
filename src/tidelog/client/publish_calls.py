"""Publishing from the client: one message, batches (idempotent with a producer id and
sequence), and the pipelined :class:`~tidelog.client.publisher.Publisher` (``tidelog.v1``:
columnar batches, one acknowledgement per batch), each to its partition's leader.

:class:`PublishCalls` is mixed into :class:`~tidelog.client.AsyncClient`. A publish without a
producer is sent again only when it surely was not stored (its channel could not connect, or a
broker that does not lead the partition refused it): sent and then lost, it could be stored
twice. An idempotent batch is sent again whenever it fails with UNAVAILABLE, since the broker
drops a batch it holds already (``tidelog.client.retry``).
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar, overload

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client.codec import pack_messages
from tidelog.client.errors import InvalidArgument
from tidelog.client.leaders import LeaderRouter
from tidelog.client.models import Ack, Acks, Message, StreamInfo
from tidelog.client.publisher import Publisher
from tidelog.client.retry import CONNECT_WAIT_S, NOT_IDEMPOTENT, Attempt, connected
from tidelog.wire import MAX_FRAME, columns

T = TypeVar("T")

PUBLISH_CHUNK = 1000
"""``publish_batch`` sends at most this many messages per request."""


class PublishCalls:
    """The publishing calls of :class:`~tidelog.client.AsyncClient`."""

    _router: LeaderRouter
    _partition_counts: dict[str, int]
    _ack_policy: v1.AckPolicy.ValueType

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        raise NotImplementedError  # provided by AsyncClient

    # StreamCalls provides it. Declared for the type checker only, so that no order of
    # AsyncClient's bases can let a stub here hide the real method.
    if TYPE_CHECKING:

        async def stream_info(self, name: str) -> StreamInfo: ...

    async def _choose_partition(self, stream: str, key: bytes | None, partition: int | None) -> int:
        """Explicit partition, else CRC-32 of the key over the partitions, else partition 0."""
        if partition is not None:
            return partition
        if key is None:
            return 0
        count = self._partition_counts.get(stream)
        if count is None:
            count = len((await self.stream_info(stream)).partitions)
        return zlib.crc32(key) % count

    async def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Ack:
        """Publish one message; returns where it was stored once the server acknowledged it.
        Sent again only when it surely was not stored, as ``publish_batch`` without a producer
        (so it may wait up to ``settings.retry_budget_s`` for a leader to be reachable); lost
        after it was sent, it raises ``Unavailable`` and the next publish goes to the new
        leader."""
        number = await self._choose_partition(stream, key, partition)
        request = v1.PublishBatchRequest(
            ack_policy=self._ack_policy,
            stream=stream,
            partition=number,
            messages=columns.pack([value], [key], [dict(headers)] if headers else None),
            expected_offset=-1,
        )
        acks = await self._send_chunk(stream, number, request, None)
        return acks[0]

    @overload
    async def publish_batch(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        *,
        partition: int | None = None,
        producer_id: None = None,
        producer_sequence: None = None,
        timeout: float | None = None,
    ) -> Sequence[Ack]: ...
    @overload
    async def publish_batch(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        *,
        partition: int | None = None,
        producer_id: str,
        producer_sequence: int,
        timeout: float | None = None,
    ) -> Acks: ...
    async def publish_batch(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        producer_sequence: int | None = None,
        timeout: float | None = None,
    ) -> Sequence[Ack]:
        """Publish ``messages`` in order (in requests of up to 1,000); one ack per message.

        The acks of each request are a lazy :class:`Acks` sequence (no object per message until
        one is looked at); the result concatenates them.

        With ``partition=None`` every message goes to partition 0, or, when it has a key, to the
        partition its key hashes to (CRC-32 modulo the partition count).

        Idempotent, atomic publishing: give both ``producer_id`` and ``producer_sequence`` (see
        ``docs/api.md``). The batch then goes to one partition in one request, whatever its
        length, and is stored whole or not at all; the result is one :class:`Acks` whose
        ``duplicate`` says the partition held this batch already (its acks are then those of the
        stored batch, or empty when the sequence was below the producer's latest).

        ``timeout``: seconds each request may take before it fails, its retries included (a
        ``ClientError`` with code ``DEADLINE_EXCEEDED``; None: no limit). A request that timed
        out may still have been stored: retry an idempotent batch with the same sequence to find
        out.

        When a request is sent again (``tidelog.client.retry``), for ``timeout`` seconds in all
        or, without one, ``settings.retry_budget_s``:

        - an idempotent batch: whenever it fails with UNAVAILABLE (the broker drops a batch it
          holds already);
        - without a producer, only when it surely was not stored: its channel to the leader
          could not connect, so it was never sent (the leader is down, or a failover is under
          way), or a broker that does not lead the partition refused it. Sent and then lost
          (UNAVAILABLE), it is not sent again, since that could store it twice: it raises
          ``Unavailable`` at once, and in a cluster the client forgets that leader and looks the
          leaders up again, so the next publish goes to the new leader.
        """
        if (producer_id is None) != (producer_sequence is None):
            raise InvalidArgument("give both producer_id and producer_sequence, or neither")
        if producer_id is not None and producer_sequence is not None:
            return await self._publish_idempotent(
                stream, messages, partition, producer_id, producer_sequence, timeout
            )
        keyed = partition is None and any(isinstance(m, Message) and m.key for m in messages)
        if not keyed:
            parts = [
                await self._publish_chunk(
                    stream, partition or 0, messages[i : i + PUBLISH_CHUNK], timeout
                )
                for i in range(0, len(messages), PUBLISH_CHUNK)
            ]
            return parts[0] if len(parts) == 1 else ChainedAcks(parts)
        acks: list[Ack] = []
        for first in range(0, len(messages), PUBLISH_CHUNK):
            chunk = messages[first : first + PUBLISH_CHUNK]
            groups: dict[int, list[int]] = {}
            for i, m in enumerate(chunk):
                key = m.key if isinstance(m, Message) else None
                number = await self._choose_partition(stream, key, partition)
                groups.setdefault(number, []).append(i)
            placed: list[Ack | None] = [None] * len(chunk)
            for number, indexes in groups.items():
                group_acks = await self._publish_chunk(
                    stream, number, [chunk[i] for i in indexes], timeout
                )
                for i, ack in zip(indexes, group_acks, strict=True):
                    placed[i] = ack
            acks += [a for a in placed if a is not None]
        return acks

    async def _publish_idempotent(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        partition: int | None,
        producer_id: str,
        producer_sequence: int,
        timeout: float | None = None,
    ) -> Acks:
        if not messages:
            raise InvalidArgument("an idempotent batch needs at least one message")
        numbers = {
            await self._choose_partition(
                stream, m.key if isinstance(m, Message) else None, partition
            )
            for m in messages
        }
        if len(numbers) > 1:
            raise InvalidArgument(
                f"an idempotent batch is stored in one partition, but these keys hash to "
                f"partitions {sorted(numbers)}; pass partition= or publish one batch per partition"
            )
        (number,) = numbers
        request = v1.PublishBatchRequest(
            ack_policy=self._ack_policy,
            stream=stream,
            partition=number,
            messages=pack_messages(messages),
            expected_offset=-1,
            producer_id=producer_id,
            producer_sequence=producer_sequence,
        )
        size = request.ByteSize()
        if size > MAX_FRAME:
            raise InvalidArgument(
                f"an idempotent batch is sent in one request, and this one is {size} bytes, over "
                f"the {MAX_FRAME}-byte limit of a request; split it into batches with sequences "
                f"of their own"
            )

        target = number

        async def attempt(timeout: float | None, attempt_number: int) -> v1.PublishBatchResponse:
            stub = self._router.v1(stream, target)
            answer: v1.PublishBatchResponse = await stub.PublishBatch(request, timeout=timeout)
            return answer

        response = await self._retrying(attempt, timeout, route=(stream, target))
        first = response.first_offset
        return Acks(
            stream, number, range(first, first + response.count), duplicate=response.duplicate
        )

    async def _publish_chunk(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | Message],
        timeout: float | None = None,
    ) -> Acks:
        packed = pack_messages(messages)
        request = v1.PublishBatchRequest(
            ack_policy=self._ack_policy,
            stream=stream,
            partition=partition,
            messages=packed,
            expected_offset=-1,
        )
        return await self._send_chunk(stream, partition, request, timeout)

    async def _send_chunk(
        self,
        stream: str,
        partition: int,
        request: v1.PublishBatchRequest,
        timeout: float | None,
    ) -> Acks:
        """One request of a publish without a producer, sent once: only over a connected channel
        to the partition's leader, and sent again only when it was not sent (the channel could
        not connect) or was refused by a broker that does not lead the partition. Lost after it
        was sent, it raises ``Unavailable``, and in a cluster the route to that leader is
        forgotten, so the next publish goes to the new one."""

        async def attempt(timeout: float | None, number: int) -> v1.PublishBatchResponse:
            address = self._router.address(stream, partition)
            wait = CONNECT_WAIT_S if timeout is None else min(timeout, CONNECT_WAIT_S)
            await connected(self._router.channel(address), address, wait)
            stub = self._router.v1(stream, partition)
            answer: v1.PublishBatchResponse = await stub.PublishBatch(request, timeout=timeout)
            return answer

        response = await self._retrying(
            attempt, timeout, route=(stream, partition), once=NOT_IDEMPOTENT
        )
        first = response.first_offset
        return Acks(stream, partition, range(first, first + response.count))

    def publisher(self, stream: str, partition: int = 0) -> Publisher:
        """A pipelined publisher for one partition over one long-lived stream (``PublishStream``)
        to its leader: use ``async with client.publisher(...) as p`` and ``await
        p.publish(values)``; many publishes may be in flight at once and are acknowledged in
        order. A batch is never sent twice; after a leader change the next batch goes to the new
        leader (``tidelog.client.publisher``)."""

        async def attempt(timeout: float | None, number: int) -> Any:
            call = self._router.v1(stream, partition).PublishStream()
            try:
                await call.wait_for_connection()  # UNAVAILABLE when it could not be sent
            except BaseException:
                call.cancel()
                raise
            return call

        async def open_call() -> Any:
            return await self._retrying(attempt, route=(stream, partition))

        return Publisher(
            open_call,
            self._router.relocator(stream, partition),
            stream,
            partition,
            self._ack_policy,
        )


class ChainedAcks(Sequence[Ack]):
    """Acks of several requests, in order."""

    def __init__(self, parts: list[Acks]) -> None:
        self._parts = parts
        self._starts = list(accumulate((len(p) for p in parts), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> Ack: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Ack]: ...
    def __getitem__(self, index: int | slice) -> Ack | Sequence[Ack]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("ack index out of range")
        part = bisect.bisect_right(self._starts, index) - 1
        return self._parts[part][index - self._starts[part]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


__all__ = ["PUBLISH_CHUNK", "ChainedAcks", "PublishCalls"]
