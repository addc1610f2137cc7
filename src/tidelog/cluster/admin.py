"""The cluster's administration as one broker starts it: streams created, deleted and moved,
read-only flags, views, and the internal streams the broker and the sites keep their state in.

Theory of operation. Every change is written to etcd first (by create-if-absent, or by
compare-and-set on the partition epoch, retried on a race), then the node is woken so that this
broker applies it at once (``wake``); every other broker applies it at its next read of the
cluster's state, within ``poll_s`` (``reconcile.py``). A call that must wait for the change to
take effect here or everywhere (a stream's leaders open, ``__cursors`` gets its roles) waits for
it, with a deadline, and fails as ``NotEnoughReplicas`` (retryable) when it passes.

Invariants. A stream's placement is decided once, at creation (``placement.place``, or the
anchor's for a colocated stream), and then changed only by ``reassign`` and the controller;
minIsr is always between 1 and the replication factor. Internal streams (``__*``) take no views
and no read-only flag from a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Protocol

from tidelog.broker import (
    Broker,
    CursorStore,
    Stream,
    StreamConfig,
    ViewSpec,
    check_new_stream,
    client_streams,
)
from tidelog.cluster.metadata import ClusterView, Metadata, PartitionState, StreamRecord
from tidelog.cluster.placement import colocated, place, reassign
from tidelog.cluster.reconcile import Reconciler
from tidelog.cluster.roles import PartitionRole, Undecided
from tidelog.cluster.settings import CURSOR_REPLICAS, INTERNAL_REPLICAS, ClusterSettings
from tidelog.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotEnoughReplicas,
    PartitionNotFound,
    PermissionDenied,
    StreamExists,
    StreamNotFound,
    ViewExists,
    ViewNotFound,
)
from tidelog.wire import CURSORS_STREAM


class AdminHost(Protocol):
    """What administration needs of the node."""

    @property
    def broker(self) -> Broker: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def metadata(self) -> Metadata | None: ...

    @property
    def view(self) -> ClusterView:
        """The cluster's state as last read by the node's step."""
        ...

    @property
    def roles(self) -> Mapping[tuple[str, int], PartitionRole]: ...

    async def fresh_view(self) -> ClusterView:
        """The cluster's state read now (the last one read while etcd does not answer)."""
        ...

    def wake(self) -> None:
        """Run the node's step now rather than at the next poll."""
        ...


class Admin:
    """Creates, deletes and moves the cluster's streams, and sets their flags and views."""

    def __init__(self, host: AdminHost, reconciler: Reconciler) -> None:
        """``reconciler``: applies a change to this broker at once."""
        self._host = host
        self._reconciler = reconciler

    async def create_stream(
        self,
        name: str,
        config: StreamConfig,
        replication_factor: int,
        min_isr: int,
        *,
        colocate: str = "",
    ) -> None:
        """Place a new stream's partitions on live brokers and wait until every leader has
        opened its partition (``StreamExists`` if the name is taken). ``colocate``: the stream
        whose partition 0 this one lives and leads with (``placement.colocated``; the
        replication factor is then that partition's)."""
        host = self._host
        assert host.metadata is not None
        view = await host.metadata.view()
        if name not in view.streams and not name.startswith("__"):  # caps: broker/limits.py
            check_new_stream(host.broker.config, name, config, client_streams(view.streams))
        if replication_factor == 0:
            replication_factor = 1
        if colocate:
            anchor = view.partitions.get((colocate, 0))
            if anchor is None:
                raise StreamNotFound(colocate)
            states = colocated(config.partitions, anchor)
            min_isr = min(min_isr, len(states[0].isr))  # the anchor's replicas decide
        else:
            states = place(
                config.partitions, replication_factor, list(view.brokers), view.leading()
            )
        factor = len(states[0].replicas)
        if min_isr < 0 or min_isr > factor:
            raise InvalidArgument(
                f"minIsr {min_isr} is more than the stream's {factor} replicas: use 1 to {factor}"
            )
        record = StreamRecord(config.to_json(), factor, max(min_isr, 1), colocate)
        if not await host.metadata.create_stream(name, record, states):
            raise StreamExists(name)
        host.wake()
        await self._wait_ready(name, config.partitions)

    async def cursors(self) -> CursorStore:
        """The broker's cursor store, once ``__cursors`` is a replicated stream of the cluster
        (created here on first use: ``cursor_partitions`` partitions, three replicas or every
        broker if fewer, minIsr 2 or 1) and every local partition of it has its role, so a set
        is appended only by a partition's leader and acknowledged once the ISR has it."""
        host = self._host
        assert host.metadata is not None
        if CURSORS_STREAM not in host.view.streams:
            view = await host.metadata.view()
            if CURSORS_STREAM not in view.streams:
                factor = min(CURSOR_REPLICAS, max(len(view.brokers), 1))
                config = StreamConfig(partitions=host.broker.config.cursor_partitions, compact=True)
                with contextlib.suppress(StreamExists):  # another broker created it first
                    await self.create_stream(CURSORS_STREAM, config, factor, min(2, factor))
        store = host.broker.cursors
        deadline = time.monotonic() + 10
        while True:
            record = host.view.streams.get(CURSORS_STREAM)
            if record is not None:
                wanted = StreamConfig.from_json(record.config).partitions
                if wanted != len(store.stream.partitions):
                    raise FailedPrecondition(
                        f"this broker's {CURSORS_STREAM} has {len(store.stream.partitions)} "
                        f"partitions, the cluster's {wanted}: give every broker the same "
                        f"cursor_partitions"
                    )
                if all(
                    p.role is not None and not isinstance(p.role, Undecided)
                    for p in store.stream.partitions
                ):
                    return store
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(
                    f"{CURSORS_STREAM} is not assigned on this broker yet: try again"
                )
            host.wake()  # reconcile now rather than at the next poll
            await asyncio.sleep(host.settings.poll_s)

    async def internal_stream(
        self, name: str, config: StreamConfig, *, colocate: str = ""
    ) -> Stream:
        """The internal stream ``name`` as a replicated stream of the cluster, for the parts above
        the broker that keep their state in streams (the sites' queues): created on first use
        (``INTERNAL_REPLICAS`` replicas, or every live broker if fewer, and minIsr 2, or 1 on a
        lone broker; ``colocate``: placed and led with that stream's partition 0), and returned
        once every partition of it here has its role. Appends to it are a leader's only, and
        acknowledged with ``durable`` once the ISR holds them. ``FailedPrecondition`` when this
        broker holds no replica of it; ``NotEnoughReplicas`` (retryable) while it is not
        assigned here yet."""
        host = self._host
        assert host.metadata is not None
        if name not in host.view.streams:
            view = await host.metadata.view()
            if name not in view.streams:
                factor = min(INTERNAL_REPLICAS, max(len(view.brokers), 1))
                with contextlib.suppress(StreamExists):  # another broker created it first
                    await self.create_stream(
                        name, config, factor, min(2, factor), colocate=colocate
                    )
        deadline = time.monotonic() + 10
        while True:
            view = host.view
            record = view.streams.get(name)
            if record is not None:
                states = stream_states(view, name)
                if states and all(host.broker_id not in s.replicas for s in states.values()):
                    raise FailedPrecondition(
                        f"{name} has no replica on broker {host.broker_id}: its leader "
                        f"{states[0].leader or '(none yet)'} serves it"
                    )
                local = host.broker.find_stream(name)
                if local is not None and all(
                    (name, p.number) in host.roles for p in local.partitions
                ):
                    return local
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(f"{name} is not assigned on this broker yet: try again")
            host.wake()  # reconcile now rather than at the next poll
            await asyncio.sleep(host.settings.poll_s)

    async def _wait_ready(self, name: str, partitions: int) -> None:
        """Until every partition's leader and live replicas have opened it: 10 s, and 50 ms
        more per partition (500 partitions of three replicas took 9.4 s on a loaded 2-core
        machine)."""
        host = self._host
        assert host.metadata is not None
        timeout_s = 10.0 + 0.05 * partitions
        deadline = time.monotonic() + timeout_s
        while True:
            view = await host.metadata.view()
            if all(view.opened(name, n) for n in range(partitions)):
                return
            if time.monotonic() > deadline:
                raise NotEnoughReplicas(
                    f"stream {name!r} was created but its leaders did not open it within "
                    f"{timeout_s:g} s: check `tidelog cluster status`"
                )
            await asyncio.sleep(0.05)

    async def reassign(self, stream: str, number: int, replicas: list[str]) -> PartitionState:
        """Start moving a partition to ``replicas`` (compare-and-set; retried on a race)."""
        host = self._host
        assert host.metadata is not None
        for _ in range(10):
            view = await host.metadata.view()
            state = view.partitions.get((stream, number))
            if state is None:
                raise (
                    StreamNotFound(stream)
                    if stream not in view.streams
                    else InvalidArgument(f"stream {stream!r} has no partition {number}")
                )
            if state.target:
                raise InvalidArgument(
                    f"{stream}/{number} is being moved to {','.join(state.target)} already: "
                    f"wait until `tidelog cluster status` shows it done"
                )
            new = reassign(state, replicas, set(view.brokers))
            written = await host.metadata.update_partition(
                stream, number, state.partition_epoch, new
            )
            if written is not None:
                host.wake()
                return written
        raise NotEnoughReplicas(f"{stream}/{number} kept changing; try the reassignment again")

    async def delete_stream(self, name: str) -> None:
        host = self._host
        assert host.metadata is not None
        if not await host.metadata.delete_stream(name):
            raise StreamNotFound(name)
        host.wake()

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None:
        """Make partitions (none named: all) read-only, or writable again, on every replica:
        the flag goes to etcd first, then this broker applies it at once and every other
        replica within one metadata read (``Reconciler.reconcile_flags``)."""
        host = self._host
        assert host.metadata is not None
        if name.startswith("__"):
            raise PermissionDenied(
                f"stream {name!r} is internal: only the broker may change the read-only flag of "
                f"it (it is read with the usual calls; cursors are set with SetCursor)"
            )
        view = await host.fresh_view()
        record = view.streams.get(name)
        if record is None:
            raise StreamNotFound(name)
        count = int(record.config.get("partitions", 1))
        chosen = sorted(set(partitions)) or list(range(count))
        for number in chosen:
            if not 0 <= number < count:
                raise PartitionNotFound(name, number, count)
        if not await host.metadata.set_readonly(name, chosen, readonly):
            raise StreamNotFound(name)
        for number in chosen:
            if readonly:
                host.view.readonly.add((name, number))
            else:
                host.view.readonly.discard((name, number))
        await self._reconciler.reconcile_flags(host.view, only=name)
        host.wake()

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        """Declare a view on every replica of ``stream``: its definition goes to etcd (declaring
        an identical one again is a no-op), and each replica builds it from its own log once
        it reads the metadata (``Reconciler.reconcile_views``)."""
        host = self._host
        assert host.metadata is not None
        spec.validate()
        if stream.startswith("__"):
            raise InvalidArgument(f"stream {stream!r} is internal and takes no views")
        created, existing = await host.metadata.declare_view(stream, spec.name, spec.to_json())
        if not created:
            if existing is None:
                raise StreamNotFound(stream)
            if ViewSpec.from_json(existing) != spec:
                raise ViewExists(stream, spec.name)
        host.wake()

    async def drop_view(self, stream: str, name: str) -> None:
        host = self._host
        assert host.metadata is not None
        if not await host.metadata.drop_view(stream, name):
            view = await host.fresh_view()
            raise (
                StreamNotFound(stream) if stream not in view.streams else ViewNotFound(stream, name)
            )
        host.wake()

    async def sync_views(self, stream: str) -> None:
        """Read the metadata now and make ``stream``'s views here match it (a view declared a
        moment ago that this broker has not built yet); returns once no other reconcile is
        building them either."""
        host = self._host
        view = await host.fresh_view()
        await self._reconciler.reconcile_views(view, only=stream)


def stream_states(view: ClusterView, stream: str) -> dict[int, PartitionState]:
    """The partitions of ``stream`` in ``view``, by number."""
    return {n: st for (s, n), st in view.partitions.items() if s == stream}
