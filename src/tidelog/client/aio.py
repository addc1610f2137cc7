"""``AsyncClient``: the asyncio client for tidelog.

Control calls use the Liftbridge-compatible ``proto.API`` service; publishing batches and
subscribing use ``tidelog.v1`` (columnar batches, one acknowledgement per batch). The channel
reconnects promptly after the server comes back (``ClientSettings``); whether a failed call is
sent again is one rule for every call (``tidelog.client.retry``), and in a cluster a failed call
moves the client to the partition's new leader (``tidelog.client.leaders``).

This module holds the connection: the channel, the leader router and the one way every call is
sent (``AsyncClient._retrying``). The calls themselves are mixed in by concern: streams
(``stream_calls``), publishing (``publish_calls``), subscribing and consuming
(``subscribe_calls``), cursors (``cursor_calls``), views, sites, a stream's details and consumer
groups, and the cluster (``view_calls``, ``site_calls``, ``describe_calls``, ``cluster_calls``).
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

import grpc

from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client.cluster_calls import ClusterCalls
from tidelog.client.cursor_calls import CursorCalls
from tidelog.client.describe_calls import DescribeCalls
from tidelog.client.leaders import LeaderRouter
from tidelog.client.publish_calls import PUBLISH_CHUNK, PublishCalls
from tidelog.client.retry import RETRYABLE, Attempt, retrying
from tidelog.client.routing_listener import (
    COMMIT_EVERY,
    DISCOVER_S,
    Callback,
    RoutingListener,
)
from tidelog.client.settings import ClientSettings
from tidelog.client.site_calls import SiteCalls
from tidelog.client.snapshot_provider import BATCH_BYTES as SNAPSHOT_BATCH_BYTES
from tidelog.client.snapshot_provider import BATCH_ENTRIES as SNAPSHOT_BATCH_ENTRIES
from tidelog.client.snapshot_provider import Provide, SnapshotProvider
from tidelog.client.stream_calls import StreamCalls
from tidelog.client.subscribe_calls import SubscribeCalls
from tidelog.client.view_calls import ViewCalls
from tidelog.security import aio_channel
from tidelog.wire import CURSORS_STREAM, DEFAULT_HOST, DEFAULT_PORT

T = TypeVar("T")

DEFAULT_SERVER = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
"""Where a client connects when told nothing: a server started with its defaults."""


class AsyncClient(
    StreamCalls,
    PublishCalls,
    SubscribeCalls,
    CursorCalls,
    ViewCalls,
    SiteCalls,
    DescribeCalls,
    ClusterCalls,
):
    """A connection to one tidelog server. Use ``async with AsyncClient(...)`` or ``close()``.

    ``settings``: reconnect backoff and retry budget (``ClientSettings``; the defaults suit a
    server on loopback or a LAN)."""

    def __init__(
        self, server: str = DEFAULT_SERVER, *, settings: ClientSettings | None = None
    ) -> None:
        self.server = server
        self.settings = settings or ClientSettings()
        self._channel = aio_channel(server, self.settings.tls, self.settings.grpc_options())
        self._api = pb_grpc.APIStub(self._channel)
        self._v1 = v1_grpc.TidelogStub(self._channel)
        self._partition_counts: dict[str, int] = {}
        self._router = LeaderRouter(server, self._channel, self.settings)
        """Partitions' leaders, once the server turns out to be one broker of a cluster."""
        self._ack_policy = v1.ACK_POLICY_ALL if self.settings.ack_all else v1.ACK_POLICY_LEADER

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._router.close()
        await self._channel.close()

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        """Run a call, sending it again as ``tidelog.client.retry`` rules (``once``: it must not
        be sent twice once it may have been done, and why). ``route``: the (stream, partition)
        whose leader serves it, looked up before the stream's first call and again when a broker
        refuses it or cannot be reached. Without one, the call goes to the entry broker, and in
        a cluster an attempt that could not reach it moves the call to another broker; so that
        a client knows the other brokers before its given one dies, its first such call looks
        up ``__cursors`` (whose metadata names every broker; cursor calls need it anyway)."""
        if route is None:
            await self._router.ensure(CURSORS_STREAM)  # learns the brokers, in a cluster
            if not self._router.clustered:
                return await retrying(
                    attempt, channel=self._channel, settings=self.settings, timeout=timeout
                )
            return await retrying(
                attempt,
                channel=None,
                settings=self.settings,
                timeout=timeout,
                after_failure=self._entry_failed,
            )
        stream, partition = route
        await self._router.ensure(stream)
        return await retrying(
            attempt,
            channel=None if self._router.clustered else self._channel,
            settings=self.settings,
            timeout=timeout,
            after_failure=self._router.relocator(stream, partition),
            once=once,
        )

    async def _entry_failed(self, error: grpc.RpcError) -> None:
        """A call any broker answers failed at the entry broker: if it could not reach it, the
        next attempt (and every such call after it) goes to another broker."""
        if error.code() in RETRYABLE:
            self._router.entry_failed()
            self._api = self._router.entry_api()
            self._v1 = self._router.entry_v1()

    # -- site applications, built on the calls above -----------------------------------------------

    def routing_listener(
        self,
        client_name: str,
        callback: Callback,
        *,
        commit_every: int = COMMIT_EVERY,
        discover_s: float = DISCOVER_S,
    ) -> RoutingListener:
        """A listener handing ``callback`` every entry other sites sent to ``client_name`` on
        this (sink) server; ``await listener.run()`` (see ``tidelog.client.routing_listener``)."""
        return RoutingListener(
            self, client_name, callback, commit_every=commit_every, discover_s=discover_s
        )

    def snapshot_provider(
        self,
        callback: Provide,
        *,
        batch_entries: int = SNAPSHOT_BATCH_ENTRIES,
        batch_bytes: int = SNAPSHOT_BATCH_BYTES,
    ) -> SnapshotProvider:
        """This (source) site's snapshot provider: ``callback`` returns the application's full
        state for a site that needs it; ``await provider.run()`` (see
        ``tidelog.client.snapshot_provider``)."""
        return SnapshotProvider(
            self, callback, batch_entries=batch_entries, batch_bytes=batch_bytes
        )


__all__ = ["DEFAULT_SERVER", "PUBLISH_CHUNK", "AsyncClient"]
