"""Reading from the client: subscriptions (columnar batches or messages), the
:class:`~tidelog.client.consumer.Consumer` with prefetch, seeking and commits, and ``browse``, a
page merged across partitions and filtered on the server.

:class:`SubscribeCalls` is mixed into :class:`~tidelog.client.AsyncClient`. A subscription or a
consumer opens at its partition's leader. In a cluster a forward subscription whose leader goes
away is opened again on the new leader from the offset after the last one delivered, so that it
neither repeats nor skips a message; a reverse subscription or a consumer ends instead, and the
next one opens at the new leader. ``browse`` is a read any broker answers, retried while the
server is unreachable (``tidelog.client.retry``).

A subscription hands out :class:`~tidelog.client.batches.ReceivedBatch` es: a frame's columns as
numpy views, with messages built only when a batch is iterated (``subscribe`` does that for
every batch).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.batches import ReceivedBatch
from tidelog.client.codec import browse_page, browse_request, start_fields, stop_fields
from tidelog.client.consumer import DEFAULT_PREFETCH, Consumer
from tidelog.client.errors import Unavailable, from_rpc_error
from tidelog.client.leaders import LeaderRouter
from tidelog.client.models import BrowsePage, ReceivedMessage, Start, Stop
from tidelog.client.retry import Attempt, Verdict, verdict
from tidelog.wire.received import ReceivedFrame

T = TypeVar("T")


class SubscribeCalls:
    """The subscribing and consuming calls of :class:`~tidelog.client.AsyncClient`."""

    _v1: v1_grpc.TidelogAsyncStub
    _router: LeaderRouter

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        raise NotImplementedError  # provided by AsyncClient

    # CursorCalls provides it. Declared for the type checker only, so that no order of
    # AsyncClient's bases can let a stub here hide the real method.
    if TYPE_CHECKING:

        async def set_cursor(
            self, cursor_id: str, stream: str, partition: int, offset: int
        ) -> None: ...

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
        values: bool = True,
    ) -> AsyncGenerator[ReceivedBatch, None]:
        """Open a subscription now (the server's handshake is awaited, so errors raise here and
        ``start="new"`` means new from this call on); iterate the result for the batches
        (:class:`~tidelog.client.batches.ReceivedBatch`: columns; iterate one for its messages).

        In a cluster, a forward subscription whose leader goes away (a crash, a new election)
        is opened again on the new leader from the offset after the last one delivered: its
        failure is an attempt that ``tidelog.client.retry`` would send again, and a failed
        attempt to reopen it is sent again likewise, within the retry budget."""
        opened = await self._open_once(
            stream, partition, start, stop, reverse, resume, max_messages, values
        )
        return self._following(
            opened, stream, partition, start, stop, reverse, max_messages, values
        )

    async def _following(
        self,
        batches: AsyncGenerator[ReceivedFrame, None],
        stream: str,
        partition: int,
        start: Start,
        stop: Stop,
        reverse: bool,
        max_messages: int,
        values: bool,
    ) -> AsyncGenerator[ReceivedBatch, None]:
        last: int | None = None
        while True:
            try:
                async for frame in batches:
                    batch = ReceivedBatch(frame, stream, partition)
                    if not reverse:
                        last = batch.last_offset
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
                values,
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
        values: bool,
    ) -> AsyncGenerator[ReceivedFrame, None]:
        request = v1.SubscribeBatchesRequest(
            stream=stream,
            partition=partition,
            reverse=reverse,
            resume=resume,
            max_messages=max_messages,
            without_values=not values,
            **start_fields(start),
            **stop_fields(stop),
        )

        async def attempt(timeout: float | None, number: int) -> tuple[Any, bytes]:
            call = self._router.subscribe_frames(stream, partition)(request)
            try:
                handshake = await call.read()
            except BaseException:
                call.cancel()
                raise
            if not isinstance(handshake, bytes):  # grpc.aio.EOF
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
        values: bool = True,
    ) -> AsyncGenerator[ReceivedBatch, None]:
        """Columnar batches, for throughput: each a
        :class:`~tidelog.client.batches.ReceivedBatch`, its columns numpy views of the frame
        received (``offsets``, ``timestamps``, ``values``, ``keys``, ``headers``,
        ``to_arrow()``), its messages built only when it is iterated. Lazy: the subscription
        opens at the first iteration (``open_subscription`` opens it at once).

        ``values=False`` asks the server not to send the value bytes (``without_values``): for
        a reader of offsets, timestamps, keys, headers or value sizes only (the server still
        reads and verifies every record); such a batch's ``values``, ``messages()`` and Arrow
        ``value`` column raise :class:`~tidelog.errors.ValuesOmitted`."""
        batches = await self.open_subscription(
            stream,
            partition,
            start=start,
            stop=stop,
            reverse=reverse,
            resume=resume,
            max_messages=max_messages,
            values=values,
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
            for message in batch.messages():
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
        """One page of ``stream`` merged across its partitions (or ``partitions``) in timestamp
        order (ties by partition, then offset), newest first or oldest first, read and filtered
        on the server.

        ``start``: newest first, messages at or before it; oldest first, at or after it (None:
        from the newest / the oldest). ``token``: a previous page's ``next_token``, to continue
        after it in the same direction with the same filters (it overrides ``start`` and
        ``anchor``). ``anchor``: a message's ``(timestamp ns, partition, offset)``, to start just
        past it in the page's direction (older newest first, newer oldest first), or at it with
        ``include_anchor`` (it overrides ``start``): unlike a time, it tells apart the messages
        sharing a timestamp. ``ReceivedMessage.merge_key`` is one. Filters,
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

        async def attempt(timeout: float | None, number: int) -> v1.BrowseResponse:
            return await self._v1.Browse(request, timeout=timeout)

        return browse_page(await self._retrying(attempt), stream)

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


async def _batches(call: Any, first: bytes) -> AsyncGenerator[ReceivedFrame, None]:
    """The frames of an open subscription call, from ``first``, until its end frame, each found
    in the bytes received (``tidelog.wire.received``: no protobuf parse, no copy of the values);
    a failure raises its ``grpc.RpcError`` (``_following`` decides what follows)."""
    try:
        data: object = first
        while isinstance(data, bytes):  # until grpc.aio.EOF
            frame = ReceivedFrame(data)
            if frame.offsets:
                yield frame
            if frame.end:
                return
            data = await call.read()
    finally:
        call.cancel()


__all__ = ["SubscribeCalls"]
