"""Multi-site replication from the client: declare remote sites and transmit payloads to them
(``docs/replication.md``; the server needs a site id).

:class:`SiteCalls` is mixed into :class:`~tidelog.client.AsyncClient` and :class:`SyncSiteCalls`
into the blocking :class:`~tidelog.client.Client`. Declaring, forgetting and listing sites are
retried while the server is unreachable (an ``ALREADY_EXISTS`` or ``NOT_FOUND`` after an
unanswered attempt means that attempt went through). A transmit is not retried: it is not
idempotent, and a retry after an unanswered attempt could store the payloads twice.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.errors import from_rpc_error
from tidelog.client.retry import Attempt, removal
from tidelog.wire.columns import pack_u32

T = TypeVar("T")


def _packed(client_name: str, items: list[tuple[bytes, Sequence[str]]]) -> v1.TransmitRequest:
    """A packed ``TransmitRequest``: the payloads as one buffer and their sizes, the call's
    distinct destination lists and each entry's index into them."""
    lists: dict[tuple[str, ...], int] = {}
    indexes = [lists.setdefault(tuple(destinations), len(lists)) for _, destinations in items]
    payloads = [payload for payload, _ in items]
    return v1.TransmitRequest(
        client_name=client_name,
        payloads=b"".join(payloads),
        payload_sizes=pack_u32(map(len, payloads)),
        destination_lists=[v1.DestinationList(sites=sites) for sites in lists],
        destination_indexes=pack_u32(indexes),
    )


@dataclass(frozen=True, slots=True)
class SiteInfo:
    site_id: str
    address: str
    number: int
    """The site's bit in the send queue's destination masks."""
    since: int
    """The send-queue offset from which entries may be for it."""

    @classmethod
    def from_wire(cls, site: v1.SiteInfo) -> SiteInfo:
        return cls(site.site_id, site.address, site.number, site.since)


@dataclass(frozen=True, slots=True)
class SiteStatus:
    """A remote site's sync state and lag, as its source sees it."""

    site_id: str
    address: str
    state: str
    """initialized, negotiating, snapshot_sync, wait_snapshot_apply, log_entry_sync, error or
    stopped"""
    acked: int
    lag_entries: int
    lag_seconds: float
    last_ack_unix_s: float | None
    caught_up: bool
    stalled: bool
    reason: str

    @classmethod
    def from_wire(cls, site: v1.SiteState) -> SiteStatus:
        return cls(
            site.site_id,
            site.address,
            site.state,
            site.acked,
            site.lag_entries,
            site.lag_seconds,
            site.last_ack_unix_s or None,
            site.caught_up,
            site.stalled,
            site.reason,
        )


class SiteCalls:
    """The site calls of :class:`~tidelog.client.AsyncClient`."""

    _v1: v1_grpc.TidelogAsyncStub
    _transmit_packed: bool = False
    """The server answered a transmit with ``packed_transmit``: later calls go packed (a server
    from before the packed fields never says so, and keeps getting one message per entry)."""

    async def _retrying(self, attempt: Attempt[T], timeout: float | None = None) -> T:
        raise NotImplementedError  # provided by AsyncClient

    async def add_site(self, site_id: str, address: str) -> SiteInfo:
        """Declare remote site ``site_id`` at ``address`` (``HOST:PORT``)."""
        request = v1.AddSiteRequest(site_id=site_id, address=address)

        async def attempt(timeout: float | None, number: int) -> v1.AddSiteResponse:
            return await self._v1.AddSite(request, timeout=timeout)

        return SiteInfo.from_wire((await self._retrying(attempt)).site)

    async def remove_site(self, site_id: str) -> None:
        request = v1.RemoveSiteRequest(site_id=site_id)
        await self._retrying(removal(lambda timeout: self._v1.RemoveSite(request, timeout=timeout)))

    async def list_sites(self) -> tuple[str, list[SiteInfo]]:
        """This server's site id and the remote sites it replicates to."""

        async def attempt(timeout: float | None, number: int) -> v1.ListSitesResponse:
            return await self._v1.ListSites(v1.ListSitesRequest(), timeout=timeout)

        response = await self._retrying(attempt)
        return response.local_site, [SiteInfo.from_wire(s) for s in response.sites]

    async def site_status(self) -> list[SiteStatus]:
        """Per remote site: its sender's state, what it acknowledged, and its lag."""

        async def attempt(timeout: float | None, number: int) -> v1.SiteStatusResponse:
            return await self._v1.SiteStatus(v1.SiteStatusRequest(), timeout=timeout)

        return [SiteStatus.from_wire(s) for s in (await self._retrying(attempt)).sites]

    async def transmit(self, client_name: str, payload: bytes, destinations: Sequence[str]) -> int:
        """Store ``payload`` once for ``destinations``; its position in the send queue."""
        (position,) = await self.transmit_many(client_name, [(payload, destinations)])
        return position

    async def transmit_many(
        self, client_name: str, items: Iterable[tuple[bytes, Sequence[str]]]
    ) -> list[int]:
        """Store each payload once for its destinations, in order, in one call; their
        positions. A refused item stores nothing of the call."""
        if self._transmit_packed:
            request = _packed(client_name, list(items))
        else:
            request = v1.TransmitRequest(
                client_name=client_name,
                entries=[
                    v1.TransmitEntry(payload=payload, destinations=list(destinations))
                    for payload, destinations in items
                ],
            )
        try:
            response = await self._v1.Transmit(request)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        if response.packed_transmit:
            self._transmit_packed = True  # the server reads packed calls: send those from now
        return list(response.positions)

    async def resync_site(self, site_id: str) -> bool:
        """Start a snapshot sync of remote site ``site_id`` (this site's snapshot provider
        sends its state, then deltas resume). False when one was asked for or under way
        already: the server started none (that one sends the state)."""
        request = v1.ResyncSiteRequest(site_id=site_id)

        async def attempt(timeout: float | None, number: int) -> v1.ResyncSiteResponse:
            return await self._v1.ResyncSite(request, timeout=timeout)

        response = await self._retrying(attempt)
        return not response.already_running

    async def transmit_snapshot(
        self,
        site_id: str,
        snapshot: int,
        items: Iterable[tuple[str, bytes]] = (),
        *,
        begin: bool = False,
        end: bool = False,
    ) -> int:
        """Part of snapshot ``snapshot`` for ``site_id``: (client name, payload) items, the
        first call with ``begin``, the last with ``end``; the delta position it covers. The
        snapshot provider (``snapshot_provider``) makes these calls; not retried."""
        request = v1.TransmitSnapshotRequest(
            site_id=site_id,
            snapshot=snapshot,
            begin=begin,
            end=end,
            entries=[v1.SnapshotPayload(client_name=c, payload=p) for c, p in items],
        )
        try:
            response = await self._v1.TransmitSnapshot(request)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return response.covered


class SyncSiteCalls:
    """The blocking forms of :class:`SiteCalls`, mixed into :class:`~tidelog.client.Client`."""

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # provided by Client

    def _site_calls(self) -> SiteCalls:
        raise NotImplementedError  # provided by Client

    def add_site(self, site_id: str, address: str) -> SiteInfo:
        return self._run(self._site_calls().add_site(site_id, address))

    def remove_site(self, site_id: str) -> None:
        self._run(self._site_calls().remove_site(site_id))

    def list_sites(self) -> tuple[str, list[SiteInfo]]:
        return self._run(self._site_calls().list_sites())

    def site_status(self) -> list[SiteStatus]:
        return self._run(self._site_calls().site_status())

    def transmit(self, client_name: str, payload: bytes, destinations: Sequence[str]) -> int:
        return self._run(self._site_calls().transmit(client_name, payload, destinations))

    def transmit_many(
        self, client_name: str, items: Iterable[tuple[bytes, Sequence[str]]]
    ) -> list[int]:
        return self._run(self._site_calls().transmit_many(client_name, list(items)))

    def resync_site(self, site_id: str) -> bool:
        return self._run(self._site_calls().resync_site(site_id))
