"""The delta queue's upkeep: entries leave once every declared site acknowledged them.

Theory. A site still needs the records that hold entries for it after the last position it
acknowledged (a site is sent whole records, so not the one holding that position), and nothing
else: records with nothing for it may go, and negotiation, which compares per site what the
queue still holds for it (``TagIndex.held_from``), resumes its deltas all the same. A site that
acknowledged nothing needs its records from its ``since``. So a site that rarely receives
anything does not pin the queue. The lowest record any declared site needs is the *release
offset* (:func:`release_offset`; with no site declared, the queue's end); the queue deletes
the whole sealed segments below it (``Partition.release_before``) and the tag index drops them
(``TagIndex.trim``). A removed site is no longer declared, so it holds nothing back.

Where a site's acknowledged position comes from: its sender, once that sender has heard the sink
since this server started (what the sink said it applied, then its acks); before that, the
position saved by an earlier pass (``<data_dir>/sites_acked.json``, replaced atomically); with
neither, none (the site holds back from its ``since``). A saved position is used only for the
site it was saved for (same id, number and ``since``). Safety does not rest on it: a release
never makes a site skip an entry, because negotiation and the sender's reads compare what the
queue holds for the site (``SendQueue.held_from``) with the site's own position, so at worst a
site the release overtook (one whose sink lost what it had acknowledged) gets a snapshot sync.
That holds while positions are not given twice: a saved position at or past the queue's end
(the queue lost records) would cover entries stored since, so the site's open raises the floor
above it before any transmit (``SiteRegistry.fit_queue_end``) and owes the site a snapshot.

Retention is the backstop for a site that never acknowledges: the broker's maintenance applies
the queue's retention (``QueueRetention``) whatever the sites acknowledged, and each pass here
trims the tag index to the queue's front. Each pass also saves the tag index's snapshot when it
moved (and :meth:`QueueUpkeep.close` once more), so a restart reads only the records after it.

A pass costs O(sites x log records) (one tag-index lookup per site) plus the deletions and
writes it makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tidelog.durable import replace_json
from tidelog.sites.envelope import split_position
from tidelog.sites.negotiation import NONE
from tidelog.sites.registry import Site
from tidelog.sites.send_queue import SendQueue
from tidelog.sites.sender import Sender
from tidelog.sites.tag_index import TagIndex

LOG = logging.getLogger("tidelog.sites")

ACKED_FILE: Final = "sites_acked.json"


def _plain_record(site: Site, at: int) -> int:
    return split_position(at)[0]


def release_offset(
    sites: Sequence[Site],
    acked: Mapping[str, int],
    end: int,
    index: TagIndex,
    record_of: Callable[[Site, int], int] = _plain_record,
) -> int:
    """The lowest record offset a declared site still needs: its first record (in the tag
    ``index``) after the one of its acknowledged position (``acked``: site id -> position,
    missing or ``NONE``: none), or from its ``since`` when it acknowledged nothing; ``end`` (the
    queue's next offset) when no site needs any. A site is sent whole records, so the record of
    its acknowledged position holds nothing more for it; records that hold nothing for a site
    are not held for it (a site that rarely receives does not pin the queue), and releasing
    them never costs it a snapshot (negotiation compares per site: ``TagIndex.held_from``).
    ``record_of``: the record offset a site's position belongs to (``Positions.record_of``, for
    a queue whose positions are lifted; not lifted by default)."""
    needed = end
    for site in sites:
        position = acked.get(site.site_id, NONE)
        start = site.since if position == NONE else record_of(site, position) + 1
        (first,) = index.records_for(site.number, start, 1) or (end,)
        needed = min(needed, first)
    return needed


def load_acked(path: Path, sites: Sequence[Site]) -> dict[str, int]:
    """The positions saved in ``path`` for the declared ``sites`` (a file that cannot be read
    gives none: the sites then hold back from their ``since`` until their senders hear from
    them)."""
    try:
        document: Any = json.loads(path.read_bytes())
        saved = {
            entry["site_id"]: (int(entry["number"]), int(entry["since"]), int(entry["acked"]))
            for entry in document["sites"]
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError) as error:
        LOG.warning("%s is unreadable (%s): no acknowledged positions restored", path, error)
        return {}
    found: dict[str, int] = {}
    for site in sites:
        entry = saved.get(site.site_id)
        if entry is not None and entry[:2] == (site.number, site.since):
            found[site.site_id] = entry[2]
    return found


def save_acked(path: Path, sites: Sequence[Site], acked: Mapping[str, int]) -> None:
    entries = [
        {"site_id": s.site_id, "number": s.number, "since": s.since, "acked": acked[s.site_id]}
        for s in sites
        if acked.get(s.site_id, NONE) != NONE
    ]
    replace_json(path, {"version": 1, "sites": entries}, indent=1)


def _identified(sites: Sequence[Site], acked: Mapping[str, int]) -> dict[str, tuple[int, int, int]]:
    return {
        s.site_id: (s.number, s.since, acked[s.site_id])
        for s in sites
        if acked.get(s.site_id, NONE) != NONE
    }


class QueueUpkeep:
    """Runs a pass every ``interval_s`` on the loop (:meth:`start`), and a last one at
    :meth:`close`."""

    def __init__(
        self, queue: SendQueue, senders: Mapping[str, Sender], data_dir: Path, interval_s: float
    ) -> None:
        self.queue = queue
        self.senders = senders
        self.acked_file = data_dir / ACKED_FILE
        self.interval_s = interval_s
        sites = queue.registry.list()
        self._saved = _identified(sites, load_acked(self.acked_file, sites))
        """Site id -> (number, since, position) as last saved: a position counts only for the
        site it was saved for, not for a later one declared under the same id."""
        self._task: asyncio.Task[None] | None = None

    def saved(self) -> dict[str, int]:
        """The positions an earlier pass saved, for the declared sites they were saved for."""
        found: dict[str, int] = {}
        for site in self.queue.registry.list():
            number, since, saved = self._saved.get(site.site_id, (-1, -1, NONE))
            if (number, since) == (site.number, site.since):
                found[site.site_id] = saved
        return found

    def _record_of(self, site: Site, at: int) -> int:
        return self.queue.registry.positions_for(site).record_of(at)

    def acked(self) -> dict[str, int]:
        """Each declared site's acknowledged position, as the module docstring says."""
        found: dict[str, int] = {}
        end = self.queue.next_position()
        for site in self.queue.registry.list():
            sender = self.senders.get(site.site_id)
            live = NONE if sender is None else sender.acked
            number, since, saved = self._saved.get(site.site_id, (-1, -1, NONE))
            if (number, since) != (site.number, site.since) or saved >= end:
                # Another declaration's, or past the queue's end: a lost queue's position
                # (its sender refuses it too), which would release what the site never got.
                saved = NONE
            found[site.site_id] = live if live != NONE else saved
        return found

    async def run_once(self) -> list[int]:
        """One pass: save the acknowledged positions if they moved, release what every site
        acknowledged, trim the tag index to the queue's front, save its snapshot if it moved.
        Returns the base offsets of the segments released."""
        queue = self.queue
        if not queue.owned():
            return []  # the site moved: what it knows may stand on records that were cut
        sites = queue.registry.list()
        acked = self.acked()
        known = _identified(sites, acked)
        if known != self._saved:
            await asyncio.to_thread(save_acked, self.acked_file, sites, acked)
            self._saved = known
        released = await queue.partition.release_before(
            release_offset(sites, acked, queue.next_offset, queue.index, self._record_of)
        )
        if released:
            LOG.info("released %d acknowledged segments of the delta queue", len(released))
        if not queue.partition.paused:
            queue.index.trim(queue.partition.log.oldest_offset)
        await queue.save_index()
        return released

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="delta queue upkeep")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
            except Exception:  # a failed pass (a full disk) is retried at the next one
                LOG.exception("delta queue upkeep pass failed")

    async def close(self) -> None:
        """Stop the passes and run a last one (the senders are stopped: their positions are
        final). A failed last pass is logged, not raised: the broker must still close, and the
        next start rebuilds what was not saved."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.run_once()
        except Exception:
            LOG.exception("the delta queue's last upkeep pass failed")
