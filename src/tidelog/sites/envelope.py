"""The send queue's record format: one record holds the entries of one transmit call.

Decision (issue 13's note says why): a record packs every entry of a call, instead of one record
per payload. A record costs 36 bytes of header and 20 of index entry; one per 100-byte payload
stores 1.56 bytes per payload byte, where a packed batch of 100 entries stores about 1.03. Each
entry still has its own position, ``offset * 2**16 + index`` (:func:`position`), so senders,
sinks and acks address entries one by one, and a call of one payload is a record of one entry.

Version 2 (written since issue 13's throughput work) is columnar, so a record decodes with a
handful of numpy calls whatever its number of entries (little-endian; varints are unsigned
LEB128):

| field | type | meaning |
|---|---|---|
| version | u8 | ``2`` |
| kind | u8 | :class:`EntryKind` |
| flags | u8 | bit 0: mask indexes are u16 (else u8); bit 1: sizes are u32 (else u16) |
| cycle | varint | the snapshot's sync cycle (0 for deltas) |
| client length, client | u8, UTF-8 | the client name, 1 to 255 bytes |
| count | varint | entries in the record, 1 to 65,536 |
| distinct | varint | distinct destination masks in the record, 1 to count |
| masks | distinct x u64 | each a bit mask: bit n set, site number n is a destination |
| mask indexes | count x u8 or u16 | each entry's mask, as an index into ``masks`` |
| sizes | count x u16 or u32 | each entry's payload length |
| payloads | bytes | the payloads back to back, nothing after them |

Masks are a table because a call repeats few destination lists: an entry costs 1 byte of mask
index and 2 of size (3 bytes over its payload, as version 1's varints did), where a u64 mask and
a u32 size per entry would store 1.12 bytes per byte of a 100-byte payload, over issue 13's
bound of 1.1.

Version 1 (the first format; still decoded, entry by entry, so existing data directories read):
``version`` (u8, ``1``), ``kind`` (u8), ``cycle`` (varint), client length and client, ``count``
(varint), then per entry its mask (varint), payload length (varint) and payload.

At most 64 sites (a mask is 64 bits); a number freed by a removal is taken by the next site
declared, which counts records only from its ``since`` on (``registry.py``). The payload bytes
are written once, whatever the number of destinations; a sender strips the destination masks
before it ships an entry (:meth:`RecordColumns.for_site`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog.sites.routed import RoutedColumns, RoutedEntry

__all__ = [
    "MAX_ENTRIES",
    "MAX_SITES",
    "VERSION",
    "Entry",
    "EntryKind",
    "MalformedRecord",
    "RecordColumns",
    "RoutedEntry",
    "RoutingRecord",
    "columns",
    "count_sites",
    "decode",
    "encode",
    "encode_columns",
    "encode_packed",
    "mask_of",
    "position",
    "routed_for",
    "site_counts",
    "split_position",
]

VERSION: Final = 2
MAX_ENTRIES: Final = 1 << 16
"""Entries per record: the low 16 bits of a position."""
MAX_SITES: Final = 64
"""Site numbers 0..63: a destination set is a 64-bit mask."""
_WIDE_INDEXES: Final = 0x01
_WIDE_SIZES: Final = 0x02
_U64: Final = np.dtype("<u8")
_NARROW: Final = (np.dtype("u1"), np.dtype("<u2"))
_SIZE_WIDTHS: Final = (np.dtype("<u2"), np.dtype("<u4"))

Int64Array = npt.NDArray[np.int64]
Uint64Array = npt.NDArray[np.uint64]


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
class RecordColumns:
    """A decoded record as columns: each entry's mask (through ``masks[mask_indexes]``) and
    payload size, the payloads back to back."""

    kind: EntryKind
    client: str
    cycle: int
    masks: Uint64Array
    """The distinct masks."""
    mask_indexes: Int64Array
    sizes: Int64Array
    payloads: bytes

    def __len__(self) -> int:
        return len(self.sizes)

    def entry_masks(self) -> Uint64Array:
        return self.masks[self.mask_indexes]

    def site_counts(self) -> dict[int, int]:
        """Site number -> how many entries are for it (one pass per distinct mask)."""
        per_mask = np.bincount(self.mask_indexes, minlength=len(self.masks)).tolist()
        counts: dict[int, int] = {}
        for mask, times in zip(self.masks.tolist(), per_mask, strict=True):
            if times:
                for number in _numbers(mask):
                    counts[number] = counts.get(number, 0) + times
        return counts

    def for_site(self, offset: int, site_number: int, first: int | None = None) -> RoutedColumns:
        """The entries for one site, as they travel (the record at ``offset``, whose first
        entry takes position ``first``: by default not lifted, ``positions.py``)."""
        bit = np.uint64(1 << site_number)
        wanted = (self.masks & bit) != 0
        first = position(offset, 0) if first is None else first
        n = len(self.sizes)
        if bool(wanted.all()):
            positions = np.arange(first, first + n, dtype=np.int64)
            return RoutedColumns(positions, self.sizes, self.payloads, (self.client,), (n,))
        if not bool(wanted.any()):
            return RoutedColumns.empty()
        chosen = np.flatnonzero(wanted[self.mask_indexes])
        ends = np.cumsum(self.sizes)
        sizes = self.sizes[chosen]
        starts = (ends - self.sizes)[chosen].tolist()
        stops = ends[chosen].tolist()
        data = self.payloads
        blob = b"".join([data[a:b] for a, b in zip(starts, stops, strict=True)])
        return RoutedColumns(chosen + first, sizes, blob, (self.client,), (len(chosen),))

    def record(self) -> RoutingRecord:
        masks = self.entry_masks().tolist()
        ends = np.cumsum(self.sizes).tolist()
        data = self.payloads
        start = 0
        entries: list[Entry] = []
        for mask, end in zip(masks, ends, strict=True):
            entries.append(Entry(mask, data[start:end]))
            start = end
        return RoutingRecord(self.kind, self.client, self.cycle, tuple(entries))


def position(offset: int, index: int) -> int:
    """An entry's position: its record's offset and its index in the record, as one integer
    that orders entries as the queue does. The queue adds a lift to the offset once it learned
    that an older queue of its site gave higher positions (``positions.py``)."""
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
    """Version 2 bytes of ``record``."""
    return encode_columns(
        record.kind,
        record.client,
        record.cycle,
        [e.destinations for e in record.entries],
        [e.payload for e in record.entries],
    )


def encode_columns(
    kind: EntryKind,
    client: str,
    cycle: int,
    destinations: Sequence[int],
    payloads: Sequence[bytes],
) -> bytes:
    """Version 2 bytes of a record whose entry i is ``payloads[i]`` for the sites in mask
    ``destinations[i]``."""
    table: dict[int, int] = {}
    indexes = [table.setdefault(mask, len(table)) for mask in destinations]
    count = len(payloads)
    if len(destinations) != count:
        raise ValueError(f"{count} payloads but {len(destinations)} masks")
    return encode_packed(
        kind,
        client,
        cycle,
        list(table),
        np.asarray(indexes, dtype=np.int64),
        np.fromiter(map(len, payloads), dtype=np.int64, count=count),
        b"".join(payloads),
    )


def encode_packed(
    kind: EntryKind,
    client: str,
    cycle: int,
    masks: Sequence[int],
    mask_indexes: Int64Array,
    sizes: Int64Array,
    payloads: bytes,
) -> bytes:
    """Version 2 bytes from columns: entry i is for the sites in ``masks[mask_indexes[i]]``,
    its payload the next ``sizes[i]`` bytes of ``payloads``. Masks no entry uses are left out
    of the record."""
    name = client.encode()
    if not 1 <= len(name) <= 255:
        raise ValueError(f"a client name is 1-255 bytes of UTF-8, got {len(name)}")
    count = len(sizes)
    if not 1 <= count <= MAX_ENTRIES or len(mask_indexes) != count:
        raise ValueError(f"a record holds 1-{MAX_ENTRIES} entries, got {count}")
    if int(sizes.sum()) != len(payloads):
        raise ValueError(f"sizes add up to {int(sizes.sum())}, not {len(payloads)} bytes")
    if len(masks) > 1:
        used, mask_indexes = np.unique(mask_indexes, return_inverse=True)
        masks = [masks[i] for i in used.tolist()]
    if not all(0 < mask < 1 << MAX_SITES for mask in masks):
        raise ValueError("an entry needs at least one destination, site numbers below 64")
    wide_indexes = len(masks) > 256
    wide_sizes = int(sizes.max()) > 0xFFFF
    out = bytearray((VERSION, int(kind), wide_indexes * _WIDE_INDEXES | wide_sizes * _WIDE_SIZES))
    _varint(cycle, out)
    out.append(len(name))
    out += name
    _varint(count, out)
    _varint(len(masks), out)
    out += np.asarray(masks, dtype=_U64).tobytes()
    out += mask_indexes.astype(_NARROW[wide_indexes]).tobytes()
    out += sizes.astype(_SIZE_WIDTHS[wide_sizes]).tobytes()
    out += payloads
    return bytes(out)


def _header(data: memoryview) -> tuple[int, EntryKind, int, str, int, int, int]:
    """version, kind, flags, client, cycle, count, and where the rest starts."""
    if len(data) < 2 or data[0] not in (1, 2):
        raise MalformedRecord("not a send-queue record of version 1 or 2")
    version = data[0]
    try:
        kind = EntryKind(data[1])
    except ValueError:
        raise MalformedRecord(f"unknown entry kind {data[1]}") from None
    flags = 0
    at = 2
    if version == 2:
        if len(data) < 3 or data[2] & ~(_WIDE_INDEXES | _WIDE_SIZES):
            raise MalformedRecord("a version 2 record with unknown flags")
        flags = data[2]
        at = 3
    cycle, at = _read_varint(data, at)
    if at >= len(data):
        raise MalformedRecord("the record ends before its client name")
    length = data[at]
    client_bytes = bytes(data[at + 1 : at + 1 + length])
    if len(client_bytes) != length:
        raise MalformedRecord("the record ends inside its client name")
    count, at = _read_varint(data, at + 1 + length)
    if not 1 <= count <= MAX_ENTRIES:
        raise MalformedRecord(f"a record holds 1-{MAX_ENTRIES} entries, this one says {count}")
    return version, kind, flags, client_bytes.decode(errors="replace"), cycle, count, at


def columns(value: bytes | memoryview) -> RecordColumns:
    """The record's columns (either version); ``MalformedRecord`` if it does not decode."""
    data = memoryview(value)
    version, kind, flags, client, cycle, count, at = _header(data)
    if version == 1:
        return _columns_v1(data, kind, client, cycle, count, at)
    distinct, at = _read_varint(data, at)
    if not 1 <= distinct <= count:
        raise MalformedRecord(f"{distinct} distinct masks for {count} entries")
    index_type = _NARROW[bool(flags & _WIDE_INDEXES)]
    size_type = _SIZE_WIDTHS[bool(flags & _WIDE_SIZES)]
    payloads_at = at + 8 * distinct + (index_type.itemsize + size_type.itemsize) * count
    if payloads_at > len(data):
        raise MalformedRecord("the record ends inside its columns")
    masks = np.frombuffer(data, dtype=_U64, count=distinct, offset=at).astype(np.uint64)
    at += 8 * distinct
    indexes = np.frombuffer(data, dtype=index_type, count=count, offset=at).astype(np.int64)
    at += index_type.itemsize * count
    sizes = np.frombuffer(data, dtype=size_type, count=count, offset=at).astype(np.int64)
    if int(indexes.max()) >= distinct:
        raise MalformedRecord("an entry's mask index points past the mask table")
    if payloads_at + int(sizes.sum()) != len(data):
        raise MalformedRecord("the payloads do not fill the record to its end")
    payloads = bytes(data[payloads_at:])
    return RecordColumns(kind, client, cycle, masks, indexes, sizes, payloads)


def _columns_v1(
    data: memoryview, kind: EntryKind, client: str, cycle: int, count: int, at: int
) -> RecordColumns:
    """A version 1 record, entry by entry (records written before version 2)."""
    table: dict[int, int] = {}
    indexes: list[int] = []
    sizes: list[int] = []
    parts: list[bytes] = []
    for _ in range(count):
        mask, at = _read_varint(data, at)
        length, at = _read_varint(data, at)
        if at + length > len(data):
            raise MalformedRecord("an entry's payload runs past the record")
        indexes.append(table.setdefault(mask, len(table)))
        sizes.append(length)
        parts.append(data[at : at + length].tobytes())
        at += length
    if at != len(data):
        raise MalformedRecord("bytes left after the last entry")
    return RecordColumns(
        kind,
        client,
        cycle,
        np.fromiter(table, dtype=np.uint64, count=len(table)),
        np.asarray(indexes, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        b"".join(parts),
    )


def decode(value: bytes | memoryview) -> RoutingRecord:
    return columns(value).record()


def site_counts(value: bytes | memoryview) -> dict[int, int]:
    """Site number -> how many of the record's entries are for it (what the tag index keeps)."""
    return columns(value).site_counts()


def count_sites(mask: int, counts: dict[int, int]) -> None:
    """Add one to ``counts`` for every site number set in ``mask``."""
    for number in _numbers(mask):
        counts[number] = counts.get(number, 0) + 1


def _numbers(mask: int) -> list[int]:
    """The site numbers set in a destination mask."""
    return [number for number in range(mask.bit_length()) if mask >> number & 1]


def routed_for(
    value: bytes | memoryview, offset: int, site_number: int, first: int | None = None
) -> list[RoutedEntry]:
    """The entries of the record at ``offset`` for one site, as they travel (its first entry
    at position ``first``, by default not lifted)."""
    return list(columns(value).for_site(offset, site_number, first))
