"""A sender's snapshot sync (``sender.py``): it asks the application for a snapshot
(``snapshots.py``), ships its start, entries and end on the Replicate stream as the provider
writes them, and waits for the sink to apply it; deltas then go on after the position it covers.

Invariants: a wait for the provider gives up (None) once the session's cycle changed, so a
stale cycle ships nothing more; the position a snapshot covers counts as given to the site
(``_shipped``) before its first frame is written; the site counts as acknowledged to that
position only once the sink applied it; and the request is forgotten however the sync ends.
"""

from __future__ import annotations

import logging
import time

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.sites.envelope import EntryKind
from tidelog.sites.sender_core import SenderCore
from tidelog.sites.sender_link import Link
from tidelog.sites.snapshots import SnapshotRecord, SnapshotTrimmed, Wanted
from tidelog.sites.sync_states import SyncEvent

LOG = logging.getLogger("tidelog.sites")


class SnapshotSync(SenderCore):
    """The snapshot sync of a sender."""

    async def _snapshot(self, link: Link) -> int | None:
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
