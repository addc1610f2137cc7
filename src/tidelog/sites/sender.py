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

The channel uses this server's TLS when it has TLS (``tls``: its own certificate as the client's,
so the sink knows which site calls), and the site's certificate must name the site id (by
convention its first subject alternative name: the target name is the site id, not the host
dialled): a site
redirected to another address (``tidelog site add`` after a remove) reaches only a server that
holds that site's certificate, so the source's state never goes to whoever listens there. Until
the sink answers the hello, every failure (a closed port, a TCP or HTTP server, a TLS or
identity refusal) shows in the site's status as one "unreachable"; the log says which.

Before negotiating, the sender checks the position the sink reports against what this source
can have given it, and learns from it: a lift of the site's entries, a refusal, new snapshot ids
(``sender_learning.py`` says when and why).

One exception, on purpose: a site that has received nothing yet and started no snapshot, while
the queue still holds every entry since the site was declared (its ``since``), starts with
deltas from there instead of a snapshot. Declaring a site starts replication from that moment,
as a new subscriber starts at the end of a stream; an application whose older state must reach
the site asks for a snapshot (``tidelog site resync``).

The pieces, one concern each: what they all share, the acks taken and the waits
(``sender_core.py``), the stream and its reader (``sender_link.py``), the sink's report checked
(``sender_learning.py``), the snapshot sync (``sender_snapshot.py``) and the delta loop
(``sender_deltas.py``); :class:`Sender` runs the session: connect, say hello, check, negotiate,
then the sync the state table says, until the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Final

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.security import ClientTls, aio_channel
from tidelog.sites.negotiation import NONE, Decision, Outcome, SinkProgress, negotiate
from tidelog.sites.sender_core import ACK_TIMEOUT_S, AckBeyondEnd, SenderStatus, SiteChange
from tidelog.sites.sender_deltas import DeltaSync
from tidelog.sites.sender_learning import Learning
from tidelog.sites.sender_link import REFUSALS, Call, Link, describe
from tidelog.sites.sender_snapshot import SnapshotSync
from tidelog.sites.sync_states import SyncEvent, SyncState

__all__ = ["ACK_TIMEOUT_S", "AckBeyondEnd", "Sender", "SenderStatus", "SiteChange"]

LOG = logging.getLogger("tidelog.sites")

_NEGOTIATED: Final = {
    Outcome.DELTAS: SyncEvent.NEGOTIATED_DELTAS,
    Outcome.SNAPSHOT: SyncEvent.NEGOTIATED_SNAPSHOT,
    Outcome.APPLY_PENDING: SyncEvent.NEGOTIATED_APPLY_PENDING,
}


def unreachable(address: str) -> str:
    """The status of a site whose server did not answer the hello (the log says why)."""
    return f"unreachable: no site answered at {address} (this server's log says why)"


class Sender(Learning, SnapshotSync, DeltaSync):
    """A sender to one remote site: the session loop over its parts (the module docstring)."""

    _reached = False
    """The current stream got the sink's answer to its hello."""
    _failure = ""
    """The last failure's full reason (logged once)."""

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
                reason = describe(error)
                if reason != self._failure:  # once per new reason, not once per retry
                    LOG.info("site %s: %s; reconnecting", self.site.site_id, reason)
                self._failure = reason
                # Before the sink's answer, any failure reads the same to a status caller: a
                # site's address must not serve as a port scanner (closed, TCP, HTTP, gRPC).
                self.reason = reason if self._reached else unreachable(self.site.address)
            if self.session.state is SyncState.LOG_ENTRY_SYNC:
                pause = 0.1  # it was syncing: reconnect soon, the site is probably back
            if self.session.state is not SyncState.INITIALIZED:
                self.session.handle(SyncEvent.DISCONNECTED)
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.max_pause_s)

    def site_tls(self) -> ClientTls:
        """This server's TLS for the site's channel: the site's certificate must name the site
        id (its first subject alternative name, ``docs/security.md``), whatever the address."""
        if not self.tls.secure:
            return self.tls
        return dataclasses.replace(self.tls, server_name=self.site.site_id)

    async def _connected(self) -> None:
        self._reached = False
        async with aio_channel(self.site.address, self.site_tls(), []) as channel:
            call: Call = v1_grpc.TidelogStub(channel).Replicate()
            hello = v1.ReplicationHello(source_site=self.local_site, sink_site=self.site.site_id)
            # A listener that takes the connection and never answers (a raw TCP port) must
            # not hold the sender, nor read differently from one that refuses it.
            async with asyncio.timeout(self.ack_timeout_s):
                await call.write(v1.ReplicationRequest(hello=hello))
                reply = await call.read()
            if not isinstance(reply, v1.ReplicationReply) or not reply.HasField("progress"):
                raise ConnectionError("the sink answered the hello without its progress")
            self._reached = True
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
            link = Link(call, self._on_ack, packed=reply.progress.packed_deltas)
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
                if error.code() in REFUSALS:
                    # The sink refused what was sent: it may have lost track, and a full sync
                    # is always safe.
                    self._resync_asked = f"after the sink refused a batch: {describe(error)}"
                raise
            finally:
                await link.close()

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
