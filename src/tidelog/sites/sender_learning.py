"""A sender's check of what the sink reports, before it negotiates (``sender.py``).

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

Invariants: nothing is negotiated, let alone sent, with a site whose report is not believed (a
``ConnectionAbortedError`` ends the stream first); every change to the site's registry entry (a
lift, a refusal, heard, snapshot ids) goes through ``change_site``, with transmits held back and
the change kept; and a refused site's owed snapshot is taken back from the registry.
"""

from __future__ import annotations

import logging

from tidelog.sites.negotiation import Learned, SinkProgress, judge_learned
from tidelog.sites.positions import PositionsExhausted
from tidelog.sites.sender_core import SenderCore
from tidelog.sites.snapshots import MAX_SNAPSHOT_ID

LOG = logging.getLogger("tidelog.sites")


class Learning(SenderCore):
    """The sink's report checked, and learned from, at each connection."""

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
