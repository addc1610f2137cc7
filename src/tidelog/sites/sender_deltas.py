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

Steps. No batch reaches more than ``step`` positions past its ``prev`` (half the sink's
``max_jump`` by default, ``windows.py``): positions grow with every record the source stores
for any site, so a site that receives rarely would otherwise get a batch whose gap the sink
refuses as a forged jump. When the site's next entry lies further, the sender first sends
batches without entries, ``(cursor, cursor + step]``, which move the sink's window over
positions that hold nothing for the site (:func:`next_frame`).
"""

from __future__ import annotations

import numpy as np

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.sites.routed import RoutedColumns
from tidelog.sites.sender_core import SenderCore
from tidelog.sites.sender_link import Link
from tidelog.sites.sync_states import SyncEvent, SyncState
from tidelog.sites.windows import AckTimeout, Framed, SendWindow


def next_frame(cursor: int, entries: RoutedColumns, step: int) -> Framed[RoutedColumns]:
    """The next batch after ``cursor``, given the site's next ``entries`` after it (in order, at
    least one): as many of them as lie within ``step`` of ``cursor``, or, when the first lies
    further, a step without entries to ``cursor + step`` (nothing for the site lies there)."""
    limit = cursor + step
    if int(entries.positions[0]) > limit:
        return Framed(cursor, limit, RoutedColumns.empty())
    within = int(np.searchsorted(entries.positions, limit, side="right"))
    return Framed(cursor, int(entries.positions[within - 1]), entries.take(0, within))


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
                    framed = next_frame(cursor, entries, self.step)
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
