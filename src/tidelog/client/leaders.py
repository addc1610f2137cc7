"""Which broker leads each partition, for a client of a cluster.

Theory of operation. A client is given one server. Before the first publish or subscription of
a stream it asks that server for the stream's metadata (once per stream). Against a single
broker nothing more happens: every call goes to that server, as it always did. When metadata
names more than one broker, or a broker answers "not partition leader" (FAILED_PRECONDITION,
Liftbridge's text), the client knows it talks to a cluster: from then on it sends a partition's
publishes and subscriptions to its leader, over one channel per broker, and asks any broker it
knows for metadata when a leader refuses or cannot be reached (an unreachable leader is
forgotten). While an election is under way (no live leader) the caller's retry budget waits.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.settings import ClientSettings

NOT_LEADER_TEXT = "not partition leader"
"""What a broker's status detail says when another broker leads the partition."""

LOOKUP_TIMEOUT_S = 2.0


def not_leader(error: grpc.RpcError) -> bool:
    return (
        error.code() == grpc.StatusCode.FAILED_PRECONDITION
        and NOT_LEADER_TEXT in (error.details() or "").lower()
    )


CURSORS_STREAM = "__cursors"
"""The internal stream cursors are kept in; in a cluster its partitions' leaders take the cursor
calls."""


class LeaderRouter:
    def __init__(self, server: str, channel: grpc.aio.Channel, settings: ClientSettings) -> None:
        self.server = server
        self._settings = settings
        self._channels: dict[str, grpc.aio.Channel] = {server: channel}
        self._leaders: dict[tuple[str, int], str] = {}
        self._looked_up: set[str] = set()
        self._partitions: dict[str, int] = {}
        self.clustered = False
        """True once a broker said it does not lead a partition, or metadata named several."""

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=self._settings.grpc_options())
            self._channels[address] = channel
        return channel

    def address(self, stream: str, partition: int) -> str:
        """Where calls for a partition go: its leader once known, else the given server."""
        if not self.clustered:
            return self.server
        return self._leaders.get((stream, partition), self.server)

    def v1(self, stream: str, partition: int) -> Any:
        return v1_grpc.TidelogStub(self.channel(self.address(stream, partition)))

    def api(self, stream: str, partition: int) -> Any:
        return pb_grpc.APIStub(self.channel(self.address(stream, partition)))

    def learn(self, response: pb.FetchMetadataResponse) -> None:
        """Take the leaders a metadata answer names (the streams it names need no lookup)."""
        self._looked_up.update(meta.name for meta in response.streamMetadata)
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

    async def after_failure(self, error: grpc.RpcError, stream: str, partition: int) -> None:
        """Before a call is tried again: learn who leads now (a refusal, an unreachable
        leader)."""
        if not_leader(error):
            self.clustered = True
        if not self.clustered:
            return
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            self._leaders.pop((stream, partition), None)
        await self.refresh(stream)

    async def ensure(self, stream: str) -> None:
        """Look the stream's leaders up once, before its first routed call: a client given a
        broker that dies must know the others to fail over to."""
        if stream not in self._looked_up:
            self._looked_up.add(stream)
            await self.refresh(stream)

    async def refresh(self, stream: str) -> None:
        """Ask the brokers known, the one given first, for the stream's leaders."""
        request = pb.FetchMetadataRequest(streams=[stream])
        for address in sorted(self._channels, key=lambda a: a != self.server):
            with contextlib.suppress(grpc.RpcError):
                stub = pb_grpc.APIStub(self._channels[address])
                self.learn(await stub.FetchMetadata(request, timeout=LOOKUP_TIMEOUT_S))
                return

    async def close(self) -> None:
        for address, channel in self._channels.items():
            if address != self.server:
                await channel.close()
