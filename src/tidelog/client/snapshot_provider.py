"""The source application's snapshot provider: its full state, sent when a site needs it.

When deltas alone cannot bring a remote site up to date (it never received anything and the
queue no longer holds everything since it was declared, retention removed entries it was not
sent, an operator asked with ``tidelog site resync``), the source server writes a snapshot
request to its stream ``__lrq_snapshot_requests``. A :class:`SnapshotProvider` follows that
stream and, for each request, calls the application's callback with a :class:`SnapshotRequest`;
the callback returns (or yields) ``(client_name, payload)`` pairs: the application's whole state
for that site. The provider sends them with ``transmit_snapshot``: a begin, the entries in calls
of at most ``batch_entries`` entries or ``batch_bytes`` bytes, an end. Its position in the
request stream is the cursor ``snapshot-provider``, committed after each request is answered
(or refused as replaced: a request the server no longer waits for is skipped).

What a snapshot covers: every delta up to the position the server noted at its begin; the
callback runs after it. An application that updates its state before it transmits has every
such delta in its state; deltas transmitted while the callback runs are shipped after the
snapshot too (``docs/replication.md``). A callback that raises ends :meth:`run` with its error;
the request is not committed, and the server asks again once the snapshot stalls. A plain
(not ``async``) callback, and the iterable it returns, run in a worker thread: they may block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import json
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tidelog.client.errors import FailedPrecondition, NotFound
from tidelog.wire import SNAPSHOT_REQUESTS

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

LOG = logging.getLogger("tidelog.client")
CURSOR: Final = "snapshot-provider"
BATCH_ENTRIES: Final = 1000
BATCH_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    site_id: str
    """The remote site the snapshot is for."""
    snapshot: int
    """Its id (increasing)."""


Items = Iterable[tuple[str, bytes]] | AsyncIterable[tuple[str, bytes]]
Provide = Callable[[SnapshotRequest], Items | Awaitable[Items]]


class SnapshotProvider:
    def __init__(
        self,
        client: AsyncClient,
        callback: Provide,
        *,
        batch_entries: int = BATCH_ENTRIES,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        self._client = client
        self._callback = callback
        self.batch_entries = batch_entries
        self.batch_bytes = batch_bytes
        self.provided: list[SnapshotRequest] = []
        """The requests answered whole, oldest first (for the application's logs and tests)."""
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the request it is answering."""
        self._stopping.set()

    async def run(self) -> None:
        """Answer snapshot requests until stopped or cancelled; raises what the callback
        raised."""
        committed = await self._client.fetch_cursor(CURSOR, SNAPSHOT_REQUESTS, 0)
        start: Any = committed + 1 if committed >= 0 else "earliest"
        messages = self._client.subscribe(SNAPSHOT_REQUESTS, 0, start=start).__aiter__()
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                following = asyncio.ensure_future(messages.__anext__())
                await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    following.cancel()
                    return
                message = following.result()
                body = json.loads(message.value)
                await self._answer(SnapshotRequest(str(body["site"]), int(body["snapshot"])))
                await self._client.set_cursor(CURSOR, SNAPSHOT_REQUESTS, 0, message.offset)
                if self._stopping.is_set():
                    return
        finally:
            stopping.cancel()

    async def _answer(self, request: SnapshotRequest) -> None:
        calls = self._client
        try:
            await calls.transmit_snapshot(request.site_id, request.snapshot, begin=True)
        except (FailedPrecondition, NotFound) as refused:
            LOG.debug(
                "snapshot %s for site %s: skipped (%s)", request.snapshot, request.site_id, refused
            )
            return
        if inspect.iscoroutinefunction(self._callback):
            items = await self._callback(request)
        else:  # a plain function may block (a lock, a database): not on the client's loop
            items = await asyncio.to_thread(self._callback, request)
            if inspect.isawaitable(items):
                items = await items
        batch: list[tuple[str, bytes]] = []
        size = 0
        try:
            async for item in _each(items, self.batch_entries):
                batch.append(item)
                size += len(item[1])
                if len(batch) >= self.batch_entries or size >= self.batch_bytes:
                    await calls.transmit_snapshot(request.site_id, request.snapshot, batch)
                    batch, size = [], 0
            await calls.transmit_snapshot(request.site_id, request.snapshot, batch, end=True)
        except (FailedPrecondition, NotFound) as refused:  # replaced while it was being sent
            LOG.info(
                "snapshot %s for site %s: given up (%s)", request.snapshot, request.site_id, refused
            )
            return
        self.provided.append(request)


async def _each(items: Items, chunk: int) -> Any:
    """The items, an iterable's taken ``chunk`` at a time in a thread (a generator that reads a
    database must not block the client's loop)."""
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
        return
    iterator = iter(items)
    while taken := await asyncio.to_thread(lambda: list(itertools.islice(iterator, chunk))):
        for item in taken:
            yield item


class SyncSnapshotProvider:
    """The blocking client's provider: it runs on the client's event loop thread, the callback
    in a worker thread. ``start()``, then ``stop()``; or ``with client.snapshot_provider(...):``."""

    def __init__(self, provider: SnapshotProvider, loop: asyncio.AbstractEventLoop) -> None:
        self._provider = provider
        self._loop = loop
        self._future: concurrent.futures.Future[None] | None = None

    @property
    def provided(self) -> list[SnapshotRequest]:
        return self._provider.provided

    def start(self) -> SyncSnapshotProvider:
        self._future = asyncio.run_coroutine_threadsafe(self._provider.run(), self._loop)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop answering (after the request being answered); raises what the callback
        raised."""
        future = self._future
        if future is None:
            return
        self._loop.call_soon_threadsafe(self._provider.stop)
        done, _ = concurrent.futures.wait([future], timeout)
        if not done:
            future.cancel()
            raise TimeoutError(f"the snapshot provider did not stop within {timeout} s")
        future.result()

    def __enter__(self) -> SyncSnapshotProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
