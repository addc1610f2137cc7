"""Where this server's site runs: here (a single broker), or on one broker of its cluster.

A single broker with a site id runs its site itself (``SiteHost``). On a cluster every broker is
given the same site id, and the site runs on one of them at a time, the *gateway*: the leader of
the site's delta queue ``__lrq_delta`` (``ClusterSite``). The site's other streams are colocated
with that queue, so the controller hands their leadership to the same broker; its registry and
its sink's snapshot progress travel in ``__lrq_state`` (``tidelog.sites.site_state``).

Each broker runs a small loop: it creates the delta queue when the cluster has none, opens the
site when its broker has become the queue's serving leader, and closes it when it no longer is
(a failed open is closed and tried again at the next pass). The site's RPCs reaching another
broker are handed to the gateway (``tidelog.api.site_service``); with no gateway now they answer
``SiteMoving`` (UNAVAILABLE, retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from tidelog.broker import Stream, StreamConfig
from tidelog.cluster import ClusterNode
from tidelog.errors import FailedPrecondition, NotEnoughReplicas, SiteMoving, TidelogError
from tidelog.sites import DELTA_QUEUE, LocalSite, StreamSource

LOG = logging.getLogger("tidelog.sites")

SETTLE_S = 10.0
"""How long opening the site waits for each of its streams to be led here with its log in sync
(else the open fails and is tried again at the next pass)."""


class SiteHost:
    """A single broker's site: always here."""

    relays = False
    """Other brokers hand this site's calls over (``FORWARDED``): only a cluster's do."""

    def __init__(self, site: LocalSite, configured: Mapping[str, str] | None = None) -> None:
        """``configured``: the remote sites declared in the settings (declared at start)."""
        self.site_id = site.site_id
        self._site = site
        self._configured = dict(configured or {})
        self.secured = site.tls.secure
        """This server has TLS: a replication stream is accepted only from a declared site
        whose certificate names it (``tidelog.api.site_service``)."""

    @property
    def local(self) -> LocalSite | None:
        """The site, when this broker runs it now."""
        return self._site

    def gateway(self) -> str:
        """``HOST:PORT`` of the broker that runs the site when it is not this one
        (``SiteMoving`` when none does now)."""
        raise SiteMoving(self.site_id)

    def gateway_channel(self) -> grpc.aio.Channel:
        """A channel to the broker that runs the site when it is not this one (``SiteMoving``
        when none does now)."""
        raise SiteMoving(self.site_id)

    async def start(self) -> None:
        await self._site.open(self._configured)

    async def close(self) -> None:
        await self._site.close()


class ClusterSite(SiteHost):
    """A cluster's site: run by this broker while it leads the delta queue."""

    relays = True

    def __init__(
        self,
        site_id: str,
        cluster: ClusterNode,
        make_site: Callable[[StreamSource], LocalSite],
        configured: Mapping[str, str] | None = None,
        queue_config: StreamConfig | None = None,
        *,
        secured: bool = False,
    ) -> None:
        """``make_site``: builds the site on the given replicated streams; ``configured``: the
        remote sites declared in the settings (declared at every open); ``secured``: this
        server has TLS (:attr:`SiteHost.secured`)."""
        self.site_id = site_id
        self.secured = secured
        self.cluster = cluster
        self._make_site = make_site
        self._configured = dict(configured or {})
        self._queue_config = queue_config
        self._running: LocalSite | None = None
        self._opened_epoch = -1
        """The delta queue's leader epoch the running site was opened under."""
        self._task: asyncio.Task[None] | None = None
        self._failing = ""

    @property
    def local(self) -> LocalSite | None:
        return self._running

    def gateway(self) -> str:
        address = self.cluster.leader_address(DELTA_QUEUE, 0)
        if not address or self.cluster.leads(DELTA_QUEUE, 0):
            raise SiteMoving(self.site_id)  # none, or this broker while it opens the site
        return address

    def gateway_channel(self) -> grpc.aio.Channel:
        return self.cluster.channel(self.gateway())

    def _streams(self) -> StreamSource:
        """The site's streams for one run of it: each made ready once, then taken as is."""
        ready: dict[str, Stream] = {}

        async def stream(name: str, config: StreamConfig) -> Stream:
            found = ready.get(name)
            if found is None or found.partitions[0].deleted:
                found = ready[name] = await self._settled(name, config)
            return found

        return stream

    async def _settled(self, name: str, config: StreamConfig) -> Stream:
        """``name`` as a replicated stream led by this broker, once its high watermark covers
        its whole log: a new leader's records above it are the log all the same, but readers
        (the tag index's rebuild, the sink's recovery, ``__lrq_state``) see only up to it, and
        it gets there once the other in-sync replicas have fetched them."""
        anchor = "" if name == DELTA_QUEUE else DELTA_QUEUE
        stream = await self.cluster.internal_stream(name, config, colocate=anchor)
        deadline = time.monotonic() + SETTLE_S
        while True:
            leads = all(self.cluster.leads(name, p.number) for p in stream.partitions)
            if leads and all(
                p.log.high_watermark >= p.log.newest_offset for p in stream.partitions
            ):
                return stream
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(
                    f"{name} is not led here with its whole log in sync after {SETTLE_S:g} s "
                    f"(its leadership is moving, or its followers are behind)"
                )
            await asyncio.sleep(self.cluster.settings.poll_s)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"site {self.site_id}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._stop()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as error:
                if str(error) != self._failing:  # once per reason, not every pass
                    if isinstance(error, TidelogError):  # a known condition
                        LOG.warning("site %s: %s; trying again", self.site_id, error)
                    else:  # a bug: its traceback, once
                        LOG.exception("site %s: the site loop failed; trying again", self.site_id)
                self._failing = str(error)
            else:
                self._failing = ""
            await asyncio.sleep(self.cluster.settings.poll_s * 2)

    async def step(self) -> None:
        """One pass: create the delta queue if the cluster has none; open the site when this
        broker leads it, close it when it does not."""
        cluster = self.cluster
        if not cluster.member:
            await self._stop()
            return
        if DELTA_QUEUE not in cluster.view.streams and self._queue_config is not None:
            with contextlib.suppress(FailedPrecondition):  # not a replica: others create it
                await cluster.internal_stream(DELTA_QUEUE, self._queue_config)
        epoch = self._leader_epoch()
        if not cluster.leads(DELTA_QUEUE, 0) or (
            self._running is not None and epoch != self._opened_epoch
        ):
            # Not the leader, or led again after another broker led it in between (what the
            # site holds in memory may stand on records that broker's log cut): open anew.
            await self._stop()
            if not cluster.leads(DELTA_QUEUE, 0):
                return
        if self._running is not None:
            return
        site = self._make_site(self._streams())
        site.fence(lambda: cluster.leads(DELTA_QUEUE, 0) and self._leader_epoch() == epoch)
        try:
            await site.open(self._configured)
        except BaseException:
            with contextlib.suppress(Exception):
                await site.close()
            raise
        if not cluster.leads(DELTA_QUEUE, 0) or self._leader_epoch() != epoch:
            await site.close()  # lost it while opening
            return
        self._running = site
        self._opened_epoch = epoch
        LOG.info("site %s runs on this broker now (it leads %s)", self.site_id, DELTA_QUEUE)

    def _leader_epoch(self) -> int:
        state = self.cluster.view.partitions.get((DELTA_QUEUE, 0))
        return -1 if state is None else state.leader_epoch

    async def _stop(self) -> None:
        site, self._running = self._running, None
        if site is not None:
            LOG.info("site %s no longer runs on this broker", self.site_id)
            await site.close()
