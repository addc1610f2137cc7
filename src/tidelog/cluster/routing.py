"""Leader routing: which broker leads a partition, and the way to it.

Every answer here is taken from the node's current view of the cluster (read every ``poll_s``)
and, for this broker's own leadership, from its replica roles; nothing here reads etcd. So an
answer may be one poll old: a call routed on it is refused by a broker that no longer leads
(``NotLeader``, carrying the leader as that broker knows it), and the caller routes again.

Invariants. ``leads`` is true only while the cluster names this broker the leader *and* its
replica has taken the leadership at that very leader epoch, and the broker is a member (a
broker cut off from etcd leads nothing). There is one gRPC channel per address, kept until the
node closes, shared by the follower fetches, the forwarded calls and the status queries, and
opened with the node's ``peer_tls``: TLS with this broker's certificate when the server has TLS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Protocol, TypeVar

import grpc

from tidelog.cluster.metadata import ClusterView
from tidelog.cluster.roles import PartitionRole
from tidelog.errors import NotEnoughReplicas, NotLeader
from tidelog.security import PLAINTEXT, ClientTls, aio_channel
from tidelog.wire import MAX_FRAME, NOT_LEADER_KEY

T = TypeVar("T")

LEADER_ATTEMPTS: Final = 3
"""Tries per partition of :meth:`Routing.on_each_leader` when the broker asked no longer leads
it (a failover under way), :data:`RETRY_S` apart."""
RETRY_S: Final = 0.2


def moved(error: grpc.aio.AioRpcError) -> bool:
    """The broker a call was handed to no longer leads the partition (its refusal's
    machine-readable detail, ``wire.NOT_LEADER_KEY``), or is going away (UNAVAILABLE)."""
    trailing = error.trailing_metadata() or ()
    return error.code() == grpc.StatusCode.UNAVAILABLE or any(
        key == NOT_LEADER_KEY for key, _ in trailing
    )


class RoutingHost(Protocol):
    """What routing needs of the node: its view, identity, membership and replica roles."""

    @property
    def view(self) -> ClusterView: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def member(self) -> bool: ...

    @property
    def roles(self) -> Mapping[tuple[str, int], PartitionRole]: ...


class Routing:
    """Where each partition's leader is, as this broker knows it, and channels to brokers."""

    def __init__(self, host: RoutingHost, tls: ClientTls = PLAINTEXT) -> None:
        self._host = host
        self._tls = tls
        """How every channel here is opened: TLS with this broker's certificate when the
        server has TLS (the broker called checks who calls by it), else plaintext."""
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def view(self) -> ClusterView:
        """The node's current view of the cluster (replaced at every step)."""
        return self._host.view

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio_channel(
                address,
                self._tls,
                [
                    ("grpc.max_receive_message_length", MAX_FRAME),
                    ("grpc.max_send_message_length", MAX_FRAME),
                ],
            )
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        """Close every channel (the node is closing)."""
        for channel in self._channels.values():
            await channel.close()

    def leads(self, stream: str, number: int) -> bool:
        """Whether this broker is the serving leader of ``stream``/``number`` now: the cluster
        names it and its replica has taken the leadership."""
        host = self._host
        role = host.roles.get((stream, number))
        state = host.view.partitions.get((stream, number))
        return (
            host.member
            and role is not None
            and role.leader is not None
            and state is not None
            and state.leader == host.broker_id
            and role.leader.leader_epoch == state.leader_epoch
        )

    def leader_address(self, stream: str, number: int) -> str | None:
        """``HOST:PORT`` of the live leader of ``stream``/``number`` (None: none now)."""
        view = self._host.view
        state = view.partitions.get((stream, number))
        if state is None or not state.leader:
            return None
        return view.brokers.get(state.leader)

    def leader_of(self, stream: str, number: int) -> tuple[str, int] | None:
        """(leader broker id, leader epoch) of ``stream``/``number`` as the view has it; None
        when the view has no such partition or it has no leader now. The leader may be down
        (``leader_address`` is None then) until the controller elects another."""
        state = self._host.view.partitions.get((stream, number))
        if state is None or not state.leader:
            return None
        return state.leader, state.leader_epoch

    async def on_leader(
        self,
        stream: str,
        number: int,
        refusal: NotLeader,
        call: Callable[[grpc.aio.Channel], Awaitable[T]],
    ) -> T:
        """``call`` run against the channel of ``stream``/``number``'s leader as the view knows
        it, and its result. Raises ``refusal`` when the view has no leader address for it, or
        names this broker the leader (handing the call to itself would loop: the caller serves
        it, or refuses it, here). gRPC errors from ``call`` propagate unchanged: the caller
        reads the leader's refusal from them (the leader may have moved meanwhile)."""
        leader = self.leader_of(stream, number)
        address = self.leader_address(stream, number)
        if leader is None or not address or leader[0] == self._host.broker_id:
            raise refusal
        return await call(self.channel(address))

    async def on_each_leader(
        self,
        stream: str,
        numbers: Sequence[int],
        view: ClusterView,
        local: Callable[[int], Awaitable[T]],
        remote: Callable[[grpc.aio.Channel, int], Awaitable[T]],
    ) -> list[T]:
        """Per partition of ``numbers`` (in order), the answer of its leader, all at once:
        ``local(n)`` when this broker leads it, else ``remote(channel, n)`` on the leader's
        channel. A leader that turns out to have moved (:func:`moved`) is looked up again in
        the node's next view, :data:`LEADER_ATTEMPTS` times; then ``NotEnoughReplicas``
        (UNAVAILABLE: a failover under way). Any other gRPC error propagates unchanged."""

        async def one(number: int) -> T:
            current = view
            for _ in range(LEADER_ATTEMPTS):
                state = current.partitions.get((stream, number))
                leader = "" if state is None else state.leader
                if leader == self._host.broker_id:
                    return await local(number)
                address = current.brokers.get(leader)
                if address is not None:
                    try:
                        return await remote(self.channel(address), number)
                    except grpc.aio.AioRpcError as error:
                        if not moved(error):
                            raise
                await asyncio.sleep(RETRY_S)  # the metadata will say who leads
                current = self._host.view
            # UNAVAILABLE: retried by clients (a read), and the election ends within a lease.
            raise NotEnoughReplicas(
                f"partition {number} of {stream!r} has no reachable leader now (a failover "
                f"under way?): try again"
            )

        return list(await asyncio.gather(*(one(n) for n in numbers)))

    def _elsewhere(self, stream: str, number: int) -> str | None:
        """The broker's ``hosted_elsewhere``: the address of the broker leading
        ``stream``/``number`` ("" while none does; a negative ``number``, the stream as a
        whole, asks about partition 0), or None when the cluster does not know it either."""
        view = self._host.view
        if stream not in view.streams:
            return None
        state = view.partitions.get((stream, max(number, 0)))
        if state is None:
            return None
        return view.brokers.get(state.leader, "")
