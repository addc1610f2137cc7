"""The source side of snapshot sync: asking the application for its state, and queueing it.

When deltas alone cannot bring a remote site up to date, its sender asks for a snapshot
(:meth:`Snapshots.request`): one JSON record ``{"site": ID, "snapshot": N}`` in the internal
stream ``__lrq_snapshot_requests``, whose id ``N`` is its offset plus the registry's
``snapshot_lift`` (durable and increasing, across restarts too, so a sink can tell a newer
snapshot from an older one). The lift is 0 until a sink reports an id at or past the next one
(:meth:`Snapshots.next_id`): the source lost its requests (its data directory), and the ids
would repeat, a broken snapshot then counting as older than the one the sink applied. The
sender learns it at the hello, as it does positions (``positions.py``), and the registry keeps
it: every later id is above what the sink reported. The
application's snapshot provider (``tidelog.client.snapshot_provider``) follows that stream and
answers with ``TransmitSnapshot`` calls: the first *begins* the snapshot, and the server notes
the delta position it covers (the last entry of the delta queue at that moment); the next ones
bring entries (client name, payload); the last *ends* it. Each call becomes records of the
internal stream ``__lrq_snapshot`` (the send queue's record format, kinds SNAPSHOT_START,
SNAPSHOT_ENTRY, SNAPSHOT_END, the snapshot's id as the record's cycle, the site's bit as every
entry's destination); the sender reads them from the start record on and ships them.

Only the snapshot a site's sender currently waits for is accepted: a call for any other (the
provider replaying an old request after a restart, or a snapshot the sender gave up) is refused
with FAILED_PRECONDITION, and the provider skips it. What a snapshot covers: every delta up to
its covered position. The provider is called after the begin, so its state holds at least those
deltas if the application updates its state before it transmits; deltas transmitted while it
runs are also shipped after the snapshot (``docs/replication.md``, "What exactly once means").
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from tidelog.broker import Broker, Partition, StreamConfig
from tidelog.errors import FailedPrecondition, InvalidArgument, echo
from tidelog.sites.envelope import Entry, EntryKind, RoutingRecord, decode, encode
from tidelog.sites.registry import Site, SiteRegistry, validate_site_id
from tidelog.sites.send_queue import ENVELOPE_ROOM, SendQueue
from tidelog.wire import SNAPSHOT_REQUESTS

SNAPSHOT_QUEUE: Final = "__lrq_snapshot"
MAX_SNAPSHOT_ID: Final = 1 << 61
"""A sink's reported snapshot id is believed only below this (ids stay far inside an int64)."""
MARKER_CLIENT: Final = "snapshot"
"""The client name of start and end records (their one entry holds the covered position)."""
_COVERED = struct.Struct(">q")


class SnapshotTrimmed(Exception):
    """Retention removed part of a snapshot before the sender read it: it needs a new one."""


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """One record of a snapshot as the sender reads it."""

    offset: int
    kind: EntryKind
    client: str
    payloads: tuple[bytes, ...]
    covered: int
    """The snapshot's covered position (from its start record)."""


@dataclass(slots=True)
class Wanted:
    """The snapshot a site's sender waits for."""

    site: Site
    snapshot: int
    start_offset: int | None = None
    """Where the snapshot's start record is in ``__lrq_snapshot`` (None: not begun)."""
    covered: int = -1
    ended: bool = False
    begun: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Snapshots:
    def __init__(self, broker: Broker, registry: SiteRegistry, deltas: SendQueue) -> None:
        self.broker = broker
        self.registry = registry
        self.deltas = deltas
        self._wanted: dict[str, Wanted] = {}
        self._requesting = asyncio.Lock()
        self._queue: Partition | None = None
        self._requests: Partition | None = None

    @property
    def queue(self) -> Partition:
        assert self._queue is not None, "Snapshots.open() has not run"
        return self._queue

    def open(self) -> None:
        config = StreamConfig(partitions=1)
        self._queue = self.broker.internal_stream(SNAPSHOT_QUEUE, config).partitions[0]
        self._requests = self.broker.internal_stream(SNAPSHOT_REQUESTS, config).partitions[0]

    @property
    def requests(self) -> Partition:
        assert self._requests is not None, "Snapshots.open() has not run"
        return self._requests

    def next_offset(self) -> int:
        """The offset the next request takes in ``__lrq_snapshot_requests``."""
        return self.requests.newest_offset + 1

    def next_id(self) -> int:
        """The id the next snapshot takes: every id given so far is below it."""
        return self.next_offset() + self.registry.snapshot_lift

    async def request(self, site: Site) -> Wanted:
        """Ask the application for a snapshot for ``site`` (replacing any it was asked for)."""
        requests = self.requests
        async with self._requesting:
            # Known before it is written: a provider may answer the request before the publish
            # returns, and the answer must find the snapshot wanted.
            offset = self.next_offset()
            wanted = Wanted(site, offset + self.registry.snapshot_lift)
            self._wanted[site.site_id] = wanted
            body = json.dumps({"site": site.site_id, "snapshot": wanted.snapshot}).encode()
            try:
                published = await requests.publish([body], durable=True)
            except BaseException:
                self.forget(wanted)
                raise
            assert published.offsets[0] == offset, "only request() writes the stream"
        return wanted

    def forget(self, wanted: Wanted) -> None:
        """The sender no longer waits for ``wanted`` (done, or replaced by a newer one)."""
        if self._wanted.get(wanted.site.site_id) is wanted:
            del self._wanted[wanted.site.site_id]

    async def write(
        self,
        site_id: str,
        snapshot: int,
        items: Sequence[tuple[str, bytes]],
        *,
        begin: bool = False,
        end: bool = False,
    ) -> int:
        """Add ``items`` to the snapshot ``snapshot`` of ``site_id`` (first the begin, last
        the end); returns the position the snapshot covers. Nothing is stored when refused."""
        wanted = self._wanted.get(site_id)
        if wanted is None or wanted.snapshot != snapshot:
            self.registry.get(site_id)  # NOT_FOUND for a site that is not declared
            current = f"snapshot {wanted.snapshot}" if wanted else "no snapshot"
            raise FailedPrecondition(
                f"site {echo(site_id)} waits for {current}, not snapshot {snapshot} (it was "
                f"replaced or finished): skip this request"
            )
        self._check(items)
        async with wanted.lock:
            if begin == (wanted.start_offset is not None) or wanted.ended:
                state = "ended" if wanted.ended else "begun" if begin else "not begun"
                raise FailedPrecondition(
                    f"snapshot {snapshot} of site {echo(site_id)} is {state}: a snapshot is "
                    f"one begin, then entries, then one end"
                )
            bit = 1 << wanted.site.number
            records: list[RoutingRecord] = []
            if begin:
                queue_end = await self.deltas.settled_end()
                # Every position the queue gave so far, any site's lifted ones included, is
                # below the next record's (``positions.py``).
                covered = self.deltas.registry.positions.position(queue_end, 0) - 1
                records.append(self._marker(EntryKind.SNAPSHOT_START, snapshot, bit, covered))
            runs: dict[str, list[Entry]] = {}
            for client, payload in items:
                runs.setdefault(client, []).append(Entry(bit, payload))
            # One record per client per call: the order between clients does not matter to a
            # sink (each client has its own receive queue), the order within one does.
            for client, entries in runs.items():
                records += self._packed(client, snapshot, entries)
            if end:
                records.append(self._marker(EntryKind.SNAPSHOT_END, snapshot, bit, -1))
            if records:
                published = await self.queue.publish([encode(r) for r in records], durable=end)
                if begin:
                    wanted.start_offset = published.offsets[0]
                    wanted.covered = covered
                    wanted.begun.set()
            wanted.ended = end
            return wanted.covered

    def _check(self, items: Sequence[tuple[str, bytes]]) -> None:
        limit = self.deltas.max_payload_bytes
        for client, payload in items:
            try:
                validate_site_id(client)
            except InvalidArgument:
                raise InvalidArgument(
                    f"invalid client name {echo(client)}: use 1-63 letters, digits, '_' or '-'"
                ) from None
            if len(payload) > limit:
                raise InvalidArgument(
                    f"a payload of {len(payload)} bytes is over the limit of {limit}; nothing "
                    f"of this call was stored"
                )

    def _marker(self, kind: EntryKind, snapshot: int, bit: int, covered: int) -> RoutingRecord:
        entry = Entry(bit, _COVERED.pack(covered))
        return RoutingRecord(kind, MARKER_CLIENT, snapshot, (entry,))

    def _packed(self, client: str, snapshot: int, entries: list[Entry]) -> list[RoutingRecord]:
        room = self.queue.log_config.max_message_bytes - ENVELOPE_ROOM
        records: list[RoutingRecord] = []
        current: list[Entry] = []
        size = 0
        for entry in entries:
            cost = len(entry.payload) + 15
            if current and size + cost > room:
                records.append(
                    RoutingRecord(EntryKind.SNAPSHOT_ENTRY, client, snapshot, tuple(current))
                )
                current, size = [], 0
            current.append(entry)
            size += cost
        if current:
            records.append(
                RoutingRecord(EntryKind.SNAPSHOT_ENTRY, client, snapshot, tuple(current))
            )
        return records

    def read(self, wanted: Wanted, from_offset: int, max_records: int) -> list[SnapshotRecord]:
        """The records of ``wanted`` at or after ``from_offset``, at most ``max_records``
        (blocking: reads the snapshot queue)."""
        log = self.queue.log
        found: list[SnapshotRecord] = []
        if from_offset > log.newest_offset:
            return found
        if from_offset < log.oldest_offset:
            raise SnapshotTrimmed(
                f"retention removed records of snapshot {wanted.snapshot} before they were sent"
            )
        bit = 1 << wanted.site.number
        for batch in log.forward_reader(from_offset):
            for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                record = decode(value)
                if record.cycle != wanted.snapshot or not record.entries[0].destinations & bit:
                    continue
                payloads = tuple(e.payload for e in record.entries)
                found.append(
                    SnapshotRecord(offset, record.kind, record.client, payloads, wanted.covered)
                )
                if len(found) >= max_records or record.kind is EntryKind.SNAPSHOT_END:
                    return found
        return found
