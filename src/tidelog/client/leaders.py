"""Which broker leads each partition, for a client of a cluster, and which broker takes the
calls any broker answers.

Theory of operation. A client is given one server. Before its first call, and before the first
publish or subscription of a stream, it asks that server for metadata (``__cursors``', then
the stream's; once each). Against a single broker nothing more happens: every call goes to that
server, as it always did. When metadata names more than one broker, or a broker answers "not
partition leader" (FAILED_PRECONDITION, Liftbridge's text), the client knows it talks to a
cluster: from then on it sends a partition's calls to its leader, over one channel per broker,
and asks any broker it knows for metadata when a leader refuses or cannot be reached
(``after_failure``; a leader that cannot be reached is forgotten first, so that only an answer
naming it again sends calls back to it). Until its lease expires the metadata still names a
dead leader: each attempt then fails at once (nothing connects) and is followed by another
lookup, and while the election is under way (no live leader) the caller's retry budget waits.
Calls any broker answers (metadata, views, groups, stream administration) go to the **entry**
broker: the given server until it cannot be reached, then the next broker the client knows, in
turn (``entry_failed``), so a client whose given broker died keeps working.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.settings import ClientSettings
from tidelog.security import aio_channel

NOT_LEADER_TEXT = "not partition leader"
"""What a broker's status detail says when another broker leads the partition."""

LOOKUP_TIMEOUT_S = 2.0
SUBSCRIBE_BATCHES = "/tidelog.v1.Tidelog/SubscribeBatches"


def not_leader(error: grpc.RpcError) -> bool:
    return (
        error.code() == grpc.StatusCode.FAILED_PRECONDITION
        and NOT_LEADER_TEXT in (error.details() or "").lower()
    )


class LeaderRouter:
    def __init__(self, server: str, channel: grpc.aio.Channel, settings: ClientSettings) -> None:
        self.server = server
        self._settings = settings
        self._channels: dict[str, grpc.aio.Channel] = {server: channel}
        self._stubs: dict[str, tuple[Any, Any]] = {}
        self._frame_calls: dict[str, Any] = {}
        self._leaders: dict[tuple[str, int], str] = {}
        self.entry = server
        """Where calls any broker answers go: the given server, or once it could not be reached
        in a cluster, another broker the client knows."""
        self._looked_up: set[str] = set()
        self._partitions: dict[str, int] = {}
        self.clustered = False
        """True once a broker said it does not lead a partition, or metadata named several."""

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio_channel(address, self._settings.tls, self._settings.grpc_options())
            self._channels[address] = channel
        return channel

    def address(self, stream: str, partition: int) -> str:
        """Where calls for a partition go: its leader once known, else the entry broker."""
        if not self.clustered:
            return self.server
        return self._leaders.get((stream, partition), self.entry)

    def _stubs_of(self, address: str) -> tuple[Any, Any]:
        stubs = self._stubs.get(address)
        if stubs is None:
            channel = self.channel(address)
            stubs = self._stubs[address] = (pb_grpc.APIStub(channel), v1_grpc.TidelogStub(channel))
        return stubs

    def v1(self, stream: str, partition: int) -> Any:
        return self._stubs_of(self.address(stream, partition))[1]

    def subscribe_frames(self, stream: str, partition: int) -> Any:
        """``tidelog.v1/SubscribeBatches`` at the partition's leader, its frames handed over as
        received, serialised (``bytes``, for ``tidelog.wire.received.ReceivedFrame``)."""
        address = self.address(stream, partition)
        call = self._frame_calls.get(address)
        if call is None:
            call = self._frame_calls[address] = self.channel(address).unary_stream(
                SUBSCRIBE_BATCHES,
                request_serializer=v1.SubscribeBatchesRequest.SerializeToString,
                response_deserializer=None,
            )
        return call

    def api(self, stream: str, partition: int) -> Any:
        return self._stubs_of(self.address(stream, partition))[0]

    def entry_v1(self) -> Any:
        return self._stubs_of(self.entry)[1]

    def entry_api(self) -> Any:
        return self._stubs_of(self.entry)[0]

    def entry_failed(self) -> None:
        """A call any broker answers could not reach the entry broker: in a cluster, the next
        attempt goes to the next broker known (in address order, round)."""
        if not self.clustered:
            return
        known = sorted(self._channels)
        self.entry = known[(known.index(self.entry) + 1) % len(known)]

    def learn(self, response: pb.FetchMetadataResponse) -> None:
        """Take the leaders a metadata answer names (the streams it names need no lookup; one
        it does not know yet is looked up again before its next call: it may be created
        since)."""
        self._looked_up.update(
            meta.name
            for meta in response.streamMetadata
            if meta.error != pb.StreamMetadata.Error.UNKNOWN_STREAM
        )
        for meta in response.streamMetadata:
            if meta.partitions:
                self._partitions[meta.name] = len(meta.partitions)
        brokers = {b.id: f"{b.host}:{b.port}" for b in response.brokers}
        if len(brokers) > 1:
            self.clustered = True
        if not self.clustered:
            return
        for broker_address in brokers.values():
            self.channel(broker_address)
        for meta in response.streamMetadata:
            for number, partition in meta.partitions.items():
                address = brokers.get(partition.leader)
                if address is None:
                    self._leaders.pop((meta.name, number), None)
                else:
                    self._leaders[meta.name, number] = address

    def partition_count(self, stream: str) -> int:
        """How many partitions the last metadata answer gave ``stream`` (1 before any)."""
        return self._partitions.get(stream, 1)

    def relocator(self, stream: str, partition: int) -> Callable[[grpc.RpcError], Awaitable[None]]:
        """:meth:`after_failure` for one partition, as the callback the retry loop, the
        publisher and the consumer take."""

        async def relocate(error: grpc.RpcError) -> None:
            await self.after_failure(error, stream, partition)

        return relocate

    async def after_failure(self, error: grpc.RpcError, stream: str, partition: int) -> None:
        """After a call routed to the partition's leader failed (refused, or lost with its
        broker), before it or the next call is sent: learn who leads now. An unreachable leader
        is forgotten first, so that only an answer still naming it (its lease has not expired
        yet) sends calls back to it."""
        if not_leader(error):
            self.clustered = True
        if not self.clustered:
            return
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            self._leaders.pop((stream, partition), None)
        await self.refresh(stream)

    async def ensure(self, stream: str) -> None:
        """Look the stream's leaders up once, before its first routed call: a client given a
        broker that dies must know the others to fail over to. A lookup that no broker answered
        is made again before the next call."""
        if stream not in self._looked_up:
            await self.refresh(stream)  # an answer marks it looked up (``learn``)

    async def refresh(self, stream: str) -> None:
        """Ask the brokers known, the entry broker first, for the stream's leaders."""
        request = pb.FetchMetadataRequest(streams=[stream])
        for address in sorted(self._channels, key=lambda a: a != self.entry):
            with contextlib.suppress(grpc.RpcError):
                stub = self._stubs_of(address)[0]
                self.learn(await stub.FetchMetadata(request, timeout=LOOKUP_TIMEOUT_S))
                return

    async def close(self) -> None:
        for address, channel in self._channels.items():
            if address != self.server:
                await channel.close()
