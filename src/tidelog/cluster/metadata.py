"""Cluster metadata on etcd: broker membership, the controller, partition state.

Theory of operation. etcd holds what every broker of a cluster must agree on, under one prefix
per cluster (``/tidelog/<cluster>/``):

- ``brokers/<id>``: a live broker's address (and, when it runs a Kafka listener, the address
  Kafka clients reach it at), written with the broker's **lease**. The broker refreshes the lease
  every third of its time to live; a broker that dies (or is cut off from etcd) loses the lease,
  and etcd deletes its key: membership needs no home-made failure detector.
- ``controller``: the id of the one broker that places partitions and changes leaders and ISRs.
  A broker campaigns by creating the key with its own lease, only if absent (one etcd
  transaction); the key goes with the lease, and the next campaign wins.
- ``streams/<name>``: a stream's settings, replication factor and ``minIsr``, written with its
  partitions' first states in one transaction, only if absent. A stream with more partitions
  than one etcd transaction may hold (:data:`TXN_OPS`) is written in steps under a claim,
  ``creating/<name>``, held with a lease of its own: the partitions first, then the stream's
  key, which makes them part of the cluster (:meth:`Metadata.view` shows no partition whose
  stream's key is missing). A creator that dies leaves its claim to expire; the next one
  removes the partitions it left.
- ``ready/<stream>/<n>/<broker>``: the leader epoch under which that replica has opened the
  partition (leading or following), with the broker's lease; a created stream is usable once
  its leaders and live replicas have all marked it.
- ``partitions/<stream>/<n>``: a partition's :class:`PartitionState` (replicas, leader, ISR,
  partition epoch, leader epoch) as JSON. Every change is a **compare-and-set on the partition
  epoch**: :meth:`Metadata.update_partition` reads the state, checks that its epoch is the one
  the caller based its change on, and writes the next epoch in a transaction that holds only if
  the key was not modified since that read (its etcd ``mod_revision``). Two controllers, or a
  controller and a leader shrinking its ISR, can never both win from the same epoch.

- ``views/<stream>/<name>``: a materialised view's definition (``ViewSpec.to_json()``), created
  only while the stream exists and the name is free; every replica of the stream builds it from
  its own copy of the log.
- ``readonly/<stream>/<n>``: present while that partition is read-only (Liftbridge's
  ``SetStreamReadonly``); every replica applies it, so a new leader is read-only too.
- ``groups/<id>``: a consumer group's :class:`GroupRecord` (its coordinator, epoch, members and
  their assignments) as JSON. Every change is a compare-and-set on the key's ``mod_revision``
  (:meth:`Metadata.replace_group`), and every change raises the group's epoch; the last member's
  leave deletes the key the same way.

The store knows nothing of what the states mean; the controller and the replicas
(``controller.py``, ``reconcile.py``, ``roles.py``) decide. Errors: etcd unreachable or failing
is :class:`~tidelog.errors.MetadataUnavailable`, with the endpoint in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

import aetcd
from aetcd.utils import prefix_range_end

from tidelog.cluster.etcd_client import etcd_client, unreachable
from tidelog.errors import MetadataUnavailable
from tidelog.security import PLAINTEXT, ClientTls

LOG = logging.getLogger("tidelog.cluster")
DEFAULT_TTL_S: Final = 10

TXN_OPS: Final = 128
"""The operations one etcd transaction may hold: etcd's default ``--max-txn-ops``. Changes to
more keys than that are written in several transactions."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[str, ...]
    leader: str
    """Broker id of the leader ("" while none)."""
    isr: tuple[str, ...]
    partition_epoch: int = 0
    """Raised by every change of this state."""
    leader_epoch: int = 0
    """Raised by every change of leader."""
    target: tuple[str, ...] = ()
    """While a reassignment runs: the replicas asked for (``replicas`` holds them and the old
    ones until every new one is in the ISR). Empty otherwise."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PartitionState:
        data: dict[str, Any] = json.loads(raw)
        return cls(
            tuple(data["replicas"]),
            str(data["leader"]),
            tuple(data["isr"]),
            int(data["partition_epoch"]),
            int(data["leader_epoch"]),
            tuple(data.get("target", ())),
        )


class Membership:
    """A broker's registration: its key lives as long as :meth:`close` is not called and the
    process keeps refreshing the lease."""

    def __init__(self, lease: aetcd.Lease, ttl_s: int) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self.lost = False
        """Set once etcd says the lease expired (the process was paused or cut off for longer
        than the time to live): the broker's keys are gone and it must register again."""
        self._task = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        while not self.lost:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                reply = await self.lease.refresh()
            except aetcd.ClientError as error:  # etcd away: keep trying until the lease expires
                LOG.warning("lease %s not refreshed: %s", self.lease.id, error)
                continue
            if reply is None or reply.TTL <= 0:
                LOG.warning("lease %s expired: this broker left the cluster", self.lease.id)
                self.lost = True

    async def close(self) -> None:
        """Leave: stop refreshing and revoke the lease (the broker's keys go at once)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(aetcd.ClientError):
            await self.lease.revoke()

    async def lapse(self) -> None:
        """Stop refreshing without revoking: the keys go when the lease expires (what a
        killed broker does; for tests and a hard stop)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Metadata:
    def __init__(self, client: aetcd.Client, cluster: str, url: str) -> None:
        self._client = client
        self._url = url
        self.prefix = f"/tidelog/{cluster}/".encode()
        self.flags_written_at = 0
        """The etcd revision of this broker's newest change of a view definition or a
        read-only flag: a view read at an older revision does not describe them yet."""
        self._states: dict[bytes, PartitionState] = {}
        """Partition states already parsed, by their stored bytes: :meth:`view` runs ten times
        a second and most partitions have not changed since the last read."""

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, url: str, cluster: str = "default", tls: ClientTls = PLAINTEXT
    ) -> AsyncIterator[Metadata]:
        """The metadata of ``cluster`` in the etcd at ``url``: over TLS with ``tls`` when the
        URL is ``https://`` (``etcd_client.py``)."""
        client = etcd_client(url, tls)
        try:
            with _unavailable(url):
                await client.connect()
            yield cls(client, cluster, url)
        finally:
            await client.close()

    def _key(self, *parts: str) -> bytes:
        return self.prefix + "/".join(parts).encode()

    # -- membership ------------------------------------------------------------------------------

    async def register(
        self, broker_id: str, address: str, ttl_s: int = DEFAULT_TTL_S, *, kafka: str = ""
    ) -> Membership:
        """Enter the cluster as ``broker_id`` at ``address`` (``kafka``: HOST:PORT of its
        Kafka listener, empty when it runs none); refused (``ValueError``) while another live
        broker holds that id."""
        with _unavailable(self._url):
            lease = await self._client.lease(ttl_s)
            tx = self._client.transactions
            key = self._key("brokers", broker_id)
            entered, _ = await self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, member_record(address, kafka), lease)],
                failure=[],
            )
            if not entered:
                await lease.revoke()
                raise ValueError(f"broker id {broker_id!r} is held by a live broker")
        return Membership(lease, ttl_s)

    async def brokers(self) -> dict[str, str]:
        """Live broker id -> address."""
        start = len(self._key("brokers", ""))
        with _unavailable(self._url):
            found = await self._client.get_prefix(self._key("brokers", ""))
        return {kv.key[start:].decode(): json.loads(kv.value)["address"] for kv in found}

    # -- the controller --------------------------------------------------------------------------

    async def campaign(self, broker_id: str, membership: Membership) -> bool:
        """Become the controller if there is none; True when this broker is it (now or
        already). The key lives with the broker's lease."""
        key = self._key("controller")
        tx = self._client.transactions
        with _unavailable(self._url):
            won, _ = await self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, broker_id.encode(), membership.lease)],
                failure=[],
            )
        return bool(won) or await self.controller() == broker_id

    async def controller(self) -> str | None:
        with _unavailable(self._url):
            found = await self._client.get(self._key("controller"))
        return found.value.decode() if found is not None else None

    # -- partitions ------------------------------------------------------------------------------

    async def create_partition(self, stream: str, partition: int, state: PartitionState) -> bool:
        """Write a new partition's first state; False if it exists."""
        key = self._key("partitions", stream, str(partition))
        tx = self._client.transactions
        with _unavailable(self._url):
            created, _ = await self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, replace(state, partition_epoch=0).to_json())],
                failure=[],
            )
        return bool(created)

    async def partition(self, stream: str, partition: int) -> PartitionState | None:
        state, _ = await self._read(stream, partition)
        return state

    async def _read(self, stream: str, partition: int) -> tuple[PartitionState | None, int]:
        with _unavailable(self._url):
            found = await self._client.get(self._key("partitions", stream, str(partition)))
        if found is None:
            return None, 0
        return PartitionState.from_json(found.value), found.mod_revision

    async def update_partition(
        self, stream: str, partition: int, expected_epoch: int, state: PartitionState
    ) -> PartitionState | None:
        """Replace the state whose epoch is ``expected_epoch`` with ``state`` at the next
        epoch; the state written, or None when the stored epoch is another one (or the
        partition is gone): re-read and decide again."""
        current, revision = await self._read(stream, partition)
        if current is None or current.partition_epoch != expected_epoch:
            return None
        written = replace(state, partition_epoch=expected_epoch + 1)
        key = self._key("partitions", stream, str(partition))
        tx = self._client.transactions
        with _unavailable(self._url):
            done, _ = await self._client.transaction(
                compare=[tx.mod(key) == revision],
                success=[tx.put(key, written.to_json())],
                failure=[],
            )
        return written if done else None

    async def partitions(self, stream: str) -> dict[int, PartitionState]:
        base = self._key("partitions", stream, "")
        with _unavailable(self._url):
            found = await self._client.get_prefix(base)
        return {
            int(kv.key[len(base) :].decode()): PartitionState.from_json(kv.value) for kv in found
        }

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self, name: str, record: StreamRecord, states: Sequence[PartitionState]
    ) -> bool:
        """Write a new stream and its partitions' first states; False (and nothing written) when
        a stream of that name exists or is being created. One transaction when it fits in one,
        else :meth:`_create_in_steps`."""
        key = self._key("streams", name)
        tx = self._client.transactions
        puts = [
            tx.put(self._key("partitions", name, str(n)), replace(st, partition_epoch=0).to_json())
            for n, st in enumerate(states)
        ]
        if len(puts) >= TXN_OPS:
            return await self._create_in_steps(name, record, puts)
        claim = self._key("creating", name)
        partitions = self._key("partitions", name, "")
        with _unavailable(self._url):
            created, found = await self._client.transaction(
                compare=[
                    tx.version(key) == 0,
                    tx.version(claim) == 0,
                    tx.version(partitions, prefix_range_end(partitions)) == 0,
                ],
                success=[tx.put(key, record.to_json()), *puts],
                failure=[tx.get(key), tx.get(claim)],
            )
        if created:
            return True
        if any(found):  # the name is taken, or being created
            return False
        # Partitions a dead creator left: the creation in steps clears them first.
        return await self._create_in_steps(name, record, puts)

    async def _create_in_steps(self, name: str, record: StreamRecord, puts: list[Any]) -> bool:
        """A stream too large for one transaction (or one whose name holds partitions a dead
        creator left): claim the name with a lease of this call's own, clear what a dead
        creator left, write the partitions a transaction at a time while the claim is ours and
        the name free, then the stream's key with the claim's removal. Until that last step,
        no broker sees any of it."""
        key = self._key("streams", name)
        claim = self._key("creating", name)
        partitions = self._key("partitions", name, "")
        tx = self._client.transactions
        with _unavailable(self._url):
            lease = await self._client.lease(DEFAULT_TTL_S)
            token = str(lease.id).encode()
            ours = tx.value(claim) == token
            free = tx.version(key) == 0
            try:
                claimed, _ = await self._client.transaction(
                    compare=[tx.version(key) == 0, tx.version(claim) == 0],
                    success=[
                        tx.put(claim, token, lease),
                        tx.delete(partitions, prefix_range_end(partitions)),
                    ],
                    failure=[],
                )
                if not claimed:
                    return False
                done = False
                for start in range(0, len(puts), TXN_OPS):
                    await lease.refresh()
                    done, _ = await self._client.transaction(
                        compare=[ours, free], success=puts[start : start + TXN_OPS], failure=[]
                    )
                    if not done:
                        break
                else:
                    done, _ = await self._client.transaction(
                        compare=[ours, free],
                        success=[tx.put(key, record.to_json()), tx.delete(claim)],
                        failure=[],
                    )
                if not done:
                    raise MetadataUnavailable(
                        f"creating stream {name!r} ({len(puts)} partitions) outlasted its claim "
                        f"on the name ({DEFAULT_TTL_S} s lease at etcd {self._url}): nothing "
                        f"was created; try again"
                    )
                return True
            finally:
                with contextlib.suppress(aetcd.ClientError):
                    # An unfinished creation's partitions go, with the claim; if the claim
                    # expired meanwhile, they go only while no other creator holds the name.
                    cleared, _ = await self._client.transaction(
                        compare=[ours, free],
                        success=[
                            tx.delete(partitions, prefix_range_end(partitions)),
                            tx.delete(claim),
                        ],
                        failure=[],
                    )
                    if not cleared:
                        await self._client.transaction(
                            compare=[tx.version(claim) == 0, free],
                            success=[tx.delete(partitions, prefix_range_end(partitions))],
                            failure=[],
                        )
                    await lease.revoke()

    async def update_stream(self, name: str, record: StreamRecord) -> bool:
        """Replace an existing stream's record (False, nothing written: there is none)."""
        key = self._key("streams", name)
        tx = self._client.transactions
        with _unavailable(self._url):
            done, _ = await self._client.transaction(
                compare=[tx.version(key) > 0], success=[tx.put(key, record.to_json())], failure=[]
            )
        return bool(done)

    async def delete_stream(self, name: str) -> bool:
        """Remove a stream, its partitions, their ready marks, views and flags in one
        transaction; False when there was none, or while one of that name is being created in
        steps (its partitions are the creator's until its stream key is written)."""
        tx = self._client.transactions
        kinds = ("partitions", "ready", "views", "readonly")
        ranges = [self._key(kind, name, "") for kind in kinds]
        with _unavailable(self._url):
            done, responses = await self._client.transaction(
                compare=[tx.version(self._key("creating", name)) == 0],
                success=[
                    tx.delete(self._key("streams", name)),
                    *(tx.delete(prefix, prefix_range_end(prefix)) for prefix in ranges),
                ],
                failure=[],
            )
        return bool(done) and responses[0].response_delete_range.deleted > 0

    async def set_readonly(self, stream: str, partitions: Sequence[int], readonly: bool) -> bool:
        """Mark ``partitions`` read-only (or writable again), only while the stream exists;
        False when it does not. One transaction per :data:`TXN_OPS` partitions: an error part
        way leaves the first ones changed, and the call, retried, finishes the rest."""
        tx = self._client.transactions
        keys = [self._key("readonly", stream, str(n)) for n in partitions]
        changes = [tx.put(k, b"1") for k in keys] if readonly else [tx.delete(k) for k in keys]
        for start in range(0, max(len(changes), 1), TXN_OPS):
            with _unavailable(self._url):
                done, responses = await self._client.transaction(
                    compare=[tx.version(self._key("streams", stream)) > 0],
                    success=changes[start : start + TXN_OPS],
                    failure=[],
                )
            if not done:
                return False
            if responses:
                self._wrote(responses)
        return True

    # -- views -----------------------------------------------------------------------------------

    async def declare_view(
        self, stream: str, name: str, spec: dict[str, Any]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Write a view's definition if the stream exists and no view has the name: (True,
        None); else (False, the definition already there, or None when the stream is gone)."""
        key = self._key("views", stream, name)
        stream_key = self._key("streams", stream)
        tx = self._client.transactions
        with _unavailable(self._url):
            created, responses = await self._client.transaction(
                compare=[tx.version(stream_key) > 0, tx.version(key) == 0],
                success=[tx.put(key, json.dumps(spec, sort_keys=True).encode())],
                failure=[],
            )
            if created:
                self._wrote(responses)
                return True, None
            found = await self._client.get(key)
        return False, None if found is None else json.loads(found.value)

    async def drop_view(self, stream: str, name: str) -> bool:
        """Remove a view's definition; False when there was none."""
        key = self._key("views", stream, name)
        tx = self._client.transactions
        with _unavailable(self._url):
            dropped, responses = await self._client.transaction(
                compare=[tx.version(key) > 0], success=[tx.delete(key)], failure=[]
            )
        if dropped:
            self._wrote(responses)
        return bool(dropped)

    def _wrote(self, responses: list[Any]) -> None:
        self.flags_written_at = max(self.flags_written_at, _revision_of(responses))

    async def mark_ready(
        self, stream: str, partition: int, broker_id: str, leader_epoch: int, lease: aetcd.Lease
    ) -> None:
        """This replica has opened the partition under ``leader_epoch`` (as its leader, taking
        publishes, or following it); the key lives with the broker's lease."""
        key = self._key("ready", stream, str(partition), broker_id)
        with _unavailable(self._url):
            await self._client.put(key, str(leader_epoch).encode(), lease)

    # -- consumer groups -------------------------------------------------------------------------

    async def group(self, group_id: str) -> tuple[GroupRecord | None, int, int]:
        """The group, the etcd revision it was last changed at (0 when there is none), and
        the revision it was read at."""
        key = self._key("groups", group_id)
        with _unavailable(self._url):
            found = await self._client.get_range(key, key + b"\0")  # that key, with a header
        for kv in found:
            return GroupRecord.from_json(kv.value), kv.mod_revision, found.header.revision
        return None, 0, found.header.revision

    async def replace_group(self, group_id: str, revision: int, record: GroupRecord | None) -> int:
        """Write ``record`` (None: delete the group) only if the group is still as read at
        ``revision`` (0: only if there is none); the etcd revision of the write, or 0 when the
        group changed since: read again."""
        key = self._key("groups", group_id)
        tx = self._client.transactions
        compare = [tx.version(key) == 0] if revision == 0 else [tx.mod(key) == revision]
        success = [tx.delete(key)] if record is None else [tx.put(key, record.to_json())]
        with _unavailable(self._url):
            done, responses = await self._client.transaction(
                compare=compare, success=success, failure=[]
            )
        return _revision_of(responses) if done else 0

    async def view(self) -> ClusterView:
        """Everything under the cluster's prefix, read at one revision."""
        with _unavailable(self._url):
            found = await self._client.get_prefix(self.prefix)
        view = ClusterView(revision=found.header.revision)
        for kv in found:
            parts = kv.key[len(self.prefix) :].decode().split("/")
            kind = parts[0]
            if kind in _OPTIONAL:
                try:
                    _OPTIONAL[kind](view, parts, kv.value, kv.mod_revision)
                except (ValueError, KeyError, TypeError, IndexError) as error:
                    # A value this broker cannot read (damaged, or written by a newer
                    # version) costs that one group, view or flag, never the whole cluster.
                    key = "/".join(parts)
                    if key not in _WARNED:
                        _WARNED.add(key)
                        LOG.warning("cluster metadata %s is unreadable, ignored: %s", key, error)
                continue
            if kind == "brokers" and len(parts) == 2:
                _read_member(view, parts[1], kv.value)
            elif kind == "controller":
                view.controller = kv.value.decode()
            elif kind == "streams" and len(parts) == 2:
                view.streams[parts[1]] = StreamRecord.from_json(kv.value)
            elif kind == "partitions" and len(parts) == 3:
                view.partitions[parts[1], int(parts[2])] = self._partition_state(kv.value)
            elif kind == "ready" and len(parts) == 4:
                marks = view.ready.setdefault((parts[1], int(parts[2])), {})
                marks[parts[3]] = int(kv.value)
        for stream, number in [k for k in view.partitions if k[0] not in view.streams]:
            # Written by a creation still under way, or left by one that died: not part of
            # the cluster.
            del view.partitions[stream, number]
        return view

    def _partition_state(self, raw: bytes) -> PartitionState:
        state = self._states.get(raw)
        if state is None:
            if len(self._states) >= _STATES_KEPT:
                self._states.clear()  # old states, never asked for again
            state = self._states[raw] = PartitionState.from_json(raw)
        return state


_STATES_KEPT = 50_000


def _revision_of(responses: list[Any]) -> int:
    """The etcd revision a successful transaction wrote at: the highest of its answers (a
    delete that found nothing reports the revision before the transaction)."""
    return max(
        int(getattr(answer, answer.WhichOneof("response")).header.revision) for answer in responses
    )


def member_record(address: str, kafka: str = "") -> bytes:
    """A broker's ``brokers/<id>`` value: its address, and its Kafka listener's when it runs one
    (absent otherwise: the record as brokers wrote it before they had Kafka listeners)."""
    record = {"address": address, **({"kafka": kafka} if kafka else {})}
    return json.dumps(record).encode()


def _read_member(view: ClusterView, broker_id: str, value: bytes) -> None:
    record = json.loads(value)
    view.brokers[broker_id] = record["address"]
    kafka = record.get("kafka")
    if isinstance(kafka, str) and kafka:
        view.kafka[broker_id] = kafka


def _read_readonly(view: ClusterView, parts: list[str], value: bytes, revision: int) -> None:
    if len(parts) == 3:
        view.readonly.add((parts[1], int(parts[2])))


def _read_view(view: ClusterView, parts: list[str], value: bytes, revision: int) -> None:
    if len(parts) == 3:
        definition = json.loads(value)
        if not isinstance(definition, dict) or not isinstance(definition.get("kind"), str):
            raise ValueError(f"not a view definition: {value[:80]!r}")
        view.views.setdefault(parts[1], {})[parts[2]] = definition


def _read_group(view: ClusterView, parts: list[str], value: bytes, revision: int) -> None:
    if len(parts) >= 2:
        group_id = "/".join(parts[1:])
        view.groups[group_id] = GroupRecord.from_json(value)
        view.group_revisions[group_id] = revision


_OPTIONAL = {"readonly": _read_readonly, "views": _read_view, "groups": _read_group}
"""Kinds of keys whose values one broker may fail to read without harm to the rest."""
_WARNED: set[str] = set()


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream as the cluster knows it: its settings and replication."""

    config: dict[str, Any]
    """``StreamConfig.to_json()``."""
    replication_factor: int = 1
    min_isr: int = 1
    colocate: str = ""
    """A stream whose partitions live and lead with partition 0 of this one (the anchor): its
    partitions are placed on the anchor's replicas, and the controller moves each leader to the
    anchor's leader once that one is in its ISR. Empty: placed and elected on its own."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> StreamRecord:
        data: dict[str, Any] = json.loads(raw)
        return cls(
            dict(data["config"]),
            int(data["replication_factor"]),
            int(data["min_isr"]),
            str(data.get("colocate", "")),
        )


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A consumer group as the cluster knows it. ``epoch`` is raised by every change (a member
    joining, leaving or expiring, a new coordinator)."""

    coordinator: str
    """Broker id of the broker that takes the members' heartbeats and expires silent ones."""
    epoch: int
    members: dict[str, tuple[str, ...]]
    """Consumer id -> the streams it consumes."""
    assignments: dict[str, dict[str, tuple[int, ...]]]
    """Consumer id -> stream -> its partitions."""
    owners: dict[str, str] = field(default_factory=dict)
    """Consumer id -> the principal that joined as it (members without one are owned by nobody
    yet: ``tidelog.broker.groups``, "Owners"). Written only when not empty."""

    def to_json(self) -> bytes:
        owners = {c: o for c, o in self.owners.items() if o and c in self.members}
        return json.dumps(
            {
                "coordinator": self.coordinator,
                "epoch": self.epoch,
                "members": {c: list(s) for c, s in self.members.items()},
                "assignments": {
                    c: {s: list(p) for s, p in streams.items()}
                    for c, streams in self.assignments.items()
                },
                **({"owners": owners} if owners else {}),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> GroupRecord:
        data: dict[str, Any] = json.loads(raw)
        return cls(
            str(data["coordinator"]),
            int(data["epoch"]),
            {str(c): tuple(s) for c, s in data["members"].items()},
            {
                str(c): {str(s): tuple(p) for s, p in streams.items()}
                for c, streams in data["assignments"].items()
            },
            {str(c): str(o) for c, o in data.get("owners", {}).items()},
        )


@dataclass(slots=True)
class ClusterView:
    """The cluster's metadata at one moment (``Metadata.view``)."""

    brokers: dict[str, str] = field(default_factory=dict)
    """Live broker id -> advertised HOST:PORT."""
    kafka: dict[str, str] = field(default_factory=dict)
    """Live broker id -> the HOST:PORT Kafka clients reach it at (only brokers that run a Kafka
    listener: a record written without one has none)."""
    controller: str | None = None
    streams: dict[str, StreamRecord] = field(default_factory=dict)
    partitions: dict[tuple[str, int], PartitionState] = field(default_factory=dict)
    ready: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    """(stream, partition) -> {broker: leader epoch} of the replicas that have opened it
    under that leader epoch."""
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    """Consumer groups by id."""
    views: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """Stream -> view name -> the view's definition (``ViewSpec.to_json()``)."""
    readonly: set[tuple[str, int]] = field(default_factory=set)
    """The read-only partitions."""
    group_revisions: dict[str, int] = field(default_factory=dict)
    """Group id -> the etcd revision its record was last written at."""
    revision: int = 0
    """The etcd revision the view was read at (0: not read from etcd)."""

    def opened(self, stream: str, partition: int) -> bool:
        """Whether the partition's leader and every live replica have opened it under its
        current leader epoch."""
        state = self.partitions.get((stream, partition))
        if state is None or not state.leader:
            return False
        marks = self.ready.get((stream, partition), {})
        return all(
            marks.get(member) == state.leader_epoch
            for member in state.replicas
            if member == state.leader or member in self.brokers
        )

    def leading(self) -> dict[str, int]:
        """How many partitions each broker leads."""
        counts: dict[str, int] = {}
        for state in self.partitions.values():
            if state.leader:
                counts[state.leader] = counts.get(state.leader, 0) + 1
        return counts


@contextlib.contextmanager
def _unavailable(url: str) -> Any:
    try:
        yield
    except (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError) as error:
        raise MetadataUnavailable(unreachable(url, str(error))) from None
    except aetcd.ClientError as error:
        hint = ""
        if "permission denied" in str(error) or "user name not found" in str(error):
            hint = (
                " (with etcd's authentication on, the user is the common name of etcd_cert: "
                "grant its role read and write on the cluster's prefix /tidelog/<cluster_name>/)"
            )
        raise MetadataUnavailable(f"etcd at {url} failed: {error}{hint}") from None
