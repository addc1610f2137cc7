"""``AsyncClient``: the asyncio client for tidelog.

Control calls use the Liftbridge-compatible ``proto.API`` service; publishing batches and
subscribing use ``tidelog.v1`` (columnar batches, one acknowledgement per batch). The channel
reconnects promptly after the server comes back (``ClientSettings``); whether a failed call is
sent again is one rule for every call (``tidelog.client.retry``), and in a cluster a failed call
moves the client to the partition's new leader (``tidelog.client.leaders``).
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from datetime import datetime
from itertools import accumulate
from types import TracebackType
from typing import Any, TypeVar, overload

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.cluster_calls import ClusterCalls
from tidelog.client.codec import (
    browse_page,
    browse_request,
    decode,
    pack_messages,
    start_fields,
    stop_fields,
)
from tidelog.client.consumer import DEFAULT_PREFETCH, Consumer
from tidelog.client.describe_calls import DescribeCalls
from tidelog.client.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    Unavailable,
    from_rpc_error,
)
from tidelog.client.leaders import LeaderRouter
from tidelog.client.models import (
    Ack,
    Acks,
    BrowsePage,
    Message,
    PartitionInfo,
    ReceivedMessage,
    Start,
    Stop,
    StreamInfo,
)
from tidelog.client.publisher import Publisher
from tidelog.client.retry import (
    CONNECT_WAIT_S,
    NOT_IDEMPOTENT,
    RETRYABLE,
    Attempt,
    Verdict,
    connected,
    removal,
    retrying,
    verdict,
)
from tidelog.client.routing_listener import (
    COMMIT_EVERY,
    DISCOVER_S,
    Callback,
    RoutingListener,
)
from tidelog.client.settings import ClientSettings
from tidelog.client.site_calls import SiteCalls
from tidelog.client.snapshot_provider import BATCH_BYTES as SNAPSHOT_BATCH_BYTES
from tidelog.client.snapshot_provider import BATCH_ENTRIES as SNAPSHOT_BATCH_ENTRIES
from tidelog.client.snapshot_provider import Provide, SnapshotProvider
from tidelog.client.view_calls import View, ViewCalls
from tidelog.wire import CURSORS_STREAM, DEFAULT_HOST, DEFAULT_PORT, MAX_FRAME, columns

T = TypeVar("T")

DEFAULT_SERVER = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
"""Where a client connects when told nothing: a server started with its defaults."""
PUBLISH_CHUNK = 1000
"""``publish_batch`` sends at most this many messages per request."""


class AsyncClient(ViewCalls, SiteCalls, DescribeCalls, ClusterCalls):
    """A connection to one tidelog server. Use ``async with AsyncClient(...)`` or ``close()``.

    ``settings``: reconnect backoff and retry budget (``ClientSettings``; the defaults suit a
    server on loopback or a LAN)."""

    def __init__(
        self, server: str = DEFAULT_SERVER, *, settings: ClientSettings | None = None
    ) -> None:
        self.server = server
        self.settings = settings or ClientSettings()
        self._channel = grpc.aio.insecure_channel(server, options=self.settings.grpc_options())
        self._api = pb_grpc.APIStub(self._channel)
        self._v1 = v1_grpc.TidelogStub(self._channel)
        self._partition_counts: dict[str, int] = {}
        self._router = LeaderRouter(server, self._channel, self.settings)
        self._ack_policy = v1.ACK_POLICY_ALL if self.settings.ack_all else v1.ACK_POLICY_LEADER
        """Partitions' leaders, once the server turns out to be one broker of a cluster."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._router.close()
        await self._channel.close()

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        """Run a call, sending it again as ``tidelog.client.retry`` rules (``once``: it must not
        be sent twice once it may have been done, and why). ``route``: the (stream, partition)
        whose leader serves it, looked up before the stream's first call and again when a broker
        refuses it or cannot be reached. Without one, the call goes to the entry broker, and in
        a cluster an attempt that could not reach it moves the call to another broker; so that
        a client knows the other brokers before its given one dies, its first such call looks
        up ``__cursors`` (whose metadata names every broker; cursor calls need it anyway)."""
        if route is None:
            await self._router.ensure(CURSORS_STREAM)  # learns the brokers, in a cluster
            if not self._router.clustered:
                return await retrying(
                    attempt, channel=self._channel, settings=self.settings, timeout=timeout
                )
            return await retrying(
                attempt,
                channel=None,
                settings=self.settings,
                timeout=timeout,
                after_failure=self._entry_failed,
            )
        stream, partition = route
        await self._router.ensure(stream)
        return await retrying(
            attempt,
            channel=None if self._router.clustered else self._channel,
            settings=self.settings,
            timeout=timeout,
            after_failure=self._router.relocator(stream, partition),
            once=once,
        )

    async def _entry_failed(self, error: grpc.RpcError) -> None:
        """A call any broker answers failed at the entry broker: if it could not reach it, the
        next attempt (and every such call after it) goes to another broker."""
        if error.code() in RETRYABLE:
            self._router.entry_failed()
            self._api = self._router.entry_api()
            self._v1 = self._router.entry_v1()

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str,
        *,
        partitions: int = 1,
        subject: str | None = None,
        retention_bytes: int | None = None,
        retention_messages: int | None = None,
        retention_age_s: float | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age_s: float | None = None,
        optimistic_concurrency: bool = False,
        compact: bool = False,
        views: Sequence[View] = (),
        replication_factor: int = 1,
        min_isr: int | None = None,
    ) -> None:
        """Create a stream, then declare ``views`` on it (tables and window indexes).

        In a cluster, ``replication_factor`` brokers keep a copy of each partition (-1: every
        broker) and ``min_isr`` in-sync copies are needed to acknowledge a publish (default: the
        server's); a single broker accepts only 1 (or -1)."""
        request = pb.CreateStreamRequest(
            name=name,
            subject=subject or name,
            partitions=partitions,
            replicationFactor=replication_factor,
        )
        if min_isr is not None:
            request.minIsr.value = min_isr
        if retention_bytes is not None:
            request.retentionMaxBytes.value = retention_bytes
        if retention_messages is not None:
            request.retentionMaxMessages.value = retention_messages
        if retention_age_s is not None:
            request.retentionMaxAge.value = int(retention_age_s * 1000)
        if segment_max_bytes is not None:
            request.segmentMaxBytes.value = segment_max_bytes
        if segment_max_age_s is not None:
            request.segmentMaxAge.value = int(segment_max_age_s * 1000)
        if optimistic_concurrency:
            request.optimisticConcurrencyControl.value = True
        if compact:
            request.compactEnabled.value = True

        async def attempt(timeout: float | None, number: int) -> None:
            try:
                await self._api.CreateStream(request, timeout=timeout)
            except grpc.RpcError as error:
                if number == 1 or error.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                await self._created_by_an_earlier_attempt(request, error)

        await self._retrying(attempt)
        self._partition_counts[name] = max(partitions, 1)  # the server reads 0 as 1
        for view in views:
            await self.declare_view(name, view)

    async def _created_by_an_earlier_attempt(
        self, request: pb.CreateStreamRequest, error: grpc.RpcError
    ) -> None:
        """ALREADY_EXISTS after an attempt that went unanswered: that attempt most likely
        created the stream. Accept it when the stream is what was asked for (its partitions and
        subject; retention and segment settings are not in the metadata), else raise."""
        (info,) = await self._metadata([request.name])
        wanted = max(request.partitions, 1)
        if len(info.partitions) == wanted and info.subject == request.subject:
            return
        raise AlreadyExists(
            f"{from_rpc_error(error)}; it has {len(info.partitions)} partitions and subject "
            f"{info.subject!r}, not {wanted} and {request.subject!r} as asked (an earlier attempt "
            f"of this call went unanswered while the server was unreachable)"
        )

    async def delete_stream(self, name: str) -> None:
        """Delete a stream. NOT_FOUND from a retry, after an attempt that went unanswered while
        the server was unreachable, counts as deleted (by that attempt)."""

        request = pb.DeleteStreamRequest(name=name)
        await self._retrying(
            removal(lambda timeout: self._api.DeleteStream(request, timeout=timeout))
        )
        self._partition_counts.pop(name, None)

    async def pause_stream(
        self, name: str, partitions: Sequence[int] | None = None, *, resume_all: bool = False
    ) -> None:
        """Pause partitions (all when ``partitions`` is None): their files are closed until a
        message is published to one, which resumes it (or, with ``resume_all``, every partition
        paused here)."""
        request = pb.PauseStreamRequest(
            name=name, partitions=list(partitions or ()), resumeAll=resume_all
        )

        async def attempt(timeout: float | None, number: int) -> None:
            await self._api.PauseStream(request, timeout=timeout)

        await self._retrying(attempt)

    async def set_stream_readonly(
        self, name: str, readonly: bool = True, partitions: Sequence[int] | None = None
    ) -> None:
        """Make partitions (all when ``partitions`` is None) read-only (publishes are refused),
        or writable again with ``readonly=False``."""
        request = pb.SetStreamReadonlyRequest(
            name=name, partitions=list(partitions or ()), readonly=readonly
        )

        async def attempt(timeout: float | None, number: int) -> None:
            await self._api.SetStreamReadonly(request, timeout=timeout)

        await self._retrying(attempt)

    async def list_streams(self) -> list[StreamInfo]:
        """Every stream, internal ones (``__cursors``) included, sorted by name."""
        return await self._metadata([])

    async def stream_info(self, name: str) -> StreamInfo:
        found = await self._metadata([name])
        return found[0]

    async def _metadata(self, names: list[str]) -> list[StreamInfo]:
        request = pb.FetchMetadataRequest(streams=names)

        async def attempt(timeout: float | None, number: int) -> pb.FetchMetadataResponse:
            return await self._api.FetchMetadata(request, timeout=timeout)

        response = await self._retrying(attempt)
        self._router.learn(response)
        infos = []
        for meta in response.streamMetadata:
            if meta.error == pb.StreamMetadata.UNKNOWN_STREAM:
                raise NotFound(f"no such stream: {meta.name!r}")
            parts = tuple(_partition_info(p) for _, p in sorted(meta.partitions.items()))
            self._partition_counts[meta.name] = len(parts)
            infos.append(StreamInfo(meta.name, meta.subject, meta.creationTimestamp, parts))
        return infos

    async def partition_info(self, stream: str, partition: int = 0) -> PartitionInfo:
        """One partition as its leader sees it (``FetchPartitionMetadata``): in a cluster its
        high watermark is the leader's, where ``stream_info`` may answer from a follower whose
        high watermark trails by a fetch."""
        request = pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)

        async def attempt(timeout: float | None, number: int) -> pb.FetchPartitionMetadataResponse:
            answer: pb.FetchPartitionMetadataResponse = await self._router.api(
                stream, partition
            ).FetchPartitionMetadata(request, timeout=timeout)
            return answer

        return _partition_info((await self._retrying(attempt, route=(stream, partition))).metadata)

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

    # -- publishing ------------------------------------------------------------------------------

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

    def consumer(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        reverse: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        name: str = "consumer",
    ) -> Consumer:
        """A consumer with prefetch, flow permits and safe seeking (``tidelog.v1/Consume``):
        ``async with client.consumer(...) as c``, then ``await c.receive(timeout=...)``,
        ``await c.seek(offset=...)``, ``await c.commit()`` (cursor ``name``).

        In a cluster it opens at the partition's leader, looked up when it opens; a consumer
        whose leader goes away ends (``Unavailable``, or a refusal as not the leader), and the
        next one opens at the new leader."""
        router = self._router

        async def route() -> Any:
            await router.ensure(stream)
            return router.v1(stream, partition)

        return Consumer(
            route,
            self.set_cursor,
            stream,
            partition,
            start=start,
            reverse=reverse,
            prefetch=prefetch,
            name=name,
            failed=router.relocator(stream, partition),
        )

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

    # -- subscribing -----------------------------------------------------------------------------

    async def open_subscription(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
        max_messages: int = 0,
    ) -> AsyncGenerator[v1.RecordBatch, None]:
        """Open a subscription now (the server's handshake is awaited, so errors raise here and
        ``start="new"`` means new from this call on); iterate the result for the batches.

        In a cluster, a forward subscription whose leader goes away (a crash, a new election)
        is opened again on the new leader from the offset after the last one delivered: its
        failure is an attempt that ``tidelog.client.retry`` would send again, and a failed
        attempt to reopen it is sent again likewise, within the retry budget."""
        opened = await self._open_once(
            stream, partition, start, stop, reverse, resume, max_messages
        )
        return self._following(opened, stream, partition, start, stop, reverse, max_messages)

    async def _following(
        self,
        batches: AsyncGenerator[v1.RecordBatch, None],
        stream: str,
        partition: int,
        start: Start,
        stop: Stop,
        reverse: bool,
        max_messages: int,
    ) -> AsyncGenerator[v1.RecordBatch, None]:
        last: int | None = None
        while True:
            try:
                async for batch in batches:
                    if not reverse:
                        last = int.from_bytes(batch.offsets[-8:], "little", signed=True)
                    yield batch
                return
            except grpc.RpcError as error:
                again = verdict(error, routed=True, repeatable=True) is Verdict.AGAIN
                if reverse or not self._router.clustered or not again:
                    raise from_rpc_error(error) from None
                await self._router.after_failure(error, stream, partition)
            finally:
                await batches.aclose()
            batches = await self._open_once(
                stream,
                partition,
                start if last is None else last + 1,
                stop,
                reverse,
                False,
                max_messages,
            )

    async def _open_once(
        self,
        stream: str,
        partition: int,
        start: Start,
        stop: Stop,
        reverse: bool,
        resume: bool,
        max_messages: int,
    ) -> AsyncGenerator[v1.RecordBatch, None]:
        request = v1.SubscribeBatchesRequest(
            stream=stream,
            partition=partition,
            reverse=reverse,
            resume=resume,
            max_messages=max_messages,
            **start_fields(start),
            **stop_fields(stop),
        )

        async def attempt(timeout: float | None, number: int) -> tuple[Any, v1.RecordBatch]:
            call = self._router.v1(stream, partition).SubscribeBatches(request)
            try:
                handshake = await call.read()
            except BaseException:
                call.cancel()
                raise
            if not isinstance(handshake, v1.RecordBatch):  # grpc.aio.EOF
                call.cancel()
                raise Unavailable("the server ended the subscription before it started")
            return call, handshake

        call, handshake = await self._retrying(attempt, route=(stream, partition))
        return _batches(call, handshake)

    async def subscribe_batches(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
        max_messages: int = 0,
    ) -> AsyncGenerator[v1.RecordBatch, None]:
        """Raw columnar batches, for throughput (see ``tidelog.wire.columns``). Lazy: the
        subscription opens at the first iteration (``open_subscription`` opens it at once)."""
        batches = await self.open_subscription(
            stream,
            partition,
            start=start,
            stop=stop,
            reverse=reverse,
            resume=resume,
            max_messages=max_messages,
        )
        try:
            async for batch in batches:
                yield batch
        finally:
            await batches.aclose()

    async def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
    ) -> AsyncIterator[ReceivedMessage]:
        """Messages from one partition, oldest to newest (or newest to oldest with ``reverse``).

        Without ``stop`` a forward subscription waits for new messages until cancelled; a reverse
        one ends after the oldest message.
        """
        async for batch in self.subscribe_batches(
            stream, partition, start=start, stop=stop, reverse=reverse, resume=resume
        ):
            for message in decode(batch, stream, partition):
                yield message

    async def browse(
        self,
        stream: str,
        *,
        limit: int = 50,
        newest_first: bool = True,
        start: datetime | None = None,
        token: str | None = None,
        partitions: Sequence[int] | None = None,
        key: bytes | str | None = None,
        key_prefix: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        contains: bytes | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        max_scan: int | None = None,
        max_scan_seconds: float | None = None,
    ) -> BrowsePage:
        """One page of ``stream`` merged across its partitions (or ``partitions``) in timestamp
        order (ties by partition, then offset), newest first or oldest first, read and filtered
        on the server.

        ``start``: newest first, messages at or before it; oldest first, at or after it (None:
        from the newest / the oldest). ``token``: a previous page's ``next_token``, to continue
        after it in the same direction with the same filters (it overrides ``start``). Filters,
        all of which must hold: ``key`` equals, ``key_prefix``, every ``headers`` name=value,
        the value ``contains`` (text as UTF-8), ``since <= timestamp <= until``. A search stops
        after ``max_scan`` messages or ``max_scan_seconds`` (server defaults 1,000,000 and 5 s)
        with ``budget_exhausted`` set and a token to go on. Unknown stream: NotFound; a bad
        token or argument: InvalidArgument. Naive datetimes are local time."""
        request = browse_request(
            stream,
            limit=limit,
            newest_first=newest_first,
            start=start,
            token=token,
            partitions=partitions,
            key=key,
            key_prefix=key_prefix,
            headers=headers,
            contains=contains,
            since=since,
            until=until,
            max_scan=max_scan,
            max_scan_seconds=max_scan_seconds,
        )

        async def attempt(timeout: float | None, number: int) -> v1.BrowseResponse:
            return await self._v1.Browse(request, timeout=timeout)

        return browse_page(await self._retrying(attempt), stream)

    def routing_listener(
        self,
        client_name: str,
        callback: Callback,
        *,
        commit_every: int = COMMIT_EVERY,
        discover_s: float = DISCOVER_S,
    ) -> RoutingListener:
        """A listener handing ``callback`` every entry other sites sent to ``client_name`` on
        this (sink) server; ``await listener.run()`` (see ``tidelog.client.routing_listener``)."""
        return RoutingListener(
            self, client_name, callback, commit_every=commit_every, discover_s=discover_s
        )

    def snapshot_provider(
        self,
        callback: Provide,
        *,
        batch_entries: int = SNAPSHOT_BATCH_ENTRIES,
        batch_bytes: int = SNAPSHOT_BATCH_BYTES,
    ) -> SnapshotProvider:
        """This (source) site's snapshot provider: ``callback`` returns the application's full
        state for a site that needs it; ``await provider.run()`` (see
        ``tidelog.client.snapshot_provider``)."""
        return SnapshotProvider(
            self, callback, batch_entries=batch_entries, batch_bytes=batch_bytes
        )

    # -- cursors ---------------------------------------------------------------------------------

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        request = pb.SetCursorRequest(
            cursorId=cursor_id, stream=stream, partition=partition, offset=offset
        )

        key = f"{cursor_id},{stream},{partition}".encode()

        async def attempt(timeout: float | None, number: int) -> None:
            await self._cursor_api(key).SetCursor(request, timeout=timeout)

        await self._retrying(attempt, route=await self._cursor_route(key))

    async def _cursor_route(self, key: bytes) -> tuple[str, int]:
        """The ``__cursors`` partition that keeps ``key`` (CRC-32 of it, as the server and
        Liftbridge place it), whose leader takes the call in a cluster. Its leaders are looked
        up before the first cursor call, as a stream's before its first publish: a client that
        never learnt it talks to a cluster could not leave a leader that died."""
        await self._router.ensure(CURSORS_STREAM)
        return CURSORS_STREAM, zlib.crc32(key) % self._router.partition_count(CURSORS_STREAM)

    def _cursor_api(self, key: bytes) -> Any:
        count = self._router.partition_count(CURSORS_STREAM)
        return self._router.api(CURSORS_STREAM, zlib.crc32(key) % count)

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int = 0) -> int:
        """The stored offset, or -1 when the cursor was never set."""
        request = pb.FetchCursorRequest(cursorId=cursor_id, stream=stream, partition=partition)

        key = f"{cursor_id},{stream},{partition}".encode()

        async def attempt(timeout: float | None, number: int) -> pb.FetchCursorResponse:
            answer: pb.FetchCursorResponse = await self._cursor_api(key).FetchCursor(
                request, timeout=timeout
            )
            return answer

        response = await self._retrying(attempt, route=await self._cursor_route(key))
        return int(response.offset)


def _partition_info(p: pb.PartitionMetadata) -> PartitionInfo:
    return PartitionInfo(
        partition=p.id,
        high_watermark=p.highWatermark,
        newest_offset=p.newestOffset,
        paused=p.paused,
        readonly=p.readonly,
        leader=p.leader,
    )


async def _batches(call: Any, first: v1.RecordBatch) -> AsyncGenerator[v1.RecordBatch, None]:
    """The frames of an open subscription call, from ``first``, until its end frame; a failure
    raises its ``grpc.RpcError`` (``_following`` decides what follows)."""
    try:
        batch: object = first
        while isinstance(batch, v1.RecordBatch):  # until grpc.aio.EOF
            if batch.offsets:
                yield batch
            if batch.end:
                return
            batch = await call.read()
    finally:
        call.cancel()


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


__all__ = ["DEFAULT_SERVER", "PUBLISH_CHUNK", "AsyncClient"]
