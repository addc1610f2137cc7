"""The sender: one task per remote site keeping it in sync over ``tidelog.v1/Replicate``.

It connects to the site's server, says hello (its own site id and the site it means to reach)
and gets the sink's progress for this source; :func:`~tidelog.sites.negotiation.negotiate`
decides how to go on, and the session's state table (``sync_states.py``) follows. In delta sync
it reads the site's entries through the tag index (as columns, ``routed.py``), ships them in
batches framed ``(prev, current]`` (packed when the sink's progress says ``packed_deltas``, one
message per entry otherwise) with at most ``window`` batches unacknowledged, and wakes on the
queue's commit signal when it has caught up. A lost connection ends the stream; the sender
reconnects with a growing pause and negotiates again, so it resumes from what the sink says it
applied: the sink's receive queues, not the sender's memory, decide where deltas resume.

Snapshot sync (``snapshots.py``) runs on the same stream: the sender asks the application for a
snapshot, ships its start, entries and end as the provider writes them, waits for the sink to
apply it, and ships deltas after the position it covers. It starts when negotiation says so, on
a resync request (:meth:`Sender.resync`), when retention removed entries the site had not been
sent (a trimmed read), when a batch stays unacked through ``max_resends`` resends (the first
after ``ack_timeout_s``, each wait twice the one before) or a snapshot's apply does not arrive
within ``ack_timeout_s``, and after the sink refused a batch. A provider that begins a snapshot
and then writes nothing for ``provider_timeout_s``, or a request no provider begins in that
time, gets a new request. Until a provider begins, the site waits in SNAPSHOT_SYNC, and its
status says so.

Before negotiating, the sender checks the position the sink reports against what this source
can have given it (``negotiation.judge_learned``, ``positions.py``): a site first heard since it
was declared that knows a position of an older queue of this site (the source lost its data) has
its entries lifted above it; a site heard before that reports a position this source cannot have
given it (at or past :meth:`Sender.given_end`: the queue's next position when it was opened, or
past what this sender shipped since) is refused (its report and any such ack are never taken as
acknowledged; the reason is logged once and shown in its status), the floor rises past it, and
it is owed a snapshot sync until one is applied (kept in the registry, so a restart does not
forget it). An ack at or past that bound during delta sync ends the stream: the next
negotiation refuses it the same way. A lift that leaves positions no room is refused the same
way as a report not believed: nothing sent, the reason logged and in the status. Snapshot ids
are checked likewise: a sink that reports one at or past the next id (an older incarnation's)
lifts the ids above it (``snapshots.py``).

One exception, on purpose: a site that has received nothing yet and started no snapshot, while
the queue still holds every entry since the site was declared (its ``since``), starts with
deltas from there instead of a snapshot. Declaring a site starts replication from that moment,
as a new subscriber starts at the end of a stream; an application whose older state must reach
the site asks for a snapshot (``tidelog site resync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.sites.envelope import EntryKind
from tidelog.sites.negotiation import (
    NONE,
    Decision,
    Learned,
    Outcome,
    SinkProgress,
    judge_learned,
    negotiate,
)
from tidelog.sites.positions import PositionsExhausted
from tidelog.sites.registry import Site
from tidelog.sites.routed import RoutedColumns, to_wire
from tidelog.sites.send_queue import SendQueue
from tidelog.sites.snapshots import (
    MAX_SNAPSHOT_ID,
    SnapshotRecord,
    Snapshots,
    SnapshotTrimmed,
    Wanted,
)
from tidelog.sites.sync_states import SenderSession, SyncEvent, SyncState
from tidelog.sites.windows import AckTimeout, Framed, SendWindow

LOG = logging.getLogger("tidelog.sites")

Call = grpc.aio.StreamStreamCall[v1.ReplicationRequest, v1.ReplicationReply]
FIRST: Final = asyncio.FIRST_COMPLETED
ACK_TIMEOUT_S: Final = 10.0
"""Default wait for a batch's ack before it is sent again (the server's sites_ack_timeout_s)."""
_NEGOTIATED: Final = {
    Outcome.DELTAS: SyncEvent.NEGOTIATED_DELTAS,
    Outcome.SNAPSHOT: SyncEvent.NEGOTIATED_SNAPSHOT,
    Outcome.APPLY_PENDING: SyncEvent.NEGOTIATED_APPLY_PENDING,
}
_REFUSALS: Final = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE}
)
"""How a sink that refuses what it was sent ends the stream (not how a lost one ends)."""


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


SiteChange = Callable[[Callable[[int], Site]], Awaitable[Site]]
"""Runs a change of the registry for one site (given the queue's next offset, returning the
site as changed) with transmits held back, and keeps it (``LocalSite.change_site``)."""


class AckBeyondEnd(ConnectionError):
    """The sink acknowledged a position this queue never gave: the stream ends, and the next
    negotiation refuses that position."""


class Sender:
    def __init__(
        self,
        queue: SendQueue,
        snapshots: Snapshots,
        site: Site,
        local_site: str,
        *,
        batch_entries: int = 1000,
        window: int = 8,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        max_pause_s: float = 5.0,
        provider_timeout_s: float = 60.0,
        max_resends: int = 2,
        change_site: SiteChange | None = None,
    ) -> None:
        """``change_site``: how a change of the site's registry entry is made and kept (by
        default here, in this queue's registry)."""
        self.queue = queue
        self._change_site = change_site or self._change_here
        self.snapshots = snapshots
        self.provider_timeout_s = provider_timeout_s
        self.max_resends = max_resends
        """Resends of an unacked batch (after ``ack_timeout_s``, then twice as long each time)
        before the session gives up on deltas and starts a snapshot sync."""
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
        self._wake = asyncio.Event()
        """Set by an ack, a snapshot's apply or a resync request: the session looks again."""
        self._window: SendWindow[RoutedColumns] | None = None
        self._resync_asked: str | None = site.resync or None
        """Why the next negotiation must start a snapshot (None: let it decide)."""
        self._shipped = NONE
        """The highest position this sender gave the site: a delta shipped, or the position a
        snapshot it shipped covers."""

    def given_end(self) -> int:
        """The lowest position this source cannot have given the site: above every position
        of the queue as it was opened (an earlier run gave nothing past it, unless the queue
        lost records) and every one this sender gave since."""
        return max(self.queue.opened_position, self._shipped + 1)

    @property
    def status(self) -> SenderStatus:
        reason = self.reason
        refused = self.site.resync
        if refused and refused != reason:
            reason = f"{refused}; {reason}"  # until the snapshot it is owed is applied
        return SenderStatus(
            self.site.site_id, self.session.state, self.acked, self.last_ack_s, reason
        )

    async def _change_here(self, change: Callable[[int], Site]) -> Site:
        async with self.queue.positions_changing():
            return change(await self.queue.settled_end())

    def _declared(self) -> Site:
        """The site as the registry has it now (what the sender learned may have changed it);
        the one it was started with once it is removed."""
        registry = self.queue.registry
        found = next((s for s in registry.list() if s.site_id == self.site.site_id), None)
        if found is None or (found.number, found.since) != (self.site.number, self.site.since):
            return self.site
        return found

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
            progress = SinkProgress(
                reply.progress.snapshot_started,
                reply.progress.snapshot_transferred,
                reply.progress.snapshot_applied,
                reply.progress.last_processed,
            )
            await self._learn(progress)
            decision = self._decide(progress)
            if self._resync_asked is not None:
                decision = Decision(Outcome.SNAPSHOT, self._resync_asked)
            self.reason = decision.reason
            self.session.handle(_NEGOTIATED[decision.outcome], cycle)
            link = _Link(call, self._on_ack, packed=reply.progress.packed_deltas)
            try:
                resume_after = decision.resume_after
                while True:
                    state = self.session.state
                    if state is SyncState.SNAPSHOT_SYNC:
                        covered = await self._snapshot(link)
                        if covered is not None:
                            resume_after = covered
                    elif state is SyncState.LOG_ENTRY_SYNC:
                        await self._ship(link, resume_after)
                    elif state is SyncState.WAIT_SNAPSHOT_APPLY:
                        # The sink holds a snapshot it never applied (this sink applies as it
                        # receives, so it is one from an older server): a new one is safe.
                        self.session.handle(SyncEvent.RESYNC_REQUEST)
                    else:
                        raise ConnectionAbortedError(f"the session is {state.value}")
            except grpc.aio.AioRpcError as error:
                if error.code() in _REFUSALS:
                    # The sink refused what was sent: it may have lost track, and a full sync
                    # is always safe.
                    self._resync_asked = f"after the sink refused a batch: {_describe(error)}"
                raise
            finally:
                await link.close()

    def resync(self, reason: str = "a resync was requested") -> None:
        """Start a snapshot sync of the site: now if connected, else at the next negotiation."""
        self._resync_asked = reason
        if self.session.state in (
            SyncState.NEGOTIATING,
            SyncState.SNAPSHOT_SYNC,
            SyncState.WAIT_SNAPSHOT_APPLY,
            SyncState.LOG_ENTRY_SYNC,
        ):
            self.session.handle(SyncEvent.RESYNC_REQUEST)
            self.reason = reason
        self._wake.set()

    async def _learn(self, progress: SinkProgress) -> None:
        """Check what the sink reports against what this source gave, and learn from it (the
        module docstring); raises when it is not to be believed."""
        learned = progress.last_processed
        site = self.site = self._declared()
        registry = self.queue.registry
        first = registry.positions_for(site).position(site.since, 0)
        given_end = self.given_end()
        verdict = judge_learned(site.heard, learned, first, given_end)
        site_id = site.site_id
        if verdict is Learned.IMPLAUSIBLE:
            raise ConnectionAbortedError(
                f"site {site_id} reports position {learned}, past any position a queue gives: "
                f"not believed, nothing sent"
            )
        try:
            if verdict is Learned.LIFT:
                self.site = await self._change_site(
                    lambda end: registry.lift(site_id, learned, end)
                )
                LOG.warning(
                    "site %s processed position %d of an older queue of this site (its data "
                    "was lost): its entries are lifted above it, from position %d",
                    site_id,
                    learned,
                    registry.positions_for(self.site).position(site.since, 0),
                )
            elif verdict is Learned.BEYOND_END:
                reason = (
                    f"refused: site {site_id} reports position {learned}, beyond what this "
                    f"source gave it (every position it gave is below {given_end}: this "
                    f"source lost entries it had sent it); new entries take positions above "
                    f"it, and the site gets a snapshot sync"
                )
                self.site = await self._change_site(
                    lambda end: registry.refuse(site_id, learned, end, reason)
                )
                LOG.warning("site %s: %s", site_id, reason)
            elif not site.heard:
                self.site = await self._change_site(lambda end: registry.heard(site_id))
        except PositionsExhausted as error:
            reason = (
                f"site {site_id} reports position {learned}, and {error}: its entries cannot "
                f"be lifted above it, nothing sent"
            )
            if reason != self.reason:  # once, not once per reconnect
                LOG.warning("%s", reason)
            raise ConnectionAbortedError(reason) from None
        if self.site.resync:
            self._resync_asked = self.site.resync
        await self._learn_snapshot_ids(progress)

    async def _learn_snapshot_ids(self, progress: SinkProgress) -> None:
        """A sink that reports a snapshot id at or past the next one knew an older incarnation
        of this source: the ids are lifted above it before any snapshot is asked for."""
        seen = max(progress.snapshot_started, progress.snapshot_transferred)
        seen = max(seen, progress.snapshot_applied)
        if seen < self.snapshots.next_id():
            return
        site_id, registry = self.site.site_id, self.queue.registry
        if seen >= MAX_SNAPSHOT_ID:
            raise ConnectionAbortedError(
                f"site {site_id} reports snapshot {seen}, past any id a source gives: not "
                f"believed, nothing sent"
            )
        self.site = await self._change_site(
            lambda end: registry.snapshot_ids_above(site_id, seen, self.snapshots.next_offset())
        )
        LOG.warning(
            "site %s knows snapshot %d of an older incarnation of this site (its data was "
            "lost): snapshot ids start above it, from %d",
            site_id,
            seen,
            self.snapshots.next_id(),
        )

    def _on_ack(self, acked: int) -> None:
        if acked >= self.given_end():
            # Never taken as acknowledged: the stream ends, and the next negotiation refuses it.
            raise AckBeyondEnd(
                f"site {self.site.site_id} acknowledged position {acked}, beyond what this "
                f"source gave it (every position it gave is below {self.given_end()})"
            )
        if self._window is not None:
            self._window.ack(acked)
        self.acked = max(self.acked, acked)
        self.last_ack_s = time.time()
        self._wake.set()

    async def _snapshot(self, link: _Link) -> int | None:
        """Ask for a snapshot, ship it as the provider writes it, wait for the sink to apply
        it; the position it covers, or None when the cycle ended otherwise (a newer resync)."""
        cycle = self.session.cycle
        wanted = await self.snapshots.request(self.site)
        self.reason = (
            f"snapshot {wanted.snapshot}: waiting for the application's snapshot provider "
            f"(client.snapshot_provider) to begin it"
        )
        try:
            asked = time.monotonic()
            while not wanted.begun.is_set():
                if self.session.cycle != cycle:
                    return None
                if time.monotonic() - asked > self.provider_timeout_s:
                    # No provider was running, or it missed the request: ask again (a provider
                    # started later answers the newest and skips the older ones).
                    self.resync(self._resync_asked or self.reason)
                    return None
                self._wake.clear()
                await self._pause(link, wanted.begun.wait())
            self.reason = f"snapshot {wanted.snapshot}: transferring"
            offset = wanted.start_offset
            assert offset is not None
            self._shipped = max(self._shipped, wanted.covered)  # the sink's place after it
            heard = time.monotonic()
            while True:
                if self.session.cycle != cycle:
                    return None
                self._wake.clear()
                signal = self.snapshots.queue.signal.current()
                try:
                    records = self.snapshots.read(wanted, offset, 64)
                except SnapshotTrimmed as trimmed:
                    self.resync(f"{trimmed}: asking for a new one")
                    return None
                for record in records:
                    await link.call.write(v1.ReplicationRequest(snapshot=_frame(wanted, record)))
                    offset = record.offset + 1
                if records and records[-1].kind is EntryKind.SNAPSHOT_END:
                    break
                if records:
                    heard = time.monotonic()
                elif time.monotonic() - heard > self.provider_timeout_s:
                    self.resync(
                        f"the provider wrote nothing of snapshot {wanted.snapshot} for "
                        f"{self.provider_timeout_s} s: asking for a new one"
                    )
                    return None
                await self._pause(link, signal)
            self.session.handle(SyncEvent.SNAPSHOT_TRANSFER_COMPLETE, cycle)
            self.reason = f"snapshot {wanted.snapshot}: transferred, waiting for the sink's apply"
            due = time.monotonic() + self.ack_timeout_s
            while link.applied < wanted.snapshot:
                self._wake.clear()
                link.changed.clear()
                if link.applied >= wanted.snapshot:
                    break
                if time.monotonic() > due:
                    self.session.handle(SyncEvent.ACK_TIMEOUT, cycle)
                    self.reason = (
                        f"snapshot {wanted.snapshot}: no apply from site {self.site.site_id} "
                        f"within {self.ack_timeout_s} s; a new snapshot"
                    )
                    return None
                await self._pause(link, link.changed.wait())
            self.session.handle(SyncEvent.SNAPSHOT_APPLY_COMPLETE, cycle)
            self.acked = wanted.covered
            self.last_ack_s = time.time()
            self._resync_asked = None
            if self.site.resync:  # the snapshot it was owed: in step again
                site_id = self.site.site_id
                registry = self.queue.registry
                self.site = await self._change_site(lambda end: registry.resynced(site_id))
            self.reason = (
                f"snapshot {wanted.snapshot} applied; deltas after position {wanted.covered}"
            )
            LOG.info("site %s: %s", self.site.site_id, self.reason)
            return wanted.covered
        finally:
            self.snapshots.forget(wanted)

    async def _pause(self, link: _Link, *wakers: Awaitable[Any]) -> None:
        """Wait up to a second for one of ``wakers``, a wake-up or the end of the stream;
        raises what ended the stream.

        A waker that is a future already (a commit signal's ``current()``) is shared with every
        other waiter of that partition: it is waited on, never cancelled. Cancelling it would
        leave the partition handing out a done future until its next append, and every waiter,
        this sender's next pause included, would spin. Only the tasks made here for coroutine
        wakers are cancelled."""
        link.check()
        shared = [w for w in wakers if asyncio.isfuture(w)]
        ours = {asyncio.ensure_future(w) for w in wakers if not asyncio.isfuture(w)}
        ours.add(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait({*shared, *ours, link.reader}, timeout=1.0, return_when=FIRST)
        finally:
            for task in ours:
                task.cancel()
        link.check()

    def _decide(self, progress: SinkProgress) -> Decision:
        positions = self.queue.registry.positions_for(self.site)
        held_from = self.queue.held_from(self.site.number)
        decision = negotiate(progress, held_from, positions.record_of)
        if (
            decision.outcome is Outcome.SNAPSHOT
            and progress.last_processed == NONE
            and progress.snapshot_applied == NONE
            and progress.snapshot_started == NONE  # a broken snapshot is sent again whole
            and self.queue.oldest_offset() <= self.site.since
        ):
            # The first batch's prev: the sink starts its window there (``windows.py``).
            return Decision(
                Outcome.DELTAS,
                "nothing replicated yet; every entry since the site was declared is held",
                resume_after=positions.position(self.site.since, 0) - 1,
            )
        return decision

    async def _ship(self, link: _Link, resume_after: int) -> None:
        """Ship deltas after ``resume_after`` until the session leaves delta sync."""
        cycle = self.session.cycle
        window: SendWindow[RoutedColumns] = SendWindow(
            self.window_batches, resend_after_s=self.ack_timeout_s, max_resends=self.max_resends
        )
        window.ack(resume_after)
        self._window = window
        self.acked = resume_after  # what the sink says it holds, even if it lost some
        cursor = resume_after
        try:
            while self.session.state is SyncState.LOG_ENTRY_SYNC and self.session.cycle == cycle:
                # Taken before reading: an ack or an append from here on wakes the wait below.
                self._wake.clear()
                signal = self.queue.partition.signal.current()
                if self.queue.lost_for(self.site.number, cursor):
                    self.session.handle(SyncEvent.TRIMMED_READ, cycle)
                    self.reason = (
                        f"retention removed entries after position {cursor} before they were "
                        f"sent: a snapshot sync"
                    )
                    return
                while window.has_room:
                    entries = self.queue.read_for(self.site.number, cursor, self.batch_entries)
                    if not entries:
                        break
                    framed = Framed(cursor, int(entries.positions[-1]), entries)
                    window.sent(framed)
                    self._shipped = max(self._shipped, framed.current)
                    await link.call.write(v1.ReplicationRequest(deltas=link.wire(framed)))
                    cursor = framed.current
                try:
                    for again in window.due():  # the sink drops what it applied already
                        await link.call.write(v1.ReplicationRequest(deltas=link.wire(again)))
                except AckTimeout:
                    self.session.handle(SyncEvent.ACK_TIMEOUT, cycle)
                    self.reason = (
                        f"no ack from site {self.site.site_id} for a batch sent "
                        f"{self.max_resends + 1} times: a snapshot sync"
                    )
                    return
                await self._pause(link, signal)
        finally:
            self._window = None


class _Link:
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


def _frame(wanted: Wanted, record: SnapshotRecord) -> v1.SnapshotBatch:
    frame = v1.SnapshotBatch(snapshot=wanted.snapshot, covered=wanted.covered)
    if record.kind is EntryKind.SNAPSHOT_START:
        frame.start = True
    elif record.kind is EntryKind.SNAPSHOT_END:
        frame.end = True
    else:
        frame.entries.extend(
            v1.RoutedEntry(position=wanted.covered, client_name=record.client, payload=p)
            for p in record.payloads
        )
    return frame


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__
