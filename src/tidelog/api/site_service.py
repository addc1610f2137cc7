"""The multi-site RPCs of ``tidelog.v1``: declare, forget and list remote sites; transmit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import numpy as np
import numpy.typing as npt

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.status import grpc_errors
from tidelog.errors import FailedPrecondition, InvalidArgument
from tidelog.sites.local_site import LocalSite
from tidelog.sites.registry import Site
from tidelog.sites.routed import RoutedColumns, from_wire
from tidelog.sites.sink import SnapshotFrame
from tidelog.sites.windows import Framed

Context = grpc.aio.ServicerContext[object, object]
_U32 = np.dtype("<u4")


def _wire(site: Site) -> v1.SiteInfo:
    return v1.SiteInfo(
        site_id=site.site_id, address=site.address, number=site.number, since=site.since
    )


class SiteService(v1_grpc.TidelogServicer):
    """Answers the site RPCs; mixed into :class:`tidelog.api.v1.TidelogService`."""

    local_site: LocalSite | None

    def _site(self) -> LocalSite:
        if self.local_site is None:
            raise FailedPrecondition(
                "this server has no site id: start it with --site-id ID (or site_id in its "
                "settings) to replicate to other sites"
            )
        return self.local_site

    async def AddSite(self, request: v1.AddSiteRequest, context: Context) -> v1.AddSiteResponse:
        async with grpc_errors(context):
            return v1.AddSiteResponse(
                site=_wire(self._site().add_site(request.site_id, request.address))
            )
        raise AssertionError("unreachable")

    async def RemoveSite(
        self, request: v1.RemoveSiteRequest, context: Context
    ) -> v1.RemoveSiteResponse:
        async with grpc_errors(context):
            await self._site().remove_site(request.site_id)
        return v1.RemoveSiteResponse()

    async def ListSites(
        self, request: v1.ListSitesRequest, context: Context
    ) -> v1.ListSitesResponse:
        async with grpc_errors(context):
            site = self._site()
            return v1.ListSitesResponse(
                local_site=site.site_id, sites=[_wire(s) for s in site.sites()]
            )
        raise AssertionError("unreachable")

    async def SiteStatus(
        self, request: v1.SiteStatusRequest, context: Context
    ) -> v1.SiteStatusResponse:
        async with grpc_errors(context):
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
        async with grpc_errors(context):
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
        async with grpc_errors(context):
            # The hello first: bytes that do not decode are the caller's error, whatever this
            # server is (INVALID_ARGUMENT, as for every method).
            first = await anext(request_iterator, None)
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
            async for request in request_iterator:
                frame = request.WhichOneof("frame")
                if frame == "deltas":
                    acked = await site.sink.receive(source, _batch(request.deltas))
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
        async with grpc_errors(context):
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
        async with grpc_errors(context):
            self._site().resync(request.site_id)
        return v1.ResyncSiteResponse()


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
