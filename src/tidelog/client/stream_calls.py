"""Stream administration from the client: create, delete, pause and make read-only streams,
and read their metadata (``proto.API``, the Liftbridge-compatible service).

:class:`StreamCalls` is mixed into :class:`~tidelog.client.AsyncClient`. Every call is retried
while the server is unreachable (``tidelog.client.retry``): ALREADY_EXISTS from a retried create
is accepted when the stream is what was asked for, and NOT_FOUND from a retried delete means an
earlier attempt deleted it. Reading metadata teaches the client each stream's partition count
(where a keyed publish goes) and, in a cluster, the partitions' leaders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client.errors import AlreadyExists, NotFound, from_rpc_error
from tidelog.client.leaders import LeaderRouter
from tidelog.client.models import PartitionInfo, StreamInfo
from tidelog.client.retry import Attempt, removal
from tidelog.client.view_calls import View

T = TypeVar("T")


class StreamCalls:
    """The stream calls of :class:`~tidelog.client.AsyncClient`."""

    _api: pb_grpc.APIAsyncStub
    _router: LeaderRouter
    _partition_counts: dict[str, int]
    """Partitions per stream, as created here or last read from metadata."""

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        raise NotImplementedError  # provided by AsyncClient

    # ViewCalls provides it. Declared for the type checker only, so that no order of
    # AsyncClient's bases can let a stub here hide the real method.
    if TYPE_CHECKING:

        async def declare_view(self, stream: str, view: View) -> None: ...

    async def create_stream(
        self,
        name: str,
        *,
        partitions: int = 1,
        subject: str | None = None,
        retention_bytes: int | None = None,
        retention_messages: int | None = None,
        retention_age_s: float | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age_s: float | None = None,
        optimistic_concurrency: bool = False,
        compact: bool = False,
        log_append_time: bool = False,
        views: Sequence[View] = (),
        replication_factor: int = 1,
        min_isr: int | None = None,
    ) -> None:
        """Create a stream, then declare ``views`` on it (tables and window indexes).

        In a cluster, ``replication_factor`` brokers keep a copy of each partition (-1: every
        broker) and ``min_isr`` in-sync copies are needed to acknowledge a publish (default: the
        server's); a single broker accepts only 1 (or -1)."""
        request = pb.CreateStreamRequest(
            name=name,
            subject=subject or name,
            partitions=partitions,
            replicationFactor=replication_factor,
        )
        if min_isr is not None:
            request.minIsr.value = min_isr
        if retention_bytes is not None:
            request.retentionMaxBytes.value = retention_bytes
        if retention_messages is not None:
            request.retentionMaxMessages.value = retention_messages
        if retention_age_s is not None:
            request.retentionMaxAge.value = int(retention_age_s * 1000)
        if segment_max_bytes is not None:
            request.segmentMaxBytes.value = segment_max_bytes
        if segment_max_age_s is not None:
            request.segmentMaxAge.value = int(segment_max_age_s * 1000)
        if optimistic_concurrency:
            request.optimisticConcurrencyControl.value = True
        if compact:
            request.compactEnabled.value = True
        request.logAppendTime = log_append_time

        async def attempt(timeout: float | None, number: int) -> None:
            try:
                await self._api.CreateStream(request, timeout=timeout)
            except grpc.RpcError as error:
                if number == 1 or error.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                await self._created_by_an_earlier_attempt(request, error)

        await self._retrying(attempt)
        self._partition_counts[name] = max(partitions, 1)  # the server reads 0 as 1
        for view in views:
            await self.declare_view(name, view)

    async def _created_by_an_earlier_attempt(
        self, request: pb.CreateStreamRequest, error: grpc.RpcError
    ) -> None:
        """ALREADY_EXISTS after an attempt that went unanswered: that attempt most likely
        created the stream. Accept it when the stream is what was asked for (its partitions and
        subject; retention and segment settings are not in the metadata), else raise."""
        (info,) = await self._metadata([request.name])
        wanted = max(request.partitions, 1)
        if len(info.partitions) == wanted and info.subject == request.subject:
            return
        raise AlreadyExists(
            f"{from_rpc_error(error)}; it has {len(info.partitions)} partitions and subject "
            f"{info.subject!r}, not {wanted} and {request.subject!r} as asked (an earlier attempt "
            f"of this call went unanswered while the server was unreachable)"
        )

    async def delete_stream(self, name: str) -> None:
        """Delete a stream. NOT_FOUND from a retry, after an attempt that went unanswered while
        the server was unreachable, counts as deleted (by that attempt)."""

        request = pb.DeleteStreamRequest(name=name)
        await self._retrying(
            removal(lambda timeout: self._api.DeleteStream(request, timeout=timeout))
        )
        self._partition_counts.pop(name, None)

    async def pause_stream(
        self, name: str, partitions: Sequence[int] | None = None, *, resume_all: bool = False
    ) -> None:
        """Pause partitions (all when ``partitions`` is None): their files are closed until a
        message is published to one, which resumes it (or, with ``resume_all``, every partition
        paused here)."""
        request = pb.PauseStreamRequest(
            name=name, partitions=list(partitions or ()), resumeAll=resume_all
        )

        async def attempt(timeout: float | None, number: int) -> None:
            await self._api.PauseStream(request, timeout=timeout)

        await self._retrying(attempt)

    async def set_stream_readonly(
        self, name: str, readonly: bool = True, partitions: Sequence[int] | None = None
    ) -> None:
        """Make partitions (all when ``partitions`` is None) read-only (publishes are refused),
        or writable again with ``readonly=False``."""
        request = pb.SetStreamReadonlyRequest(
            name=name, partitions=list(partitions or ()), readonly=readonly
        )

        async def attempt(timeout: float | None, number: int) -> None:
            await self._api.SetStreamReadonly(request, timeout=timeout)

        await self._retrying(attempt)

    async def list_streams(self) -> list[StreamInfo]:
        """Every stream, internal ones (``__cursors``) included, sorted by name."""
        return await self._metadata([])

    async def stream_info(self, name: str) -> StreamInfo:
        found = await self._metadata([name])
        return found[0]

    async def _metadata(self, names: list[str]) -> list[StreamInfo]:
        request = pb.FetchMetadataRequest(streams=names)

        async def attempt(timeout: float | None, number: int) -> pb.FetchMetadataResponse:
            return await self._api.FetchMetadata(request, timeout=timeout)

        response = await self._retrying(attempt)
        self._router.learn(response)
        infos = []
        for meta in response.streamMetadata:
            if meta.error == pb.StreamMetadata.UNKNOWN_STREAM:
                raise NotFound(f"no such stream: {meta.name!r}")
            parts = tuple(_partition_info(p) for _, p in sorted(meta.partitions.items()))
            self._partition_counts[meta.name] = len(parts)
            infos.append(StreamInfo(meta.name, meta.subject, meta.creationTimestamp, parts))
        return infos

    async def partition_leaders(self, stream: str) -> dict[int, str]:
        """Each partition's leader as ``host:port``, from fresh metadata: against a single
        broker every one is the server this client talks to."""
        info = await self.stream_info(stream)
        return {p.partition: self._router.address(stream, p.partition) for p in info.partitions}

    async def partition_info(self, stream: str, partition: int = 0) -> PartitionInfo:
        """One partition as its leader sees it (``FetchPartitionMetadata``): in a cluster its
        high watermark is the leader's, where ``stream_info`` may answer from a follower whose
        high watermark trails by a fetch."""
        request = pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)

        async def attempt(timeout: float | None, number: int) -> pb.FetchPartitionMetadataResponse:
            answer: pb.FetchPartitionMetadataResponse = await self._router.api(
                stream, partition
            ).FetchPartitionMetadata(request, timeout=timeout)
            return answer

        return _partition_info((await self._retrying(attempt, route=(stream, partition))).metadata)


def _partition_info(p: pb.PartitionMetadata) -> PartitionInfo:
    return PartitionInfo(
        partition=p.id,
        high_watermark=p.highWatermark,
        newest_offset=p.newestOffset,
        paused=p.paused,
        readonly=p.readonly,
        leader=p.leader,
    )


__all__ = ["StreamCalls"]
