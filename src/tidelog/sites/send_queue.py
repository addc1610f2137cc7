"""The source side's delta queue: payloads stored once, tagged with their destination sites.

``transmit`` checks a call whole before it writes anything (a valid client name, at least one
destination per payload, every destination a declared remote site and none this site, payloads
within the size limit), packs the call's entries into as few records as the record size allows
(``envelope.py``), appends them as one batch to the internal stream ``__lrq_delta`` and indexes
each record under its destinations (``tag_index.py``). It answers each entry's position.

At open, the tag index is rebuilt by reading the queue; a record's bit for a site counts only
from that site's ``since`` offset on (``registry.py``), so a removed site's entries never reach
a later site that took its number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tidelog.broker import Broker, Partition, StreamConfig
from tidelog.errors import InvalidArgument, echo
from tidelog.sites.envelope import (
    MAX_ENTRIES,
    Entry,
    EntryKind,
    RoutedEntry,
    RoutingRecord,
    count_sites,
    encode,
    position,
    routed_for,
    site_counts,
    split_position,
)
from tidelog.sites.registry import Site, SiteRegistry, validate_site_id
from tidelog.sites.tag_index import TagIndex

DELTA_QUEUE: Final = "__lrq_delta"
ENVELOPE_ROOM: Final = 300
"""Bytes of a record's size limit kept for its envelope (kind, cycle, client name, counts):
the largest payload is the stream's ``max_message_bytes`` minus this."""
READ_BYTES: Final = 4 << 20
"""Payload bytes a sender reads (and ships in one batch) at most, past the first record."""
_ENTRY_ROOM: Final = 15
"""Bytes of framing per entry at most: a 64-bit mask and a length, as varints."""


@dataclass(frozen=True, slots=True)
class Transmission:
    payload: bytes
    destinations: Sequence[str]


class SendQueue:
    def __init__(self, broker: Broker, registry: SiteRegistry) -> None:
        self.broker = broker
        self.registry = registry
        self.index = TagIndex()
        self._partition: Partition | None = None

    @property
    def partition(self) -> Partition:
        assert self._partition is not None, "SendQueue.open() has not run"
        return self._partition

    @property
    def next_offset(self) -> int:
        return self.partition.newest_offset + 1

    @property
    def max_payload_bytes(self) -> int:
        return self.partition.log_config.max_message_bytes - ENVELOPE_ROOM

    def open(self) -> None:
        """Create the queue if needed and rebuild the tag index from it (blocking: reads the
        whole queue; run it in a thread)."""
        stream = self.broker.internal_stream(DELTA_QUEUE, StreamConfig(partitions=1))
        self._partition = stream.partitions[0]
        log = self._partition.log
        self.index = TagIndex()
        self.index.base = self.index.oldest = log.oldest_offset
        if log.newest_offset < 0:
            return
        sites = self.registry.list()
        for batch in log.forward_reader(0):
            for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                self._index(offset, site_counts(value), sites)
        self.index.trim(log.oldest_offset)

    def read_for(
        self, site_number: int, after: int, limit: int, max_bytes: int = READ_BYTES
    ) -> list[RoutedEntry]:
        """The entries for one site with positions after ``after``, in order, whole records at
        a time, stopping after the record that reaches ``limit`` entries or ``max_bytes`` of
        payload (at least one record). Reads only the records the tag index lists for the site
        (blocking: a few records per call)."""
        self._follow_retention()
        from_offset = split_position(after)[0] if after >= 0 else 0
        offsets = self.index.records_for(site_number, from_offset, limit)
        found: list[RoutedEntry] = []
        size = 0
        log = self.partition.log
        wanted = set(offsets)
        for first, last in _runs(offsets):
            for batch in log.forward_reader(first, stop_offset=last):
                for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                    if offset not in wanted:
                        continue
                    fresh = [
                        e for e in routed_for(value, offset, site_number) if e.position > after
                    ]
                    found += fresh
                    size += sum(len(e.payload) for e in fresh)
                    if len(found) >= limit or size >= max_bytes:
                        return found
        return found

    def held_from(self, site_number: int) -> int:
        """The record offset from which the queue holds every entry for the site."""
        self._follow_retention()
        return self.index.held_from(site_number)

    def lost_for(self, site_number: int, after: int) -> bool:
        """Whether retention removed entries for the site after position ``after``."""
        return self.held_from(site_number) > split_position(after)[0] + 1

    def _follow_retention(self) -> None:
        """Trim the index to what the log still holds (retention runs in the broker)."""
        self.index.trim(self.partition.log.oldest_offset)

    def oldest_position(self) -> int:
        """The position of the oldest entry the queue still holds (or of the next one)."""
        log = self.partition.log
        return position(log.oldest_offset if log.newest_offset >= 0 else self.next_offset, 0)

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
        records = self._pack(client, [self._entry(item) for item in self._checked(client, items)])
        published = await self.partition.publish([encode(r) for r in records])
        positions: list[int] = []
        for offset, record in zip(published.offsets, records, strict=True):
            counts: dict[int, int] = {}
            for index, entry in enumerate(record.entries):
                positions.append(position(offset, index))
                count_sites(entry.destinations, counts)
            self.index.add(offset, counts)
        return positions

    def _checked(self, client: str, items: Sequence[Transmission]) -> Sequence[Transmission]:
        try:
            validate_site_id(client)
        except InvalidArgument:
            raise InvalidArgument(
                f"invalid client name {echo(client)}: use 1-63 letters, digits, '_' or '-', "
                f"starting with a letter or digit (it names the sinks' receive queues)"
            ) from None
        if not items:
            raise InvalidArgument("a transmit needs at least one payload")
        limit = self.max_payload_bytes
        for item in items:
            if len(item.payload) > limit:
                raise InvalidArgument(
                    f"a payload of {len(item.payload)} bytes is over the limit of {limit} "
                    f"(the server's max_message_bytes less {ENVELOPE_ROOM}); nothing was stored"
                )
        return items

    def _entry(self, item: Transmission) -> Entry:
        if not item.destinations:
            raise InvalidArgument("every payload needs at least one destination site")
        mask = 0
        for site_id in item.destinations:
            if site_id == self.registry.local_site:
                raise InvalidArgument(
                    f"{echo(site_id)} is this site: a payload goes to other sites only"
                )
            mask |= 1 << self.registry.get(site_id).number
        return Entry(mask, item.payload)

    def _pack(self, client: str, entries: list[Entry]) -> list[RoutingRecord]:
        """As few records as the size limit allows, entries in order."""
        room = self.partition.log_config.max_message_bytes - ENVELOPE_ROOM
        records: list[RoutingRecord] = []
        current: list[Entry] = []
        size = 0
        for entry in entries:
            cost = len(entry.payload) + _ENTRY_ROOM
            if current and (size + cost > room or len(current) == MAX_ENTRIES):
                records.append(RoutingRecord(EntryKind.DELTA, client, 0, tuple(current)))
                current, size = [], 0
            current.append(entry)
            size += cost
        records.append(RoutingRecord(EntryKind.DELTA, client, 0, tuple(current)))
        return records


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Consecutive offsets as (first, last) runs: one reader per run."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and offset == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs
