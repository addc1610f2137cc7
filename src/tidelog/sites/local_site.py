"""This site: its registry of remote sites and its delta queue, opened on a running broker.

The face of ``tidelog.sites`` for the api: declare and forget remote sites, list them, and
transmit payloads. A removed site's tag list is dropped at once, and it no longer holds entries
in the queue: they leave once every remaining site acknowledged them (``upkeep.py``; they are
never sent to a site that later takes its number).

On a cluster (``streams`` given) the site is run by one broker at a time, the leader of its
delta queue, and everything it keeps must reach the next one: its queues are the cluster's
replicated internal streams (``streams`` creates them, led by the same broker), its registry and
its sink's snapshot progress are records of ``__lrq_state`` (``site_state.py``), a transmit is
answered once every in-sync replica holds it, and the tag index is rebuilt from the queue at
every open (a snapshot file of it would be this broker's alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tidelog.broker import Broker, StreamConfig
from tidelog.errors import TooManySites
from tidelog.security import PLAINTEXT, ClientTls
from tidelog.sites.envelope import MAX_SITES
from tidelog.sites.registry import SITES_FILE, Site, SiteRegistry
from tidelog.sites.send_queue import DELTA_QUEUE, QueueRetention, SendQueue, Transmission
from tidelog.sites.sender import ACK_TIMEOUT_S, Sender
from tidelog.sites.sink import Sink, StreamSource
from tidelog.sites.site_state import REGISTRY, STATE_CONFIG, STATE_STREAM, StateStream, Unopened
from tidelog.sites.snapshots import SNAPSHOT_QUEUE, Snapshots
from tidelog.sites.status import SiteState, site_state
from tidelog.sites.tag_index_file import TAG_INDEX_FILE
from tidelog.sites.upkeep import QueueUpkeep
from tidelog.sites.windows import RECORD_POSITIONS, WINDOW_RECORDS
from tidelog.wire import RECEIVE_QUEUE_PREFIX, SNAPSHOT_REQUESTS

LOG = logging.getLogger("tidelog.sites")


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
        streams: StreamSource | None = None,
        tls: ClientTls = PLAINTEXT,
        max_declared: int = MAX_SITES,
        window_records: int = WINDOW_RECORDS,
    ) -> None:
        """``upkeep_interval_s``: how often acknowledged entries are released (default: the
        broker's maintenance interval); ``streams``: a cluster's replicated internal streams
        (None: a single broker's own, and the registry in a file); ``tls``: how the senders
        call other sites (this server's own certificate; ``sender.py``); ``max_declared``: the
        cap on sites :meth:`add_site` declares; ``window_records``: how many of a source's
        records a delta batch may reach past what the sink applied (``windows.py``)."""
        self.tls = tls
        self.max_declared = max_declared
        self._streams = streams
        self._state: StateStream | None = None
        replicated = streams is not None
        self.registry = SiteRegistry(site_id, None if replicated else data_dir / SITES_FILE)
        self.queue = SendQueue(
            broker,
            self.registry,
            retention,
            index_file=None if replicated else data_dir / TAG_INDEX_FILE,
        )
        self.snapshots = Snapshots(broker, self.registry, self.queue)
        # A cluster's sink reads nothing of this broker's files: its state comes at open.
        self.sink = Sink(
            broker,
            site_id,
            streams=streams,
            state=Unopened() if replicated else None,
            max_jump=window_records * RECORD_POSITIONS,
        )
        self._registry_lock = asyncio.Lock()
        self._closed = False
        self._opened = False
        self.senders: dict[str, Sender] = {}
        self.ack_timeout_s = ack_timeout_s
        interval = upkeep_interval_s or broker.config.maintenance_interval_s
        self.upkeep = QueueUpkeep(self.queue, self.senders, data_dir, interval)

    @property
    def site_id(self) -> str:
        return self.registry.local_site

    async def open(self, configured: Mapping[str, str] | None = None) -> None:
        """Create the queue if needed and restore its tag index (in a thread: it reads the
        records after the index's snapshot, or the whole queue without one), fit the registry
        to the queue's end (``SiteRegistry.fit_queue_end``: a queue that lost records it gave
        out must not give their positions again), declare the ``configured`` sites (id ->
        address; a declared one that moved gets its new address), all kept before any transmit,
        then start a sender per declared site and the queue's upkeep. On a cluster, the
        site's streams are made ready first (this broker must lead them) and its documents
        read from ``__lrq_state``."""
        if self._streams is not None:
            await self._streams(DELTA_QUEUE, self.queue.retention.stream_config())
            single = StreamConfig(partitions=1)
            await self._streams(SNAPSHOT_QUEUE, single)
            await self._streams(SNAPSHOT_REQUESTS, single)
            # The receive queues too, before the sink reads where each source got to: a new
            # leader's records above its high watermark are invisible until it settles.
            for name in sorted(s.name for s in self.queue.broker.list_streams()):
                if name.startswith(RECEIVE_QUEUE_PREFIX):
                    await self._streams(name, single)
            stream = await self._streams(STATE_STREAM, STATE_CONFIG)
            self._state = await asyncio.to_thread(
                StateStream, stream.partitions[0], self.queue.owned, self.site_id
            )
            self.registry.restore(self._state.load(REGISTRY), f"{STATE_STREAM}'s registry")
            self.sink.use_state(self._state)
            self.queue.state = self._state
        await asyncio.to_thread(self.queue.open)
        self.snapshots.open()
        async with self._registry_lock, self.queue.positions_changing():
            before = self.registry.document()
            end = await self.queue.settled_end()
            # Before any transmit: a queue that lost records it had given out (sites.json
            # kept, a power loss that cut a tail) must not give their positions again.
            for site in self.registry.fit_queue_end(end, self.upkeep.saved()):
                LOG.warning("site %s: %s", site.site_id, site.resync)
            for site_id, address in sorted((configured or {}).items()):
                known = {s.site_id: s for s in self.registry.list()}.get(site_id)
                if known is None:
                    self.registry.add(site_id, address, end)
                elif known.address != address:
                    self.registry.move(site_id, address)
            if self.registry.document() != before:
                await self._keep_registry(before)
        for site in self.registry.list():
            self._start_sender(site)
        self.upkeep.start()
        self._opened = True

    def fence(self, owned: Callable[[], bool]) -> None:
        """A cluster's site, before :meth:`open`: ``owned`` says whether it still runs here
        under the leadership it was opened with; once not, it stores, ships, releases and
        saves nothing more (``SendQueue.owned``)."""
        self.queue.owned = owned

    async def close(self) -> None:
        """Stop every sender, then the queue's upkeep after a last pass (before the broker
        closes). A site declared while this runs gets no sender here (it is saved: whoever
        runs the site next starts one)."""
        self._closed = True
        for sender in list(self.senders.values()):
            await sender.stop()
        if self._opened:  # an open that failed (a cluster's, tried again) has nothing to pass
            await self.upkeep.close()
        self.senders.clear()

    def _start_sender(self, site: Site) -> None:
        if self._closed:
            return
        sender = Sender(
            self.queue,
            self.snapshots,
            site,
            self.site_id,
            ack_timeout_s=self.ack_timeout_s,
            change_site=self.change_site,
            tls=self.tls,
            step=self.sink.max_jump // 2,
        )
        self.senders[site.site_id] = sender
        sender.start()

    async def _keep_registry(self, before: dict[str, object]) -> None:
        """On a cluster, save the registry's change in ``__lrq_state``; the change is undone
        when that fails (a single broker's registry saved its file already)."""
        if self._state is None:
            return
        try:
            await self._state.save(REGISTRY, self.registry.document())
        except BaseException:
            self.registry.restore(before)
            raise

    async def change_site(self, change: Callable[[int], Site]) -> Site:
        """Make a change of the registry that a sender learned (``Sender._learn``): ``change``
        gets the queue's settled end (``SendQueue.settled_end``: a failover cannot cut the
        records below it, so a segment never starts past the queue's end) and returns the site
        as changed. It runs with transmits held back (a lift must not fall between a transmit's
        append and its answer) and is kept before they go on (on a cluster, in
        ``__lrq_state``; undone if that fails)."""
        async with self._registry_lock, self.queue.positions_changing():
            before = self.registry.document()
            site = change(await self.queue.settled_end())
            await self._keep_registry(before)
        return site

    async def add_site(self, site_id: str, address: str) -> Site:
        """Declare a remote site (``TooManySites`` past ``max_declared``)."""
        async with self._registry_lock:
            if len(self.registry.list()) >= self.max_declared:
                raise TooManySites(self.max_declared)
            since = await self.queue.settled_end()
            before = self.registry.document()
            site = self.registry.add(site_id, address, since)
            await self._keep_registry(before)
        self._start_sender(site)
        return site

    async def remove_site(self, site_id: str) -> Site:
        async with self._registry_lock:
            before = self.registry.document()
            site = self.registry.remove(site_id)
            await self._keep_registry(before)
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

    def declared(self, site_id: str) -> bool:
        """Whether ``site_id`` is a declared remote site."""
        return self.registry.declared(site_id)

    def resync(self, site_id: str) -> bool:
        """Start a snapshot sync of ``site_id`` (NOT_FOUND when it is not declared); False when
        one is asked for or under way already (it is that one: ``Sender.request_resync``)."""
        self.registry.get(site_id)
        return self.senders[site_id].request_resync("a resync was requested (tidelog site resync)")
