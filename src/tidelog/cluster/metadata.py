"""Cluster metadata on etcd: broker membership, the controller, partition state.

Theory of operation. etcd holds what every broker of a cluster must agree on, under one prefix
per cluster (``/tidelog/<cluster>/``):

- ``brokers/<id>``: a live broker's address, written with the broker's **lease**. The broker
  refreshes the lease every third of its time to live; a broker that dies (or is cut off from
  etcd) loses the lease, and etcd deletes its key: membership needs no home-made failure
  detector.
- ``controller``: the id of the one broker that places partitions and changes leaders and ISRs.
  A broker campaigns by creating the key with its own lease, only if absent (one etcd
  transaction); the key goes with the lease, and the next campaign wins.
- ``partitions/<stream>/<n>``: a partition's :class:`PartitionState` (replicas, leader, ISR,
  partition epoch, leader epoch) as JSON. Every change is a **compare-and-set on the partition
  epoch**: :meth:`Metadata.update_partition` reads the state, checks that its epoch is the one
  the caller based its change on, and writes the next epoch in a transaction that holds only if
  the key was not modified since that read (its etcd ``mod_revision``). Two controllers, or a
  controller and a leader shrinking its ISR, can never both win from the same epoch.

The store knows nothing of what the states mean; the controller and the replicas (later parts of
``tidelog.cluster``) decide. Errors: etcd unreachable or failing is :class:`MetadataUnavailable`,
with the endpoint in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Final
from urllib.parse import urlsplit

import aetcd

from tidelog.errors import TidelogError

LOG = logging.getLogger("tidelog.cluster")
DEFAULT_TTL_S: Final = 10


class MetadataUnavailable(TidelogError):
    """etcd cannot be reached or answered with an error."""


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
        )


def endpoint(url: str) -> tuple[str, int]:
    """(host, port) of an etcd endpoint such as ``http://127.0.0.1:2379``."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme not in ("http", "") or not parts.hostname:
        raise ValueError(f"an etcd endpoint looks like http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port or 2379


class Membership:
    """A broker's registration: its key lives as long as :meth:`close` is not called and the
    process keeps refreshing the lease."""

    def __init__(self, lease: aetcd.Lease, ttl_s: int) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self._task = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.lease.refresh()
            except aetcd.ClientError as error:  # etcd away: keep trying until the lease expires
                LOG.warning("lease %s not refreshed: %s", self.lease.id, error)

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

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, cluster: str = "default") -> AsyncIterator[Metadata]:
        host, port = endpoint(url)
        client = aetcd.Client(host=host, port=port, timeout=5)
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
        self, broker_id: str, address: str, ttl_s: int = DEFAULT_TTL_S
    ) -> Membership:
        """Enter the cluster as ``broker_id`` at ``address``; refused (``ValueError``) while
        another live broker holds that id."""
        with _unavailable(self._url):
            lease = await self._client.lease(ttl_s)
            tx = self._client.transactions
            key = self._key("brokers", broker_id)
            entered, _ = await self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, json.dumps({"address": address}).encode(), lease)],
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


@contextlib.contextmanager
def _unavailable(url: str) -> Any:
    try:
        yield
    except (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError) as error:
        raise MetadataUnavailable(
            f"etcd at {url} cannot be reached ({type(error).__name__}): check that it runs and "
            f"the --cluster address"
        ) from None
    except aetcd.ClientError as error:
        raise MetadataUnavailable(f"etcd at {url} failed: {error}") from None
