"""This site: its registry of remote sites and its delta queue, opened on a running broker.

The face of ``tidelog.sites`` for the api: declare and forget remote sites, list them, and
transmit payloads. A removed site's tag list is dropped at once, and it no longer holds entries
in the queue: they leave once every remaining site acknowledged them (``upkeep.py``; they are
never sent to a site that later takes its number).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tidelog.broker import Broker
from tidelog.sites.registry import SITES_FILE, Site, SiteRegistry
from tidelog.sites.send_queue import QueueRetention, SendQueue, Transmission
from tidelog.sites.sender import ACK_TIMEOUT_S, Sender
from tidelog.sites.sink import Sink
from tidelog.sites.snapshots import Snapshots
from tidelog.sites.status import SiteState, site_state
from tidelog.sites.tag_index_file import TAG_INDEX_FILE
from tidelog.sites.upkeep import QueueUpkeep


class LocalSite:
    def __init__(
        self,
        broker: Broker,
        site_id: str,
        data_dir: Path,
        retention: QueueRetention | None = None,
        *,
        upkeep_interval_s: float | None = None,
        ack_timeout_s: float = ACK_TIMEOUT_S,
    ) -> None:
        """``upkeep_interval_s``: how often acknowledged entries are released (default: the
        broker's maintenance interval)."""
        self.registry = SiteRegistry(site_id, data_dir / SITES_FILE)
        self.queue = SendQueue(
            broker, self.registry, retention, index_file=data_dir / TAG_INDEX_FILE
        )
        self.snapshots = Snapshots(broker, self.registry, self.queue)
        self.sink = Sink(broker, site_id)
        self.senders: dict[str, Sender] = {}
        self.ack_timeout_s = ack_timeout_s
        interval = upkeep_interval_s or broker.config.maintenance_interval_s
        self.upkeep = QueueUpkeep(self.queue, self.senders, data_dir, interval)

    @property
    def site_id(self) -> str:
        return self.registry.local_site

    async def open(self, configured: Mapping[str, str] | None = None) -> None:
        """Create the queue if needed and restore its tag index (in a thread: it reads the
        records after the index's snapshot, or the whole queue without one), declare the
        ``configured`` sites (id -> address; a declared one that moved gets its new address),
        then start a sender per declared site and the queue's upkeep."""
        await asyncio.to_thread(self.queue.open)
        self.snapshots.open()
        for site_id, address in sorted((configured or {}).items()):
            known = {s.site_id: s for s in self.registry.list()}.get(site_id)
            if known is None:
                self.registry.add(site_id, address, self.queue.next_offset)
            elif known.address != address:
                self.registry.move(site_id, address)
        for site in self.registry.list():
            self._start_sender(site)
        self.upkeep.start()

    async def close(self) -> None:
        """Stop every sender, then the queue's upkeep after a last pass (before the broker
        closes)."""
        for sender in list(self.senders.values()):
            await sender.stop()
        await self.upkeep.close()
        self.senders.clear()

    def _start_sender(self, site: Site) -> None:
        sender = Sender(
            self.queue, self.snapshots, site, self.site_id, ack_timeout_s=self.ack_timeout_s
        )
        self.senders[site.site_id] = sender
        sender.start()

    def add_site(self, site_id: str, address: str) -> Site:
        site = self.registry.add(site_id, address, self.queue.next_offset)
        self._start_sender(site)
        return site

    async def remove_site(self, site_id: str) -> Site:
        site = self.registry.remove(site_id)
        self.queue.index.forget_site(site.number)
        sender = self.senders.pop(site_id, None)
        if sender is not None:
            await sender.stop()
        return site

    def sites(self) -> list[Site]:
        return self.registry.list()

    def status(self) -> list[SiteState]:
        """Each remote site's sync state and lag (reads at most two records per site)."""
        return [
            site_state(self.queue, self.senders[site.site_id])
            for site in self.registry.list()
            if site.site_id in self.senders
        ]

    async def transmit(self, client: str, items: Sequence[Transmission]) -> list[int]:
        return await self.queue.transmit(client, items)

    async def transmit_columns(
        self, client: str, payloads: Sequence[bytes], destinations: Sequence[Sequence[str]]
    ) -> list[int]:
        return await self.queue.transmit_columns(client, payloads, destinations)

    async def transmit_packed(
        self,
        client: str,
        payloads: bytes,
        sizes: npt.NDArray[np.int64],
        destination_lists: Sequence[Sequence[str]],
        list_indexes: npt.NDArray[np.int64],
    ) -> list[int]:
        return await self.queue.transmit_packed(
            client, payloads, sizes, destination_lists, list_indexes
        )

    async def transmit_snapshot(
        self,
        site_id: str,
        snapshot: int,
        items: Sequence[tuple[str, bytes]],
        *,
        begin: bool,
        end: bool,
    ) -> int:
        """A snapshot provider's call (``snapshots.py``); the position the snapshot covers."""
        return await self.snapshots.write(site_id, snapshot, items, begin=begin, end=end)

    def resync(self, site_id: str) -> None:
        """Start a snapshot sync of ``site_id`` (NOT_FOUND when it is not declared)."""
        self.registry.get(site_id)
        self.senders[site_id].resync("a resync was requested (tidelog site resync)")
