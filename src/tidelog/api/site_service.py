"""The multi-site RPCs of ``tidelog.v1``: declare, forget and list remote sites; transmit.

On a cluster the site runs on one broker, its gateway (``tidelog.control.site_host``); a site
RPC reaching
another broker is handed to the gateway (with the ``FORWARDED`` header, so it goes no further)
and its answer, or its failure's status, passed back. A source site's replication stream is
relayed both ways, so a remote site may be declared with the address of any broker of the
cluster.

Who may replicate (``docs/security.md``, "Sites trust sites"). When the server has TLS, a
replication stream is accepted only from the site it claims to come from: the caller's principal
(its certificate's first subject alternative name) must be the hello's source site, and that
site must be declared here (settings ``sites`` or ``AddSite``), else PERMISSION_DENIED before
anything is applied. On a cluster, a stream relayed to the gateway was checked by the broker
that took it; the gateway accepts it from a caller with ``cluster`` on the cluster (a broker).
Without TLS nothing says who calls: replication is unprotected, and the server warns at start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.access import Kind, Operation, caller, on
from tidelog.api.status import handed_over
from tidelog.control import Control, SiteHost, forwarded
from tidelog.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotLeader,
    PermissionDenied,
    SiteMoving,
)
from tidelog.sites import Framed, LocalSite, RoutedColumns, Site, SnapshotFrame, from_wire
from tidelog.wire import FORWARDED

Context = grpc.aio.ServicerContext[object, object]
_U32 = np.dtype("<u4")


def _wire(site: Site) -> v1.SiteInfo:
    return v1.SiteInfo(
        site_id=site.site_id, address=site.address, number=site.number, since=site.since
    )


class SiteService(v1_grpc.TidelogServicer):
    """Answers the site RPCs; mixed into :class:`tidelog.api.v1.TidelogService`."""

    control: Control

    @contextlib.asynccontextmanager
    async def _errors(self, context: Context) -> AsyncIterator[None]:
        """A site stream this broker no longer leads (``NotLeader``: the site is moving and the
        site loop has not closed it yet) answered as the site moving (UNAVAILABLE,
        retryable)."""
        try:
            yield
        except NotLeader:
            sites = self.control.sites
            if sites is None:
                raise
            raise SiteMoving(sites.site_id) from None

    def _host(self) -> SiteHost:
        sites = self.control.sites
        if sites is None:
            raise FailedPrecondition(
                "this server has no site id: start it with --site-id ID (or site_id in its "
                "settings) to replicate to other sites"
            )
        return sites

    def _site(self) -> LocalSite:
        host = self._host()
        local = host.local
        if local is None:
            raise SiteMoving(host.site_id)
        return local

    def _gateway(self, context: Context) -> Any | None:
        """A stub of the broker that runs this cluster's site, when it is not this one (None:
        it runs here). ``SiteMoving`` when none runs it now, or when this call was handed
        over already (it never goes around)."""
        host = self._host()
        if host.local is not None:
            return None
        if handed_over(context):
            raise SiteMoving(host.site_id)
        return v1_grpc.TidelogStub(host.gateway_channel())

    async def _handed(self, method: str, request: Any, context: Context) -> Any | None:
        """``request`` answered by the gateway (None: the site runs here)."""
        stub = self._gateway(context)
        if stub is None:
            return None
        remaining = context.time_remaining()
        try:
            return await getattr(stub, method)(
                request, timeout=remaining, metadata=((FORWARDED, "1"),)
            )
        except grpc.aio.AioRpcError as error:
            raise forwarded(error) from None

    async def AddSite(self, request: v1.AddSiteRequest, context: Context) -> v1.AddSiteResponse:
        async with self._errors(context):
            if (answer := await self._handed("AddSite", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            return v1.AddSiteResponse(
                site=_wire(await self._site().add_site(request.site_id, request.address))
            )
        raise AssertionError("unreachable")

    async def RemoveSite(
        self, request: v1.RemoveSiteRequest, context: Context
    ) -> v1.RemoveSiteResponse:
        async with self._errors(context):
            if (answer := await self._handed("RemoveSite", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            await self._site().remove_site(request.site_id)
        return v1.RemoveSiteResponse()

    async def ListSites(
        self, request: v1.ListSitesRequest, context: Context
    ) -> v1.ListSitesResponse:
        async with self._errors(context):
            if (answer := await self._handed("ListSites", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            site = self._site()
            return v1.ListSitesResponse(
                local_site=site.site_id, sites=[_wire(s) for s in site.sites()]
            )
        raise AssertionError("unreachable")

    async def SiteStatus(
        self, request: v1.SiteStatusRequest, context: Context
    ) -> v1.SiteStatusResponse:
        async with self._errors(context):
            if (answer := await self._handed("SiteStatus", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            site = self._site()
            return v1.SiteStatusResponse(
                local_site=site.site_id,
                sites=[
                    v1.SiteState(
                        site_id=s.site_id,
                        address=s.address,
                        state=s.state.value,
                        acked=s.acked,
                        lag_entries=s.lag_entries,
                        lag_seconds=s.lag_seconds,
                        last_ack_unix_s=s.last_ack_s or 0.0,
                        caught_up=s.caught_up,
                        stalled=s.stalled,
                        reason=s.reason,
                    )
                    for s in site.status()
                ],
            )
        raise AssertionError("unreachable")

    async def Transmit(self, request: v1.TransmitRequest, context: Context) -> v1.TransmitResponse:
        async with self._errors(context):
            if (answer := await self._handed("Transmit", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            site = self._site()
            entries = request.entries
            if not entries:
                payloads, sizes, lists, indexes = _packed_transmit(request)
                positions = await site.transmit_packed(
                    request.client_name, payloads, sizes, lists, indexes
                )
            elif request.payloads or request.payload_sizes or request.destination_indexes:
                raise InvalidArgument(
                    "a transmit carries its entries either packed or as messages, not both"
                )
            else:
                positions = await site.transmit_columns(
                    request.client_name,
                    [e.payload for e in entries],
                    [e.destinations for e in entries],
                )
            return v1.TransmitResponse(positions=positions, packed_transmit=True)
        raise AssertionError("unreachable")

    async def Replicate(
        self, request_iterator: AsyncIterator[v1.ReplicationRequest], context: Context
    ) -> AsyncIterator[v1.ReplicationReply]:
        """A source site's sender: its hello, answered with this sink's progress for it, then
        delta batches, each answered with the cumulative ack once applied and synced."""
        async with self._errors(context):
            # The hello first: bytes that do not decode are the caller's error, whatever this
            # server is (INVALID_ARGUMENT, as for every method).
            first = await anext(request_iterator, None)
            if first is not None and first.HasField("hello"):
                _admit(self._host(), first.hello.source_site, context)
            stub = self._gateway(context)
            if stub is not None:
                if first is not None:
                    async for reply in _relay(stub, first, request_iterator):
                        yield reply
                return
            site = self._site()
            if first is None or not first.HasField("hello"):
                raise InvalidArgument("a replication stream starts with a hello")
            hello = first.hello
            if hello.sink_site != site.site_id:
                raise FailedPrecondition(
                    f"this server is site {site.site_id!r}, not {hello.sink_site!r}: check the "
                    f"address declared for that site"
                )
            source = hello.source_site
            secured = self._host().secured
            _declared(site, source, secured)
            progress = site.sink.progress(source)
            yield v1.ReplicationReply(
                progress=v1.SinkProgress(
                    snapshot_started=progress.snapshot_started,
                    snapshot_transferred=progress.snapshot_transferred,
                    snapshot_applied=progress.snapshot_applied,
                    last_processed=progress.last_processed,
                    packed_deltas=True,
                )
            )
            opening = True  # the stream's first delta batch: where the sender starts
            async for request in request_iterator:
                _declared(site, source, secured)  # a site removed meanwhile sends no more
                frame = request.WhichOneof("frame")
                if frame == "deltas":
                    acked = await site.sink.receive(source, _batch(request.deltas), opening=opening)
                    opening = False
                    yield v1.ReplicationReply(acked=acked)
                elif frame == "snapshot":
                    applied = await site.sink.receive_snapshot(source, _snapshot(request.snapshot))
                    if applied is not None:
                        yield v1.ReplicationReply(snapshot_applied=applied)
                else:
                    raise InvalidArgument(
                        "after the hello a replication stream sends delta or snapshot batches"
                    )

    async def TransmitSnapshot(
        self, request: v1.TransmitSnapshotRequest, context: Context
    ) -> v1.TransmitSnapshotResponse:
        async with self._errors(context):
            if (answer := await self._handed("TransmitSnapshot", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            covered = await self._site().transmit_snapshot(
                request.site_id,
                request.snapshot,
                [(e.client_name, e.payload) for e in request.entries],
                begin=request.begin,
                end=request.end,
            )
            return v1.TransmitSnapshotResponse(covered=covered)
        raise AssertionError("unreachable")

    async def ResyncSite(
        self, request: v1.ResyncSiteRequest, context: Context
    ) -> v1.ResyncSiteResponse:
        async with self._errors(context):
            if (answer := await self._handed("ResyncSite", request, context)) is not None:
                return answer  # type: ignore[no-any-return]
            started = self._site().resync(request.site_id)
            return v1.ResyncSiteResponse(already_running=not started)


def _admit(host: SiteHost, source: str, context: Context) -> None:
    """With TLS, a replication stream only from the site it claims to be (module docstring):
    PERMISSION_DENIED otherwise."""
    if not host.secured:
        return
    who = caller()
    if host.relays and handed_over(context):
        who.check(on(Operation.CLUSTER, Kind.CLUSTER))  # a broker that checked the source
        return
    if who.identity != source:
        name = repr(who.identity) if who.identity else "an anonymous caller"
        raise PermissionDenied(
            f"{name} may not replicate as site {source!r}: a replication stream is accepted "
            f"only from a certificate whose first subject alternative name is its source site"
        )


def _declared(site: LocalSite, source: str, secured: bool) -> None:
    """With TLS, replication only from a site declared here (module docstring)."""
    if secured and not site.declared(source):
        raise PermissionDenied(
            f"site {source!r} is not declared on site {site.site_id!r}: a site accepts "
            f"replication only from the sites declared on it (tidelog site add, or sites in "
            f"its settings)"
        )


async def _relay(
    stub: Any, first: v1.ReplicationRequest, requests: AsyncIterator[v1.ReplicationRequest]
) -> AsyncIterator[v1.ReplicationReply]:
    """A replication stream relayed to the gateway: the requests (``first`` and the rest) go
    there as they come, its replies come back; its failure ends this stream with its status."""
    call = stub.Replicate(metadata=((FORWARDED, "1"),))

    async def pump() -> None:
        await call.write(first)
        async for request in requests:
            await call.write(request)
        await call.done_writing()

    pumping = asyncio.create_task(pump())
    try:
        async for reply in call:
            yield reply
        if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
            raise pumping.exception()  # type: ignore[misc]  # the caller's stream failed
    except grpc.aio.AioRpcError as error:
        raise forwarded(error) from None
    finally:
        pumping.cancel()
        with contextlib.suppress(BaseException):
            await pumping
        call.cancel()


def _packed_transmit(
    request: v1.TransmitRequest,
) -> tuple[bytes, npt.NDArray[np.int64], list[list[str]], npt.NDArray[np.int64]]:
    """The columns of a packed transmit; INVALID_ARGUMENT when one is not whole numbers of
    its entries (the send queue checks that they fit together)."""
    if len(request.payload_sizes) % 4 or len(request.destination_indexes) % 4:
        raise InvalidArgument(
            "payload_sizes and destination_indexes are little-endian uint32 columns: their "
            "lengths must be multiples of 4"
        )
    sizes = np.frombuffer(request.payload_sizes, dtype=_U32).astype(np.int64)
    indexes = np.frombuffer(request.destination_indexes, dtype=_U32).astype(np.int64)
    lists = [list(d.sites) for d in request.destination_lists]
    return request.payloads, sizes, lists, indexes


def _snapshot(batch: v1.SnapshotBatch) -> SnapshotFrame:
    return SnapshotFrame(
        batch.snapshot,
        batch.covered,
        start=batch.start,
        end=batch.end,
        entries=[(e.client_name, e.payload) for e in batch.entries],
    )


def _batch(deltas: v1.DeltaBatch) -> Framed[RoutedColumns]:
    try:
        return Framed(deltas.prev, deltas.current, from_wire(deltas))
    except ValueError as error:
        raise InvalidArgument(str(error)) from None
