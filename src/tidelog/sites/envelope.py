"""The send queue's record format: one record holds the entries of one transmit call.

Decision (issue 13's note says why): a record packs every entry of a call, instead of one record
per payload. A record costs 36 bytes of header and 20 of index entry; one per 100-byte payload
stores 1.56 bytes per payload byte, where a packed batch of 100 entries stores about 1.04. Each
entry still has its own position, ``offset * 2**16 + index`` (:func:`position`), so senders,
sinks and acks address entries one by one, and a call of one payload is a record of one entry.

Value layout (little-endian; varints are unsigned LEB128):

| field | type | meaning |
|---|---|---|
| version | u8 | ``1`` |
| kind | u8 | :class:`EntryKind` |
| cycle | varint | the snapshot's sync cycle (0 for deltas) |
| client length, client | u8, UTF-8 | the client name, 1 to 255 bytes |
| count | varint | entries in the record, 1 to 65,536 |
| per entry: destinations | varint | bit n set: site number n is a destination |
| per entry: length, payload | varint, bytes | the opaque payload |

Sites are numbered once, never reused, at most 64 of them (a mask is 64 bits). The payload bytes
are written once, whatever the number of destinations; a sender strips the
destination bits before it ships an entry (:func:`routed_for`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

VERSION: Final = 1
MAX_ENTRIES: Final = 1 << 16
"""Entries per record: the low 16 bits of a position."""
MAX_SITES: Final = 64
"""Site numbers 0..63: a destination set is a 64-bit mask."""


class EntryKind(enum.IntEnum):
    DELTA = 0
    SNAPSHOT_ENTRY = 1
    SNAPSHOT_START = 2
    SNAPSHOT_END = 3


class MalformedRecord(ValueError):
    """A send-queue record that does not decode (never written by this module)."""


@dataclass(frozen=True, slots=True)
class Entry:
    destinations: int
    """Bit mask of site numbers."""
    payload: bytes


@dataclass(frozen=True, slots=True)
class RoutingRecord:
    kind: EntryKind
    client: str
    cycle: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class RoutedEntry:
    """One entry as it travels to a sink: its position, its client, its payload (the
    destinations stripped)."""

    position: int
    client: str
    payload: bytes


def position(offset: int, index: int) -> int:
    """An entry's position: its record's offset and its index in the record, as one integer
    that orders entries as the queue does."""
    if not 0 <= index < MAX_ENTRIES:
        raise ValueError(f"entry index {index} outside 0..{MAX_ENTRIES - 1}")
    return offset * MAX_ENTRIES + index


def split_position(at: int) -> tuple[int, int]:
    """(record offset, entry index) of a position."""
    return divmod(at, MAX_ENTRIES)


def mask_of(site_numbers: Sequence[int]) -> int:
    mask = 0
    for number in site_numbers:
        if not 0 <= number < MAX_SITES:
            raise ValueError(f"site number {number} outside 0..{MAX_SITES - 1}")
        mask |= 1 << number
    return mask


def _varint(value: int, out: bytearray) -> None:
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise MalformedRecord("a varint runs past the record or over 64 bits")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def encode(record: RoutingRecord) -> bytes:
    client = record.client.encode()
    if not 1 <= len(client) <= 255:
        raise ValueError(f"a client name is 1-255 bytes of UTF-8, got {len(client)}")
    if not 1 <= len(record.entries) <= MAX_ENTRIES:
        raise ValueError(f"a record holds 1-{MAX_ENTRIES} entries, got {len(record.entries)}")
    out = bytearray((VERSION, int(record.kind)))
    _varint(record.cycle, out)
    out.append(len(client))
    out += client
    _varint(len(record.entries), out)
    for entry in record.entries:
        if not 0 < entry.destinations < 1 << MAX_SITES:
            raise ValueError("an entry needs at least one destination, site numbers below 64")
        _varint(entry.destinations, out)
        _varint(len(entry.payload), out)
        out += entry.payload
    return bytes(out)


def _header(data: memoryview) -> tuple[EntryKind, str, int, int, int]:
    """kind, client, cycle, count, and where the entries start."""
    if len(data) < 2 or data[0] != VERSION:
        raise MalformedRecord("not a send-queue record of version 1")
    try:
        kind = EntryKind(data[1])
    except ValueError:
        raise MalformedRecord(f"unknown entry kind {data[1]}") from None
    cycle, at = _read_varint(data, 2)
    if at >= len(data):
        raise MalformedRecord("the record ends before its client name")
    length = data[at]
    client_bytes = bytes(data[at + 1 : at + 1 + length])
    if len(client_bytes) != length:
        raise MalformedRecord("the record ends inside its client name")
    count, at = _read_varint(data, at + 1 + length)
    if not 1 <= count <= MAX_ENTRIES:
        raise MalformedRecord(f"a record holds 1-{MAX_ENTRIES} entries, this one says {count}")
    return kind, client_bytes.decode(errors="replace"), cycle, count, at


def _entries(data: memoryview, count: int, at: int) -> Iterator[tuple[int, int, memoryview]]:
    for index in range(count):
        destinations, at = _read_varint(data, at)
        length, at = _read_varint(data, at)
        if at + length > len(data):
            raise MalformedRecord("an entry's payload runs past the record")
        yield index, destinations, data[at : at + length]
        at += length
    if at != len(data):
        raise MalformedRecord("bytes left after the last entry")


def decode(value: bytes | memoryview) -> RoutingRecord:
    data = memoryview(value)
    kind, client, cycle, count, at = _header(data)
    entries = tuple(Entry(mask, bytes(payload)) for _, mask, payload in _entries(data, count, at))
    return RoutingRecord(kind, client, cycle, entries)


def site_counts(value: bytes | memoryview) -> dict[int, int]:
    """Site number -> how many of the record's entries are for it (what the tag index keeps)."""
    data = memoryview(value)
    _, _, _, count, at = _header(data)
    counts: dict[int, int] = {}
    for _, mask, _ in _entries(data, count, at):
        count_sites(mask, counts)
    return counts


def count_sites(mask: int, counts: dict[int, int]) -> None:
    """Add one to ``counts`` for every site number set in ``mask``."""
    number = 0
    while mask:
        if mask & 1:
            counts[number] = counts.get(number, 0) + 1
        mask >>= 1
        number += 1


def routed_for(value: bytes | memoryview, offset: int, site_number: int) -> list[RoutedEntry]:
    """The entries of the record at ``offset`` for one site, as they travel."""
    bit = 1 << site_number
    data = memoryview(value)
    _, client, _, count, at = _header(data)
    return [
        RoutedEntry(position(offset, i), client, bytes(payload))
        for i, mask, payload in _entries(data, count, at)
        if mask & bit
    ]
