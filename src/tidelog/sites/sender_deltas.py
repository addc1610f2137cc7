"""A sender's delta loop (``sender.py``): the site's entries read through the tag index
(``SendQueue.read_for``), shipped in batches framed ``(prev, current]`` with at most ``window``
of them unacknowledged and resent when their ack is late (``windows.py``), and a wait on the
queue's commit signal once caught up.

Invariants: batches follow each other without a gap (each one's ``prev`` is the ``current`` of
the one before; the first's is where the sink said it is); a batch counts as given to the site
(``_shipped``) before it is written, so its ack is never refused as beyond what was given; the
loop leaves delta sync for a snapshot sync when retention removed entries not yet sent or a
batch stays unacked through ``max_resends`` resends; and the send window exists only while the
loop runs.
"""

from __future__ import annotations

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.sites.routed import RoutedColumns
from tidelog.sites.sender_core import SenderCore
from tidelog.sites.sender_link import Link
from tidelog.sites.sync_states import SyncEvent, SyncState
from tidelog.sites.windows import AckTimeout, Framed, SendWindow


class DeltaSync(SenderCore):
    """The delta loop of a sender."""

    async def _ship(self, link: Link, resume_after: int) -> None:
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
