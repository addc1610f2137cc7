"""The sender: one task per remote site keeping it in sync over ``tidelog.v1/Replicate``.

It connects to the site's server, says hello (its own site id and the site it means to reach)
and gets the sink's progress for this source; :func:`~tidelog.sites.negotiation.negotiate`
decides how to go on, and the session's state table (``sync_states.py``) follows. In delta sync
it reads the site's entries through the tag index, ships them in batches framed ``(prev,
current]`` with at most ``window`` batches unacknowledged, and wakes on the queue's commit signal
when it has caught up. Any failure - the connection lost, the sink refusing a batch, an ack not
arriving within ``ack_timeout_s`` - ends the connection; the sender reconnects with a growing
pause and negotiates again, so it resumes from what the sink says it applied: the sink's
receive queues, not the sender's memory, decide where deltas resume.

Snapshot sync is not built yet. Until it is, a negotiation that asks for a snapshot is answered
with deltas when the queue still holds every entry since the site was declared (its ``since``):
for a sink that has nothing yet, those are exactly the entries a snapshot would have had to
precede. Otherwise the session stays in SNAPSHOT_SYNC and the sender retries later; the state and
the reason are in :attr:`Sender.status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.sites.envelope import RoutedEntry, position
from tidelog.sites.negotiation import NONE, Decision, Outcome, SinkProgress, negotiate
from tidelog.sites.registry import Site
from tidelog.sites.send_queue import SendQueue
from tidelog.sites.sync_states import SenderSession, SyncEvent, SyncState
from tidelog.sites.windows import AckTimeout, Framed, SendWindow

LOG = logging.getLogger("tidelog.sites")

Call = grpc.aio.StreamStreamCall[v1.ReplicationRequest, v1.ReplicationReply]


@dataclass(frozen=True, slots=True)
class SenderStatus:
    site_id: str
    state: SyncState
    acked: int
    """The last position the site acknowledged (``NONE``: none yet)."""
    last_ack_s: float | None
    """Unix time of the last ack from the site (None: none since this server started)."""
    reason: str
    """The last negotiation's reason, or the last error."""


class Sender:
    def __init__(
        self,
        queue: SendQueue,
        site: Site,
        local_site: str,
        *,
        batch_entries: int = 1000,
        window: int = 8,
        ack_timeout_s: float = 10.0,
        max_pause_s: float = 5.0,
    ) -> None:
        self.queue = queue
        self.site = site
        self.local_site = local_site
        self.batch_entries = batch_entries
        self.window_batches = window
        self.ack_timeout_s = ack_timeout_s
        self.max_pause_s = max_pause_s
        self.session = SenderSession(site.site_id)
        self.acked = NONE
        self.last_ack_s: float | None = None
        self.reason = "not connected yet"
        self._task: asyncio.Task[None] | None = None
        self._acks = asyncio.Event()

    @property
    def status(self) -> SenderStatus:
        return SenderStatus(
            self.site.site_id, self.session.state, self.acked, self.last_ack_s, self.reason
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sender {self.site.site_id}")

    async def stop(self) -> None:
        if self.session.state is not SyncState.STOPPED:
            self.session.handle(SyncEvent.STOP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        pause = 0.1
        while True:
            try:
                await self._connected()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure: reconnect and negotiate again
                reason = _describe(error)
                if reason != self.reason:  # once per new reason, not once per retry
                    LOG.info("site %s: %s; reconnecting", self.site.site_id, reason)
                self.reason = reason
            if self.session.state is SyncState.LOG_ENTRY_SYNC:
                pause = 0.1  # it was syncing: reconnect soon, the site is probably back
            if self.session.state is not SyncState.INITIALIZED:
                self.session.handle(SyncEvent.DISCONNECTED)
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.max_pause_s)

    async def _connected(self) -> None:
        async with grpc.aio.insecure_channel(self.site.address) as channel:
            call: Call = v1_grpc.TidelogStub(channel).Replicate()
            hello = v1.ReplicationHello(source_site=self.local_site, sink_site=self.site.site_id)
            await call.write(v1.ReplicationRequest(hello=hello))
            reply = await call.read()
            if not isinstance(reply, v1.ReplicationReply) or not reply.HasField("progress"):
                raise ConnectionError("the sink answered the hello without its progress")
            self.session.handle(SyncEvent.START)
            cycle = self.session.cycle
            decision = self._decide(reply.progress)
            self.reason = decision.reason
            if decision.outcome is not Outcome.DELTAS:
                self.session.handle(SyncEvent.NEGOTIATED_SNAPSHOT, cycle)
                raise ConnectionAbortedError(f"{decision.reason}: snapshot sync is not built yet")
            self.session.handle(SyncEvent.NEGOTIATED_DELTAS, cycle)
            await self._ship(call, decision.resume_after)

    def _decide(self, reply: v1.SinkProgress) -> Decision:
        progress = SinkProgress(
            reply.snapshot_started,
            reply.snapshot_transferred,
            reply.snapshot_applied,
            reply.last_processed,
        )
        oldest = self.queue.oldest_position()
        decision = negotiate(progress, oldest)
        since = position(self.site.since, 0)
        if (
            decision.outcome is Outcome.SNAPSHOT
            and progress.last_processed == NONE
            and progress.snapshot_applied == NONE
            and oldest <= since
        ):
            return Decision(
                Outcome.DELTAS,
                "nothing replicated yet; every entry since the site was declared is held",
                resume_after=since - 1,
            )
        return decision

    async def _ship(self, call: Call, resume_after: int) -> None:
        window: SendWindow[Sequence[RoutedEntry]] = SendWindow(
            self.window_batches, resend_after_s=self.ack_timeout_s, max_resends=0
        )
        window.ack(resume_after)
        self.acked = resume_after  # what the sink says it holds, even if it lost some
        cursor = resume_after
        reader = asyncio.create_task(self._read_acks(call, window))
        try:
            while True:
                # Taken before reading: an ack or an append from here on wakes the wait below.
                self._acks.clear()
                signal = self.queue.partition.signal.current()
                while window.has_room:
                    entries = self.queue.read_for(self.site.number, cursor, self.batch_entries)
                    if not entries:
                        break
                    framed: Framed[Sequence[RoutedEntry]] = Framed(
                        cursor, entries[-1].position, tuple(entries)
                    )
                    window.sent(framed)
                    await call.write(v1.ReplicationRequest(deltas=_wire(framed)))
                    cursor = framed.current
                try:
                    window.due()
                except AckTimeout:
                    raise TimeoutError(
                        f"no ack from site {self.site.site_id} within {self.ack_timeout_s} s"
                    ) from None
                if reader.done():
                    reader.result()  # raises what ended it
                    raise ConnectionError("the sink closed the stream")
                waiter = asyncio.ensure_future(self._acks.wait())
                wakers: set[asyncio.Future[Any]] = {signal, waiter, reader}
                try:
                    await asyncio.wait(
                        wakers,
                        timeout=min(1.0, self.ack_timeout_s),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    waiter.cancel()
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _read_acks(self, call: Call, window: SendWindow[Sequence[RoutedEntry]]) -> None:
        while True:
            reply = await call.read()
            if not isinstance(reply, v1.ReplicationReply):
                return  # the end of the stream
            if reply.HasField("acked"):
                window.ack(reply.acked)
                self.acked = max(self.acked, reply.acked)
                self.last_ack_s = time.time()
                self._acks.set()


def _wire(batch: Framed[Sequence[RoutedEntry]]) -> v1.DeltaBatch:
    return v1.DeltaBatch(
        prev=batch.prev,
        current=batch.current,
        entries=[
            v1.RoutedEntry(position=e.position, client_name=e.client, payload=e.payload)
            for e in batch.entries
        ],
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__
