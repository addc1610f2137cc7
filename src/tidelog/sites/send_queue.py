"""The source side's delta queue: payloads stored once, tagged with their destination sites.

``transmit`` checks a call whole before it writes anything (a valid client name, at least one
destination per payload, every destination a declared remote site and none this site, payloads
within the size limit), packs the call's entries into as few records as the record size allows
(``envelope.py``), appends them as one batch to the internal stream ``__lrq_delta`` and indexes
each record under its destinations (``tag_index.py``). It answers each entry's position.

At open, the tag index is restored from its snapshot file (``tag_index_file.py``) and only the
records after the offset it covers are read; without a usable snapshot (missing, damaged, or not
fitting the queue: covering records the queue does not hold, or missing records retention has
since removed) it is rebuilt by reading the whole queue. Either way a record's bit for a site
counts only from that site's ``since`` offset on (``registry.py``), and a snapshot's list for a
number whose site changed since (removed, or the number taken by another) is dropped, so a
removed site's entries never reach a later site that took its number.

Positions go through the registry's lifts (``positions.py``): a transmit answers each entry's
position as every site sees it (a site lifted at its first contact sees its entries stored
before that at its own, higher ones), and reads for a site give its positions. A change of the
lifts waits until no transmit is appending and holds new ones back until it is made and kept
(:meth:`SendQueue.positions_changing`), so a transmit's answer always uses the lifts its records
are read with.

Entries leave the queue in whole segments, once every declared site acknowledged them
(``upkeep.py``) or by retention (:class:`QueueRetention`). A read for a site whose next entries
retention may have removed raises ``PositionTrimmed`` rather than skip them.

The pieces, one concern each: a call's checks, its packing into records and the gate between
transmits and a change of the lifts (``queue_appends.py``, no I/O); the records read by offset,
with the decoded ones kept in memory for every site's sender (``queue_reads.py``); the tag
index's restore from its snapshot or rebuild (``queue_index.py``). :class:`SendQueue` holds what
they share (the partition, the tag index, the registry's positions) and does the I/O: the
append, the reads for a site, and keeping the index.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn

import numpy as np
import numpy.typing as npt

from tidelog.broker import Broker, Partition, StreamConfig
from tidelog.durable import replace_bytes
from tidelog.errors import InvalidArgument, NotLeader, PositionTrimmed, SiteMoving
from tidelog.sites.envelope import MalformedRecord, columns
from tidelog.sites.positions import Positions
from tidelog.sites.queue_appends import ENVELOPE_ROOM as ENVELOPE_ROOM
from tidelog.sites.queue_appends import TransmitGate, encoded_call
from tidelog.sites.queue_index import index_record, rebuilt, restored, trim_marks
from tidelog.sites.queue_reads import DecodedRecords, records_at
from tidelog.sites.registry import SiteRegistry
from tidelog.sites.routed import RoutedColumns
from tidelog.sites.site_state import TRIMS, SiteState
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import encode as encode_index

Int64Array = npt.NDArray[np.int64]

DELTA_QUEUE: Final = "__lrq_delta"
QUEUE_SEGMENT_BYTES: Final = 16 << 20
"""Segment size of the delta queue. Space comes back a whole sealed segment at a time (once
every site acked it, or retention took it), so this is the step in which an acknowledged queue
shrinks: 16 MiB instead of the 256 MiB default keeps at most a few tens of MiB of acked entries
on disk, while a segment still holds at least 64 records of the largest size (256 KiB), so its
fixed costs (two files, a descriptor in the shared cache) stay small; a 1 GiB backlog is 64
segments."""
QUEUE_SEGMENT_MAX_AGE_S: Final = 3600.0
"""A quiet queue's active segment is sealed after an hour, so entries every site acked leave
within about an hour plus the upkeep interval even when little is transmitted."""
READ_BYTES: Final = 4 << 20
"""Payload bytes a sender reads (and ships in one batch) at most, past the first record."""


@dataclass(frozen=True, slots=True)
class QueueRetention:
    """The retention backstop of the delta queue: beyond these bounds its oldest segments go
    even when a site has not acknowledged them (that site then needs a snapshot sync). None:
    the server's own ``retention_bytes`` / ``retention_age_s``. The bytes bound is a floor, as
    for every stream: the queue keeps at least that much and at most one segment more."""

    max_bytes: int | None = None
    max_age_s: float | None = None
    segment_bytes: int = QUEUE_SEGMENT_BYTES

    def stream_config(self) -> StreamConfig:
        return StreamConfig(
            partitions=1,
            segment_max_bytes=self.segment_bytes,
            segment_max_age_s=QUEUE_SEGMENT_MAX_AGE_S,
            retention_bytes=self.max_bytes,
            retention_age_s=self.max_age_s,
        )


@dataclass(frozen=True, slots=True)
class Transmission:
    payload: bytes
    destinations: Sequence[str]


class SendQueue:
    def __init__(
        self,
        broker: Broker,
        registry: SiteRegistry,
        retention: QueueRetention | None = None,
        *,
        index_file: Path | None = None,
    ) -> None:
        """``index_file``: where the tag index's snapshot is kept (None: never kept, rebuilt at
        every open)."""
        self.broker = broker
        self.registry = registry
        self.retention = retention or QueueRetention()
        self.index_file = index_file
        self.index = TagIndex()
        self.records_read_at_open = 0
        """How many records the last :meth:`open` read to build the tag index."""
        self._saved_covers = -1
        self.opened_position = 0
        """The position the next entry took when the queue was opened (:meth:`open`): every
        position an earlier run gave is below it, unless the queue lost records since
        (``positions.py``: a sink's report at or past it is then refused)."""
        self.state: SiteState | None = None
        """Where the index's trim marks are kept when no snapshot file is (a cluster's
        ``__lrq_state``: :meth:`save_index`, and :meth:`open` takes them back)."""
        self._saved_trims: tuple[int, int, dict[int, int]] | None = None
        self.owned: Callable[[], bool] = _always
        """Whether this queue's site still runs here under the leadership it was opened with
        (a cluster's: ``LocalSite.fence``). A site that lost it since (even if this broker
        leads the queue again, over a log another leader changed) stores, ships, releases and
        saves nothing more: its index and positions may stand on records that were cut."""
        self._partition: Partition | None = None
        self._decoded = DecodedRecords()
        """The records a transmit just stored or a sender read, decoded: decoding once serves
        every site's sender (``queue_reads.py``)."""
        self._gate = TransmitGate()

    def positions_changing(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold transmits back while the lifts change (``positions.py``): entered once no
        transmit is appending, and none starts until it is left. A transmit's records take the
        lifts in force when it answers, so the change (and keeping it, on a cluster) must not
        fall between a transmit's append and its answer."""
        return self._gate.positions_changing()

    @property
    def partition(self) -> Partition:
        assert self._partition is not None, "SendQueue.open() has not run"
        return self._partition

    @property
    def next_offset(self) -> int:
        return self.partition.newest_offset + 1

    def next_position(self) -> int:
        """The position the next entry stored will take: every position this queue gave (to
        any site) is below it."""
        return self.registry.positions.position(self.next_offset, 0)

    def oldest_offset(self) -> int:
        """The offset of the oldest record the queue holds (the next one when it is empty)."""
        log = self.partition.log
        return log.oldest_offset if log.newest_offset >= 0 else self.next_offset

    def positions_of(self, site_number: int) -> Positions:
        """The positions the site of ``site_number`` sees (the global ones when no declared
        site has it)."""
        site = next((s for s in self.registry.list() if s.number == site_number), None)
        return self.registry.positions if site is None else self.registry.positions_for(site)

    async def settled_end(self) -> int:
        """The queue's next offset, once every record below it is in sync: on a cluster a
        record above the high watermark may be cut by a failover and its offset taken by
        another, so a position that counts from here (a new site's ``since``, what a snapshot
        covers) must not stand on it. At once on a single broker."""
        end = self.next_offset
        if end > 0:
            await self.partition.replicated(end - 1)
        return end

    @property
    def max_payload_bytes(self) -> int:
        return self.partition.log_config.max_message_bytes - ENVELOPE_ROOM

    def open(self) -> None:
        """Create the queue if needed and build the tag index: its snapshot plus the records
        after it, or every record (blocking: reads the queue; run it in a thread)."""
        stream = self.broker.internal_stream(DELTA_QUEUE, self.retention.stream_config())
        self._partition = stream.partitions[0]
        log = self._partition.log
        sites = self.registry.list()
        index = restored(self.index_file, sites, log.oldest_offset, log.newest_offset)
        if index is None:
            # Which sites the records below the queue's front were for is not known: for
            # every site, held_from starts there (unless the trim marks kept in ``state`` know).
            marks = None if self.state is None else self.state.load(TRIMS)
            self.index = rebuilt(log.oldest_offset, marks, sites)
        else:
            # The snapshot knows, per site, the newest record of it trimmed before it was
            # saved; the trim below adds those trimmed since (the snapshot listed them, as it
            # covers the queue up to its front at least).
            self.index = index
        self._saved_covers = self.index.covers
        self.records_read_at_open = 0
        if log.newest_offset > self.index.covers:
            for batch in log.forward_reader(self.index.covers + 1):
                for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                    index_record(self.index, offset, columns(value).site_counts(), sites)
                    self.records_read_at_open += 1
        self.index.trim(log.oldest_offset)
        self.opened_position = self.next_position()

    async def save_index(self) -> bool:
        """Write the tag index's snapshot if it moved since the last one (the bytes are taken
        on the loop, written in a thread); True if written."""
        if self.index_file is None:
            return await self._save_trims()
        if self.index.covers == self._saved_covers:
            return False
        covers = self.index.covers
        since = {site.number: site.since for site in self.registry.list()}
        data = encode_index(self.index, since)
        await asyncio.to_thread(replace_bytes, self.index_file, data)
        self._saved_covers = covers
        return True

    async def _save_trims(self) -> bool:
        """Without a snapshot file, keep the index's trim marks in ``state`` when they moved
        (a cluster's queue: the next broker to run the site rebuilds its index from the queue,
        and without them it would hold every site from the queue's front, sending a quiet site
        a snapshot after every failover). True if written."""
        base, lost = self.index.trims()
        trims = (self.index.oldest, base, lost)
        if self.state is None or trims == self._saved_trims or not self.owned():
            return False
        with contextlib.suppress(NotLeader):  # this broker no longer runs the site: not ours
            await self.state.save(TRIMS, trim_marks(self.index, base, lost, self.registry.list()))
            self._saved_trims = trims
            return True
        return False

    def read_for(
        self, site_number: int, after: int, limit: int, max_bytes: int = READ_BYTES
    ) -> RoutedColumns:
        """The entries for one site with positions after ``after``, in order, whole records at
        a time, stopping after the record that reaches ``limit`` entries or ``max_bytes`` of
        payload (at least one record). Reads only the records the tag index lists for the site,
        from memory when a transmit or another site's read decoded them recently, else from the
        queue (blocking: a few records per call). Raises ``PositionTrimmed`` when retention
        removed entries for the site after ``after`` (:meth:`lost_for`), or removes a record
        listed for it while this reads: reading on would skip them."""
        self._check_owned()
        self._follow_retention()
        positions = self.positions_of(site_number)
        if self.lost_for(site_number, after):
            held = positions.position(self.index.held_from(site_number), 0)
            raise PositionTrimmed(self._site_id(site_number), after, held)
        from_offset = max(positions.record_of(after), 0)
        # One record more than the limit: the first may be the one ``after`` is in, with
        # nothing left in it after ``after`` (a read of one record would then find nothing).
        offsets = self.index.records_for(site_number, from_offset, limit + 1)
        found: list[RoutedColumns] = []
        count = size = 0
        records = records_at(
            self.partition, offsets, self._decoded, lambda: self._trimmed_under(site_number, after)
        )
        for offset, record in records:
            first = positions.position(offset, 0)
            part = record.for_site(offset, site_number, first).after(after)
            found.append(part)
            count += len(part)
            size += len(part.payloads)
            if count >= limit or size >= max_bytes:
                break
        return RoutedColumns.concat(found)

    def _trimmed_under(self, site_number: int, after: int) -> NoReturn:
        """A record the index listed for the site was gone when read: retention removed it
        between the index's trim and the read."""
        oldest = self.positions_of(site_number).position(self.partition.log.oldest_offset, 0)
        raise PositionTrimmed(self._site_id(site_number), after, oldest)

    def held_from(self, site_number: int) -> int:
        """The record offset from which the queue holds every entry for the site."""
        self._follow_retention()
        return self.index.held_from(site_number)

    def lost_for(self, site_number: int, after: int) -> bool:
        """Whether retention removed entries for the site after position ``after``."""
        record = self.positions_of(site_number).record_of(after)
        return self.held_from(site_number) > record + 1

    def _follow_retention(self) -> None:
        """Trim the index to what the log still holds (retention runs in the broker)."""
        self.index.trim(self.partition.log.oldest_offset)

    def _site_id(self, number: int) -> str:
        return next((s.site_id for s in self.registry.list() if s.number == number), str(number))

    async def transmit(self, client: str, items: Sequence[Transmission]) -> list[int]:
        """Store ``items`` once each, tagged with their destinations; their positions, in
        order. Nothing is stored when any item is refused."""
        return await self.transmit_columns(
            client, [i.payload for i in items], [i.destinations for i in items]
        )

    async def transmit_columns(
        self, client: str, payloads: Sequence[bytes], destinations: Sequence[Sequence[str]]
    ) -> list[int]:
        """:meth:`transmit` with the payloads and their destination lists side by side."""
        if len(destinations) != len(payloads):
            raise InvalidArgument(
                f"{len(payloads)} payloads but {len(destinations)} destination lists"
            )
        lists: dict[tuple[str, ...], int] = {}  # a call repeats few destination lists
        indexes = [lists.setdefault(tuple(d), len(lists)) for d in destinations]
        sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        return await self.transmit_packed(
            client, b"".join(payloads), sizes, list(lists), np.asarray(indexes, dtype=np.int64)
        )

    async def transmit_packed(
        self,
        client: str,
        payloads: bytes,
        sizes: Int64Array,
        destination_lists: Sequence[Sequence[str]],
        list_indexes: Int64Array,
    ) -> list[int]:
        """:meth:`transmit` from columns (what a packed ``TransmitRequest`` carries): entry i
        is the next ``sizes[i]`` bytes of ``payloads``, for the sites of
        ``destination_lists[list_indexes[i]]``. Checked whole before anything is written."""
        self._check_owned()
        values = encoded_call(
            client,
            payloads,
            sizes,
            destination_lists,
            list_indexes,
            self.registry,
            self.partition.log_config.max_message_bytes,
        )
        positions: list[int] = []
        async with self._gate.appending():
            published = await self.partition.publish(values)
            lifts = self.registry.positions
            for offset, value in zip(published.offsets, values, strict=True):
                try:
                    record = columns(value)
                except MalformedRecord as error:  # never: it was just encoded
                    raise AssertionError(
                        f"a record encoded here does not decode: {error}"
                    ) from None
                first = lifts.position(offset, 0)
                positions += range(first, first + len(record))
                self.index.add(offset, record.site_counts())
                self._decoded.remember(offset, record)
        if published.offsets:
            # Indexed first, in append order; acknowledged once the ISR holds it (a cluster's
            # queue; at once on a single broker), so a new leader of the queue has it.
            await self.partition.replicated(published.offsets[-1])
        return positions

    def _check_owned(self) -> None:
        if not self.owned():
            raise SiteMoving(self.registry.local_site)


def _always() -> bool:
    return True
