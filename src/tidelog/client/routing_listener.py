"""The sink application's side of multi-site replication: every entry sent to a client name,
from every source site, handed to a callback (``docs/replication.md``).

A sink keeps what source site S sent for client name C in the receive queue ``__lrq_recv.C.S``.
A :class:`RoutingListener` follows every receive queue of its client name (it looks for new
sources every ``discover_s``), calls the callback once per entry, in each source's order, and
commits its position in a cursor (``routing-listener:C``, one per receive queue) only after the
callback returned: at most every ``commit_every`` entries, and whenever a queue goes quiet. An
application that crashes, or a callback that raises, is handed the entries after the last commit
again: entries are redelivered, never skipped. The callback should therefore be idempotent for
the last few entries, or keep its own record of positions (each entry carries its position at
its source, which never repeats).

Snapshots. When a source site sends a snapshot (its application's full state), the callback gets
``kind="snapshot_start"`` first (drop what this source sent for this client name: the snapshot
replaces it), then ``"snapshot_entry"`` for each entry, then ``"snapshot_end"``, then the
deltas (``"delta"``) after the position the snapshot covers. Start, entries and end carry the
snapshot's id and its covered position. A start without an end means the transfer broke: another
start follows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tidelog.wire import KIND_HEADER, POSITION_HEADER, RECEIVE_QUEUE_PREFIX, SNAPSHOT_HEADER

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

COMMIT_EVERY: Final = 100
DISCOVER_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class RoutedMessage:
    source_site: str
    client_name: str
    position: int
    """The entry's position in its source site's queue: increasing per source, never reused."""
    payload: bytes
    kind: str = "delta"
    """``delta``, or ``snapshot_start``, ``snapshot_entry``, ``snapshot_end``."""
    snapshot: int = -1
    """The snapshot's id (-1 for a delta)."""


Callback = Callable[[RoutedMessage], Awaitable[None] | None]


class RoutingListener:
    def __init__(
        self,
        client: AsyncClient,
        client_name: str,
        callback: Callback,
        *,
        commit_every: int = COMMIT_EVERY,
        discover_s: float = DISCOVER_S,
    ) -> None:
        self._client = client
        self.client_name = client_name
        self._callback = callback
        self.commit_every = commit_every
        self.discover_s = discover_s
        self.cursor_id = f"routing-listener:{client_name}"
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        """Set when a follower ends (a callback failed) or a stop is asked for."""
        self._stopping = False
        self._errors: list[BaseException] = []
        """What ended a follower (a callback's error first), raised by :meth:`run`."""

    def stop(self) -> None:
        """Ask :meth:`run` to end (on the listener's loop): it stops its followers, commits what
        they handled, and returns, or raises what a callback raised before."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Deliver until cancelled; raises what a callback raised (its entry uncommitted), also
        when it is cancelled after the callback failed."""
        prefix = f"{RECEIVE_QUEUE_PREFIX}{self.client_name}."
        wake = self._wake
        try:
            while not wake.is_set():
                for stream in await self._client.list_streams():
                    if stream.name.startswith(prefix) and stream.name not in self._followers:
                        source = stream.name[len(prefix) :]
                        task = asyncio.create_task(self._follow(stream.name, source))
                        task.add_done_callback(lambda _: wake.set())
                        self._followers[stream.name] = task
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.discover_s)
        finally:
            for task in self._followers.values():
                task.cancel()
            for task in self._followers.values():
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception as error:  # the connection's failure, if not recorded yet
                    if error not in self._errors:
                        self._errors.append(error)
            if self._errors:
                raise self._errors[0]

    async def _follow(self, queue: str, source: str) -> None:
        committed = await self._client.fetch_cursor(self.cursor_id, queue, 0)
        start: Any = committed + 1 if committed >= 0 else "earliest"
        done, pending = committed, 0
        # Batches, read as columns: the entries are made straight from them (no message object
        # each, and one pass over the header lists for the three headers an entry needs).
        batches = self._client.subscribe_batches(queue, 0, start=start).__aiter__()
        following: asyncio.Future[Any] | None = None
        try:
            while True:
                # The same pending read across quiet spells (cancelling it would end the
                # subscription): a quiet spell commits what was handled.
                following = following or asyncio.ensure_future(batches.__anext__())
                ready, _ = await asyncio.wait({following}, timeout=0.2)
                if not ready:
                    if pending:
                        await self._client.set_cursor(self.cursor_id, queue, 0, done)
                        pending = 0
                    continue
                batch, following = following.result(), None
                named = batch.headers_named((POSITION_HEADER, KIND_HEADER, SNAPSHOT_HEADER))
                for offset, payload, position, kind, snapshot in zip(
                    batch.offsets.tolist(),
                    batch.values.to_list(),
                    named[POSITION_HEADER],
                    named[KIND_HEADER],
                    named[SNAPSHOT_HEADER],
                    strict=True,
                ):
                    if position is None or (kind is not None and snapshot is None):
                        raise ValueError(f"{queue} offset {offset}: not a receive queue's entry")
                    entry = RoutedMessage(
                        source,
                        self.client_name,
                        int.from_bytes(position, "big", signed=True),
                        payload or b"",
                        kind.decode() if kind is not None else "delta",
                        int.from_bytes(snapshot or b"", "big") if kind is not None else -1,
                    )
                    try:
                        outcome = self._callback(entry)
                        if inspect.isawaitable(outcome):
                            await outcome
                    except Exception as error:
                        # Recorded before anything else can happen: stopping cancels this task,
                        # which must not hide the error behind the cancellation.
                        self._errors.append(error)
                        raise
                    done, pending = offset, pending + 1
                    if pending >= self.commit_every:
                        await self._client.set_cursor(self.cursor_id, queue, 0, done)
                        pending = 0
        finally:
            if following is not None:
                following.cancel()
            if pending:
                with contextlib.suppress(Exception):
                    await self._client.set_cursor(self.cursor_id, queue, 0, done)


class SyncRoutingListener:
    """The blocking client's listener: it runs on the client's event loop thread (so does the
    callback). ``start()``, then ``stop()``; or ``with client.routing_listener(...):``."""

    def __init__(self, listener: RoutingListener, loop: asyncio.AbstractEventLoop) -> None:
        self._listener = listener
        self._loop = loop
        self._future: concurrent.futures.Future[None] | None = None

    def start(self) -> SyncRoutingListener:
        self._future = asyncio.run_coroutine_threadsafe(self._listener.run(), self._loop)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop delivering (what was handled is committed); raises what a callback raised."""
        future = self._future
        if future is None:
            return
        self._loop.call_soon_threadsafe(self._listener.stop)
        done, _ = concurrent.futures.wait([future], timeout)
        if not done:
            future.cancel()
            raise TimeoutError(f"the routing listener did not stop within {timeout} s")
        future.result()

    def __enter__(self) -> SyncRoutingListener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
