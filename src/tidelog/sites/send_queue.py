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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn

import numpy as np
import numpy.typing as npt

from tidelog.broker import Broker, Partition, StreamConfig, replace_bytes
from tidelog.errors import InvalidArgument, NotLeader, PositionTrimmed, SiteMoving, echo
from tidelog.sites.envelope import (
    MAX_ENTRIES,
    EntryKind,
    MalformedRecord,
    RecordColumns,
    columns,
    encode_packed,
)
from tidelog.sites.positions import Positions
from tidelog.sites.registry import Site, SiteRegistry, validate_site_id
from tidelog.sites.routed import RoutedColumns
from tidelog.sites.site_state import TRIMS, SiteState
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import decode as decode_index
from tidelog.sites.tag_index_file import encode as encode_index

LOG = logging.getLogger("tidelog.sites")
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
ENVELOPE_ROOM: Final = 300
"""Bytes of a record's size limit kept for its envelope (kind, cycle, client name, counts):
the largest payload is the stream's ``max_message_bytes`` minus this."""
READ_BYTES: Final = 4 << 20
"""Payload bytes a sender reads (and ships in one batch) at most, past the first record."""
_ENTRY_ROOM: Final = 15
"""Bytes of framing per entry at most: a mask (8 bytes in the table), its index and a size."""
DECODED_BYTES: Final = 8 << 20
"""Bytes of decoded records (payloads and columns) kept in memory (``SendQueue._decoded``): the
records a transmit just stored, and those a sender read, so that every site's sender ships them
without reading and decoding them again; at least two senders' reads (``READ_BYTES``) fit."""


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
        self._decoded: OrderedDict[int, RecordColumns] = OrderedDict()
        """Offset -> the record's columns, oldest first, at most ``DECODED_BYTES`` of them:
        decoding once serves every site's sender."""
        self._decoded_bytes = 0
        self._appending = 0
        """Transmits appending now (between their publish and their answer)."""
        self._changing = False
        self._gate = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def positions_changing(self) -> AsyncIterator[None]:
        """Hold transmits back while the lifts change (``positions.py``): entered once no
        transmit is appending, and none starts until it is left. A transmit's records take the
        lifts in force when it answers, so the change (and keeping it, on a cluster) must not
        fall between a transmit's append and its answer."""
        async with self._gate:
            await self._gate.wait_for(lambda: not self._changing)
            self._changing = True
            await self._gate.wait_for(lambda: not self._appending)
        try:
            yield
        finally:
            async with self._gate:
                self._changing = False
                self._gate.notify_all()

    @contextlib.asynccontextmanager
    async def _appending_now(self) -> AsyncIterator[None]:
        async with self._gate:
            await self._gate.wait_for(lambda: not self._changing)
            self._appending += 1
        try:
            yield
        finally:
            async with self._gate:
                self._appending -= 1
                self._gate.notify_all()

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
        restored = self._restored(log.oldest_offset, log.newest_offset)
        if restored is None:
            # Which sites the records below the queue's front were for is not known: for
            # every site, held_from starts there.
            self.index = TagIndex()
            self.index.oldest = self.index.base = log.oldest_offset
            self._assume_trims(log.oldest_offset)
        else:
            # The snapshot knows, per site, the newest record of it trimmed before it was
            # saved; the trim below adds those trimmed since (the snapshot listed them, as it
            # covers the queue up to its front at least).
            self.index = restored
        self._saved_covers = self.index.covers
        self.records_read_at_open = 0
        sites = self.registry.list()
        if log.newest_offset > self.index.covers:
            for batch in log.forward_reader(self.index.covers + 1):
                for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                    self._index(offset, columns(value).site_counts(), sites)
                    self.records_read_at_open += 1
        self.index.trim(log.oldest_offset)
        self.opened_position = self.next_position()

    def _assume_trims(self, oldest: int) -> None:
        """A rebuilt index takes the trim marks saved in ``state`` (a cluster's queue, whose
        index has no snapshot file) when they knew the queue to this front at least: a gap
        trimmed since they were saved is unknown, and every site is then held from the
        front."""
        marks = None if self.state is None else self.state.load(TRIMS)
        if not marks or int(marks["oldest"]) < oldest:
            return
        declared = {site.number: site.since for site in self.registry.list()}
        since = {int(n): int(s) for n, s in marks["since"].items()}
        lost = {
            int(n): int(o)
            for n, o in marks["lost"].items()
            if int(n) in declared and declared[int(n)] == since.get(int(n))
        }
        self.index.assume_trims(int(marks["base"]), lost)

    def _restored(self, oldest: int, newest: int) -> TagIndex | None:
        """The index from its snapshot file, fitted to the registry; None when there is no
        usable one (then the caller reads the whole queue)."""
        path = self.index_file
        if path is None or not path.exists():
            return None
        try:
            index, since = decode_index(path.read_bytes())
        except (OSError, ValueError) as error:
            LOG.warning("%s is unusable (%s): rebuilding the tag index from the queue", path, error)
            return None
        if index.covers > newest or index.covers + 1 < oldest:
            LOG.warning(
                "%s covers the queue up to offset %d, but the queue holds offsets %d to %d: "
                "rebuilding the tag index from the queue",
                path,
                index.covers,
                oldest,
                newest,
            )
            return None
        declared = {site.number: site.since for site in self.registry.list()}
        for number, site_since in since.items():
            if declared.get(number) != site_since:  # removed, or the number taken since
                index.forget_site(number)
        return index

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
            await self.state.save(
                TRIMS,
                {
                    "oldest": self.index.oldest,
                    "base": base,
                    "lost": {str(n): o for n, o in lost.items()},
                    "since": {str(site.number): site.since for site in self.registry.list()},
                },
            )
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
        for offset, record in self._records(offsets, site_number, after):
            first = positions.position(offset, 0)
            part = record.for_site(offset, site_number, first).after(after)
            found.append(part)
            count += len(part)
            size += len(part.payloads)
            if count >= limit or size >= max_bytes:
                break
        return RoutedColumns.concat(found)

    def _records(
        self, offsets: list[int], site_number: int, after: int
    ) -> Iterator[tuple[int, RecordColumns]]:
        """The records at ``offsets`` (ascending), decoded, in order: from memory where they
        are, else read from the queue a run at a time (lazily: the caller may stop early)."""
        log = self.partition.log
        high_watermark = log.high_watermark
        at = 0
        while at < len(offsets):
            offset = offsets[at]
            if offset > high_watermark:
                return  # not committed yet (the index runs ahead of a sync under way)
            if offset < log.oldest_offset:
                self._trimmed_under(site_number, after)
            record = self._decoded.get(offset)
            if record is not None:
                yield offset, record
                at += 1
                continue
            end = at + 1  # a run of consecutive offsets: one reader, no record between
            while (
                end < len(offsets)
                and offsets[end] == offsets[end - 1] + 1
                and offsets[end] not in self._decoded
            ):
                end += 1
            wanted = offsets[at:end]
            last = min(wanted[-1], high_watermark)
            seen = 0
            for batch in log.forward_reader(offset, stop_offset=last):
                for found, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                    if seen == len(wanted) or found < wanted[seen]:
                        continue
                    if found != wanted[seen]:  # retention took one since the check above
                        self._trimmed_under(site_number, after)
                    record = self._remember(found, columns(value))
                    seen += 1
                    yield found, record
            if seen < len(wanted) and wanted[seen] <= last:
                self._trimmed_under(site_number, after)
            at += seen
            if seen < len(wanted):
                return

    def _remember(self, offset: int, record: RecordColumns) -> RecordColumns:
        """Keep ``record`` for the other senders (dropping the oldest beyond the bound). A
        record kept for ``offset`` before is replaced: what was just written or read there is
        what the queue holds."""
        previous = self._decoded.pop(offset, None)
        if previous is not None:
            self._decoded_bytes -= _footprint(previous)
        self._decoded[offset] = record
        self._decoded_bytes += _footprint(record)
        while self._decoded_bytes > DECODED_BYTES and len(self._decoded) > 1:
            _, dropped = self._decoded.popitem(last=False)
            self._decoded_bytes -= _footprint(dropped)
        return record

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

    def _index(self, offset: int, counts: dict[int, int], sites: list[Site]) -> None:
        live = {
            site.number: counts[site.number]
            for site in sites
            if site.number in counts and site.since <= offset
        }
        if live:
            self.index.add(offset, live)

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
        self._check_call(client, payloads, sizes, len(destination_lists), list_indexes)
        table: dict[int, int] = {}  # two lists may name the same sites
        remap = [table.setdefault(self._mask(tuple(d)), len(table)) for d in destination_lists]
        masks = list(table)
        mask_indexes = np.asarray(remap, dtype=np.int64)[list_indexes]
        ends = np.cumsum(sizes)
        starts = ends - sizes
        values = []
        for a, b in self._pack(sizes):
            blob = payloads[int(starts[a]) : int(ends[b - 1])]
            values.append(
                encode_packed(
                    EntryKind.DELTA, client, 0, masks, mask_indexes[a:b], sizes[a:b], blob
                )
            )
        positions: list[int] = []
        async with self._appending_now():
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
                self._remember(offset, record)
        if published.offsets:
            # Indexed first, in append order; acknowledged once the ISR holds it (a cluster's
            # queue; at once on a single broker), so a new leader of the queue has it.
            await self.partition.replicated(published.offsets[-1])
        return positions

    def _check_owned(self) -> None:
        if not self.owned():
            raise SiteMoving(self.registry.local_site)

    def _check_call(
        self,
        client: str,
        payloads: bytes,
        sizes: Int64Array,
        lists: int,
        list_indexes: Int64Array,
    ) -> None:
        try:
            validate_site_id(client)
        except InvalidArgument:
            raise InvalidArgument(
                f"invalid client name {echo(client)}: use 1-63 letters, digits, '_' or '-', "
                f"starting with a letter or digit (it names the sinks' receive queues)"
            ) from None
        count = len(sizes)
        if not count:
            raise InvalidArgument("a transmit needs at least one payload")
        if int(sizes.sum()) != len(payloads):
            raise InvalidArgument(
                f"the payload sizes add up to {int(sizes.sum())} bytes, but {len(payloads)} "
                f"bytes of payloads were sent"
            )
        if len(list_indexes) != count:
            raise InvalidArgument(f"{count} payloads but {len(list_indexes)} destination indexes")
        if int(list_indexes.min()) < 0 or int(list_indexes.max()) >= lists:
            raise InvalidArgument(
                f"a destination index points past the call's {lists} destination lists"
            )
        limit = self.max_payload_bytes
        largest = int(sizes.max())
        if largest > limit:
            raise InvalidArgument(
                f"a payload of {largest} bytes is over the limit of {limit} "
                f"(the server's max_message_bytes less {ENVELOPE_ROOM}); nothing was stored"
            )

    def _mask(self, destinations: tuple[str, ...]) -> int:
        if not destinations:
            raise InvalidArgument("every payload needs at least one destination site")
        mask = 0
        for site_id in destinations:
            if site_id == self.registry.local_site:
                raise InvalidArgument(
                    f"{echo(site_id)} is this site: a payload goes to other sites only"
                )
            mask |= 1 << self.registry.get(site_id).number
        return mask

    def _pack(self, sizes: Int64Array) -> list[tuple[int, int]]:
        """Entries ``[a, b)`` of each record: as few records as the size limit allows (each
        record as many entries as fit, in order)."""
        room = self.partition.log_config.max_message_bytes - ENVELOPE_ROOM
        costs = np.cumsum(sizes + _ENTRY_ROOM)
        bounds: list[tuple[int, int]] = []
        first, count = 0, len(sizes)
        while first < count:
            used_before = int(costs[first - 1]) if first else 0
            end = int(np.searchsorted(costs, used_before + room, side="right"))
            end = min(max(end, first + 1), first + MAX_ENTRIES, count)
            bounds.append((first, end))
            first = end
        return bounds


def _footprint(record: RecordColumns) -> int:
    """Bytes a decoded record holds: its payloads and its columns."""
    return (
        len(record.payloads)
        + record.masks.nbytes
        + record.mask_indexes.nbytes
        + record.sizes.nbytes
    )


def _always() -> bool:
    return True
