"""``Client``: the blocking facade over :class:`AsyncClient`.

It runs one private event loop in a daemon thread and hands every call to it, so a blocking
program (or the CLI) uses exactly the same code path as asyncio programs. Subscriptions cross
the thread boundary one batch at a time, not one message at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from tidelog.client.aio import DEFAULT_SERVER, AsyncClient
from tidelog.client.batches import ReceivedBatch
from tidelog.client.cluster_calls import ClusterStatus, PartitionReplicas
from tidelog.client.consumer import DEFAULT_PREFETCH, Consumer
from tidelog.client.describe_calls import DescribeCalls, SyncDescribeCalls
from tidelog.client.errors import InvalidArgument
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
from tidelog.client.routing_listener import (
    COMMIT_EVERY,
    DISCOVER_S,
    Callback,
    SyncRoutingListener,
)
from tidelog.client.settings import ClientSettings
from tidelog.client.site_calls import SiteCalls, SyncSiteCalls
from tidelog.client.snapshot_provider import BATCH_BYTES as SNAPSHOT_BATCH_BYTES
from tidelog.client.snapshot_provider import BATCH_ENTRIES as SNAPSHOT_BATCH_ENTRIES
from tidelog.client.snapshot_provider import Provide, SyncSnapshotProvider
from tidelog.client.view_calls import SyncViewCalls, ViewCalls

T = TypeVar("T")


class Client(SyncViewCalls, SyncSiteCalls, SyncDescribeCalls):
    """A blocking connection to one tidelog server; use ``with Client(...)`` or ``close()``.

    ``settings``: reconnect backoff and retry budget (``ClientSettings``)."""

    def __init__(
        self, server: str = DEFAULT_SERVER, *, settings: ClientSettings | None = None
    ) -> None:
        self.server = server
        self.settings = settings or ClientSettings()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tidelog-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def connect() -> AsyncClient:
            return AsyncClient(server, settings=self.settings)

        self._client = self._run(connect())

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        tasks: list[asyncio.Task[T]] = []

        async def run() -> T:
            task = asyncio.ensure_future(coroutine)
            tasks.append(task)
            return await task

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted here (Ctrl-C) or failed: make sure the coroutine has really stopped
            # running on the loop (a cancelled future is "done" before its task is) before
            # anything else is handed to the loop.
            future.cancel()
            if tasks and not self._loop.is_closed():

                async def settle() -> None:
                    tasks[0].cancel()
                    with contextlib.suppress(BaseException):
                        await tasks[0]

                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(settle(), self._loop).result(timeout=5)
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():  # a loop still running cannot be closed; it is a daemon
            self._loop.close()

    # -- the same calls as AsyncClient, blocking ---------------------------------------------------

    def create_stream(self, name: str, **settings: Any) -> None:
        self._run(self._client.create_stream(name, **settings))

    def delete_stream(self, name: str) -> None:
        self._run(self._client.delete_stream(name))

    def pause_stream(
        self, name: str, partitions: Sequence[int] | None = None, *, resume_all: bool = False
    ) -> None:
        self._run(self._client.pause_stream(name, partitions, resume_all=resume_all))

    def set_stream_readonly(
        self, name: str, readonly: bool = True, partitions: Sequence[int] | None = None
    ) -> None:
        self._run(self._client.set_stream_readonly(name, readonly, partitions))

    def list_streams(self) -> list[StreamInfo]:
        return self._run(self._client.list_streams())

    def stream_info(self, name: str) -> StreamInfo:
        return self._run(self._client.stream_info(name))

    def partition_leaders(self, stream: str) -> dict[int, str]:
        return self._run(self._client.partition_leaders(stream))

    def partition_info(self, stream: str, partition: int = 0) -> PartitionInfo:
        return self._run(self._client.partition_info(stream, partition))

    def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Ack:
        return self._run(
            self._client.publish(stream, value, key=key, headers=headers, partition=partition)
        )

    @overload
    def publish_batch(
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
    def publish_batch(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        *,
        partition: int | None = None,
        producer_id: str,
        producer_sequence: int,
        timeout: float | None = None,
    ) -> Acks: ...
    def publish_batch(
        self,
        stream: str,
        messages: Sequence[bytes | Message],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        producer_sequence: int | None = None,
        timeout: float | None = None,
    ) -> Sequence[Ack]:
        """See ``AsyncClient.publish_batch`` (idempotent with ``producer_id`` and
        ``producer_sequence``: one request, an ``Acks`` with ``duplicate``; ``timeout`` per
        request)."""
        if producer_id is None and producer_sequence is None:
            return self._run(
                self._client.publish_batch(stream, messages, partition=partition, timeout=timeout)
            )
        if producer_id is None or producer_sequence is None:
            raise InvalidArgument("give both producer_id and producer_sequence, or neither")
        return self._run(
            self._client.publish_batch(
                stream,
                messages,
                partition=partition,
                producer_id=producer_id,
                producer_sequence=producer_sequence,
                timeout=timeout,
            )
        )

    def subscribe_batches(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
        max_messages: int = 0,
        values: bool = True,
    ) -> Iterator[ReceivedBatch]:
        """Columnar batches (see ``AsyncClient.subscribe_batches``; iterate one for its
        messages). The subscription is open when this returns (errors raise here, and
        ``start="new"`` means new from this call on), as with :meth:`open_subscription`."""
        return self.open_subscription(
            stream,
            partition,
            start=start,
            stop=stop,
            reverse=reverse,
            resume=resume,
            max_messages=max_messages,
            values=values,
        )

    def open_subscription(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
        max_messages: int = 0,
        values: bool = True,
    ) -> Iterator[ReceivedBatch]:
        """See ``AsyncClient.open_subscription``: open when this returns; iterate the result for
        the columnar batches (in a cluster a forward one follows a new leader)."""
        batches = self._run(
            self._client.open_subscription(
                stream,
                partition,
                start=start,
                stop=stop,
                reverse=reverse,
                resume=resume,
                max_messages=max_messages,
                values=values,
            )
        )
        return self._iterate(batches)

    def _iterate(self, batches: AsyncGenerator[ReceivedBatch, None]) -> Iterator[ReceivedBatch]:
        async def step() -> ReceivedBatch:
            return await batches.__anext__()

        try:
            while True:
                try:
                    batch = self._run(step())
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            if not self._loop.is_closed():
                # Best effort: after an interruption (Ctrl-C) the generator may still be
                # unwinding on the loop, and an error here would replace the one propagating.
                with contextlib.suppress(Exception):
                    self._run(batches.aclose())

    def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        stop: Stop = None,
        reverse: bool = False,
        resume: bool = False,
    ) -> Iterator[ReceivedMessage]:
        """Messages, one at a time (see ``AsyncClient.subscribe``); open when this returns."""
        batches = self.subscribe_batches(
            stream, partition, start=start, stop=stop, reverse=reverse, resume=resume
        )
        return (m for batch in batches for m in batch.messages())

    def browse(
        self,
        stream: str,
        *,
        limit: int = 50,
        newest_first: bool = True,
        start: datetime | None = None,
        token: str | None = None,
        partitions: Sequence[int] | None = None,
        anchor: tuple[int, int, int] | None = None,
        include_anchor: bool = False,
        key: bytes | str | None = None,
        key_prefix: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        contains: bytes | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        max_scan: int | None = None,
        max_scan_seconds: float | None = None,
    ) -> BrowsePage:
        """One page of ``stream`` merged across partitions (see ``AsyncClient.browse``)."""
        return self._run(
            self._client.browse(
                stream,
                limit=limit,
                newest_first=newest_first,
                start=start,
                token=token,
                partitions=partitions,
                anchor=anchor,
                include_anchor=include_anchor,
                key=key,
                key_prefix=key_prefix,
                headers=headers,
                contains=contains,
                since=since,
                until=until,
                max_scan=max_scan,
                max_scan_seconds=max_scan_seconds,
            )
        )

    def _view_calls(self) -> ViewCalls:
        return self._client

    def _describe_calls(self) -> DescribeCalls:
        return self._client

    def _site_calls(self) -> SiteCalls:
        return self._client

    def transmit_snapshot(
        self,
        site_id: str,
        snapshot: int,
        items: Iterable[tuple[str, bytes]] = (),
        *,
        begin: bool = False,
        end: bool = False,
    ) -> int:
        """See ``AsyncClient.transmit_snapshot`` (the snapshot provider makes these calls)."""
        return self._run(
            self._client.transmit_snapshot(site_id, snapshot, list(items), begin=begin, end=end)
        )

    def routing_listener(
        self,
        client_name: str,
        callback: Callback,
        *,
        commit_every: int = COMMIT_EVERY,
        discover_s: float = DISCOVER_S,
    ) -> SyncRoutingListener:
        """The blocking form of ``AsyncClient.routing_listener``: ``start()`` / ``stop()``, or a
        ``with`` block; the callback runs on the client's event loop thread."""
        listener = self._client.routing_listener(
            client_name, callback, commit_every=commit_every, discover_s=discover_s
        )
        return SyncRoutingListener(listener, self._loop)

    def snapshot_provider(
        self,
        callback: Provide,
        *,
        batch_entries: int = SNAPSHOT_BATCH_ENTRIES,
        batch_bytes: int = SNAPSHOT_BATCH_BYTES,
    ) -> SyncSnapshotProvider:
        """The blocking form of ``AsyncClient.snapshot_provider``: ``start()`` / ``stop()``, or
        a ``with`` block; the callback runs in a worker thread."""
        provider = self._client.snapshot_provider(
            callback, batch_entries=batch_entries, batch_bytes=batch_bytes
        )
        return SyncSnapshotProvider(provider, self._loop)

    def cluster_status(self, stream: str = "") -> ClusterStatus:
        """Brokers, controller, and each partition's replicas and progress (a cluster only)."""
        return self._run(self._client.cluster_status(stream))

    def reassign(self, stream: str, partition: int, replicas: list[str]) -> PartitionReplicas:
        """Start moving a partition to ``replicas``; follow it with :meth:`cluster_status`."""
        return self._run(self._client.reassign(stream, partition, replicas))

    def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        self._run(self._client.set_cursor(cursor_id, stream, partition, offset))

    def fetch_cursor(self, cursor_id: str, stream: str, partition: int = 0) -> int:
        return self._run(self._client.fetch_cursor(cursor_id, stream, partition))

    def consumer(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "new",
        reverse: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        name: str = "consumer",
    ) -> SyncConsumer:
        """The blocking form of ``AsyncClient.consumer``; open when this returns."""
        consumer = self._client.consumer(
            stream, partition, start=start, reverse=reverse, prefetch=prefetch, name=name
        )
        self._run(consumer.__aenter__())
        return SyncConsumer(self, consumer)

    def publisher(self, stream: str, partition: int = 0) -> SyncPublisher:
        """The blocking form of ``AsyncClient.publisher``; open when this returns (use ``with``
        or ``close()``)."""
        publisher = self._client.publisher(stream, partition)
        self._run(publisher.__aenter__())
        return SyncPublisher(self, publisher)


class SyncConsumer:
    """``receive``, ``seek``, ``commit`` and ``close`` of a :class:`Consumer`, blocking."""

    def __init__(self, client: Client, consumer: Consumer) -> None:
        self._client = client
        self._consumer = consumer

    @property
    def last_offset(self) -> int | None:
        return self._consumer.last_offset

    def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        return self._client._run(self._consumer.receive(timeout))

    def seek(
        self,
        offset: int | None = None,
        *,
        timestamp: datetime | None = None,
        to: Literal["earliest", "latest"] | None = None,
    ) -> None:
        self._client._run(self._consumer.seek(offset, timestamp=timestamp, to=to))

    def commit(self) -> None:
        self._client._run(self._consumer.commit())

    def close(self) -> None:
        self._client._run(self._consumer.close())

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPublisher:
    """``publish``, ``send`` and ``close`` of a :class:`~tidelog.client.publisher.Publisher`,
    blocking."""

    def __init__(self, client: Client, publisher: Publisher) -> None:
        self._client = client
        self._publisher = publisher

    def publish(self, messages: Sequence[bytes | Message]) -> Acks:
        """Send one batch and wait for its acks."""
        return self._client._run(self._publisher.publish(messages))

    def send(self, messages: Sequence[bytes | Message]) -> concurrent.futures.Future[Acks]:
        """Send one batch; its acks (or its error) come as the returned future's ``result()``,
        so that several batches are in flight at once."""
        sent = self._client._run(self._publisher.send(messages))

        async def acks() -> Acks:
            return await sent

        return asyncio.run_coroutine_threadsafe(acks(), self._client._loop)

    def close(self) -> None:
        """Wait for every in-flight batch's ack, then end the stream."""
        self._client._run(self._publisher.close())

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
