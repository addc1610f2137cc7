"""Periodic maintenance of every stream: one pass (:meth:`Maintenance.maintain`) and the task
that runs it every ``maintenance_interval_s``.

Invariants. A pass's log work (rolls, retention, compaction, producer snapshots) runs in threads,
one partition at a time; a paused, deleted or closed partition is skipped. A failing pass is
logged and the next one still runs on time. Auto-pause closes only a single broker's partitions,
never a partition of a cluster (one with a role).
"""

from __future__ import annotations

import asyncio
import logging
import time

from tidelog.broker.core import BrokerCore

LOG = logging.getLogger("tidelog.broker")


class Maintenance(BrokerCore):
    """Maintenance: one part of :class:`~tidelog.broker.broker.Broker`."""

    async def _maintain_forever(self) -> None:
        interval = self.config.maintenance_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.maintain()
            except Exception:  # one bad partition must not stop maintenance for the others
                LOG.exception("maintenance pass failed")

    async def maintain(self) -> None:
        """One pass: roll over-age segments, apply retention, pause idle partitions, snapshot
        the cursor indexes, checkpoint the views."""
        now = time.monotonic()
        self.groups.expire()
        if self._cursors is not None:
            await self._cursors.save()
        for stream in list(self.streams.values()):
            await stream.views.checkpoint()
            for partition in stream.partitions:
                if partition.paused or partition.deleted or partition.closed:
                    continue
                deleted = await asyncio.to_thread(partition.log.maintain)
                if stream.config.compact:
                    await asyncio.to_thread(partition.log.compact)
                await asyncio.to_thread(partition.save_producers)
                if deleted:
                    LOG.info(
                        "retention removed %d segments of %s/%d",
                        len(deleted),
                        stream.name,
                        partition.number,
                    )
                idle = now - partition.stats.last_activity_monotonic
                auto_pause = stream.config.auto_pause_s
                # Not a partition of a cluster (a role): closing a replica stops its
                # replication, and a follower has no publishes to count as activity.
                if (
                    auto_pause
                    and partition.role is None
                    and partition.subscribers == 0
                    and idle >= auto_pause
                ):
                    partition.pause()
                    stream.save()
                    LOG.info("auto-paused idle partition %s/%d", stream.name, partition.number)
