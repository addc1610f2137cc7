"""The send queue's record format and the tag index (``tidelog/sites/envelope.py``,
``tag_index.py``), by example and by hypothesis."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.sites.envelope import (
    MAX_ENTRIES,
    VERSION,
    Entry,
    EntryKind,
    MalformedRecord,
    RoutedEntry,
    RoutingRecord,
    columns,
    count_sites,
    decode,
    encode,
    mask_of,
    position,
    routed_for,
    site_counts,
    split_position,
)
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import decode as decode_index
from tidelog.sites.tag_index_file import encode as encode_index

masks = st.integers(1, (1 << 64) - 1)
entries = st.builds(Entry, masks, st.binary(max_size=300))
records = st.builds(
    RoutingRecord,
    st.sampled_from(EntryKind),
    st.text(min_size=1, max_size=60).filter(lambda c: len(c.encode()) <= 255),
    st.integers(0, 2**40),
    st.lists(entries, min_size=1, max_size=30).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_a_record_round_trips(record: RoutingRecord) -> None:
    value = encode(record)
    assert decode(value) == record
    assert site_counts(value) == _counts(record)
    for site in (0, 1, 7, 63):
        expected = [
            RoutedEntry(position(5, i), record.client, e.payload)
            for i, e in enumerate(record.entries)
            if e.destinations >> site & 1
        ]
        assert routed_for(value, 5, site) == expected


def _counts(record: RoutingRecord) -> dict[int, int]:
    """Site number -> entries of the record for it, counted bit by bit."""
    counts: dict[int, int] = {}
    for entry in record.entries:
        for site in range(64):
            if entry.destinations >> site & 1:
                counts[site] = counts.get(site, 0) + 1
    return counts


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_a_damaged_record_is_refused_as_malformed(
    record: RoutingRecord, data: st.DataObject
) -> None:
    value = encode(record)
    cut = data.draw(st.integers(0, len(value) - 1))
    with contextlib.suppress(MalformedRecord):  # the only failure allowed, never IndexError
        decode(value[:cut])
    with pytest.raises(MalformedRecord):
        decode(value + b"\x00")


def test_payload_bytes_are_stored_once_whatever_the_destinations() -> None:
    payload = b"x" * 100
    one = encode(RoutingRecord(EntryKind.DELTA, "app", 0, (Entry(mask_of([0]), payload),)))
    many = encode(RoutingRecord(EntryKind.DELTA, "app", 0, (Entry(mask_of(range(8)), payload),)))
    assert len(many) == len(one)  # a mask is 8 bytes whatever its sites; no second payload
    batch = encode(
        RoutingRecord(EntryKind.DELTA, "app", 0, tuple(Entry(0b11, payload) for _ in range(100)))
    )
    assert len(batch) / (100 * len(payload)) < 1.04


def test_bad_records_are_refused_when_written() -> None:
    with pytest.raises(ValueError, match="client name"):
        encode(RoutingRecord(EntryKind.DELTA, "", 0, (Entry(1, b""),)))
    with pytest.raises(ValueError, match="at least one destination"):
        encode(RoutingRecord(EntryKind.DELTA, "a", 0, (Entry(0, b""),)))
    with pytest.raises(ValueError, match="entries"):
        encode(RoutingRecord(EntryKind.DELTA, "a", 0, ()))
    with pytest.raises(ValueError, match="site number"):
        mask_of([64])


def test_positions_order_entries_as_the_queue_does() -> None:
    assert position(7, MAX_ENTRIES - 1) < position(8, 0)
    assert split_position(position(123, 45)) == (123, 45)
    with pytest.raises(ValueError):
        position(1, MAX_ENTRIES)


# -- version 1 records (written before the columnar version 2) ---------------------------------


def _varint_v1(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


def encode_version_1(record: RoutingRecord) -> bytes:
    """Version 1 bytes, written here from the format's table (docs/format.md), not by the
    module: the record a data directory from before version 2 holds."""
    client = record.client.encode()
    out = bytes((1, int(record.kind))) + _varint_v1(record.cycle) + bytes((len(client),)) + client
    out += _varint_v1(len(record.entries))
    for entry in record.entries:
        out += _varint_v1(entry.destinations) + _varint_v1(len(entry.payload)) + entry.payload
    return out


@settings(max_examples=300, deadline=None)
@given(records)
def test_a_version_1_record_still_decodes_as_it_was_written(record: RoutingRecord) -> None:
    old = encode_version_1(record)
    assert decode(old) == record
    assert site_counts(old) == _counts(record)
    for site in (0, 1, 63):
        assert routed_for(old, 9, site) == routed_for(encode(record), 9, site)


def test_version_1_bytes_by_example() -> None:
    # kind DELTA, cycle 0, client "ab", 2 entries: mask 0b11 "xyz", mask 0b100 "".
    old = b"\x01\x00\x00\x02ab\x02\x03\x03xyz\x04\x00"
    assert decode(old) == RoutingRecord(
        EntryKind.DELTA, "ab", 0, (Entry(0b11, b"xyz"), Entry(0b100, b""))
    )
    with pytest.raises(MalformedRecord):
        decode(old[:-1])


def test_version_2_bytes_by_example() -> None:
    value = encode(RoutingRecord(EntryKind.DELTA, "ab", 5, (Entry(3, b"xyz"), Entry(3, b"q"))))
    assert VERSION == 2
    assert value == (
        b"\x02\x00\x00"  # version, kind, flags (u8 mask indexes, u16 sizes)
        + b"\x05\x02ab\x02\x01"  # cycle, client, count, one distinct mask
        + (3).to_bytes(8, "little")  # the mask table
        + b"\x00\x00"  # each entry's mask index
        + b"\x03\x00\x01\x00"  # sizes
        + b"xyzq"
    )


def test_wide_columns_are_used_only_when_needed() -> None:
    many_masks = tuple(Entry(mask, b"p") for mask in range(1, 400))
    big = (Entry(1, b"x" * 70_000), Entry(2, b""))
    for entries, flags in ((many_masks, 0x01), (big, 0x02)):
        record = RoutingRecord(EntryKind.SNAPSHOT_ENTRY, "app", 1, entries)
        value = encode(record)
        assert value[2] == flags
        assert decode(value) == record
        assert columns(value).site_counts() == _counts(record)


def test_unknown_flags_and_bad_mask_indexes_are_malformed() -> None:
    value = bytearray(encode(RoutingRecord(EntryKind.DELTA, "a", 0, (Entry(1, b"v"),))))
    with pytest.raises(MalformedRecord, match="flags"):
        decode(bytes(value[:2]) + b"\x80" + bytes(value[3:]))
    at = value.index(b"\x01\x00\x00\x00\x00\x00\x00\x00") + 8  # past the mask table
    value[at] = 1  # the only entry points at a second mask that is not there
    with pytest.raises(MalformedRecord, match="mask index"):
        decode(bytes(value))


# -- the tag index ---------------------------------------------------------------------------------


def one_each(mask: int) -> dict[int, int]:
    """One entry for every site set in ``mask``."""
    counts: dict[int, int] = {}
    count_sites(mask, counts)
    return counts


def test_a_site_reads_only_its_records() -> None:
    index = TagIndex()
    for offset, mask in enumerate([0b01, 0b10, 0b11, 0b01, 0b100]):
        index.add(offset, one_each(mask))
    assert index.records_for(0, 0, 10) == [0, 2, 3]
    assert index.records_for(1, 0, 10) == [1, 2]
    assert index.records_for(0, 1, 1) == [2]
    assert index.entries_for(0, 3) == 1 and index.entries_for(5, 0) == 0
    with pytest.raises(ValueError, match="not after"):
        index.add(4, {0: 1})
    with pytest.raises(ValueError, match="at least one destination"):
        index.add(9, {})


def test_entries_per_site_are_counted_for_lag() -> None:
    index = TagIndex()
    index.add(0, {0: 3, 1: 1})
    index.add(2, {1: 5})
    index.add(5, {0: 2})
    assert [index.entries_for(0, at) for at in (0, 1, 5, 6)] == [5, 2, 2, 0]
    assert [index.entries_for(1, at) for at in (0, 1, 3)] == [6, 5, 0]
    index.trim(2)
    assert (index.entries_for(0, 0), index.entries_for(1, 0)) == (2, 5)
    restored = TagIndex.restore(index.snapshot())
    assert (restored.entries_for(0, 0), restored.entries_for(1, 0)) == (2, 5)


def test_trim_and_forget() -> None:
    index = TagIndex()
    for offset in range(10):
        index.add(offset, one_each(0b11 if offset % 2 else 0b01))
    index.trim(6)
    assert index.records_for(0, 0, 100) == [6, 7, 8, 9]
    assert index.records_for(1, 0, 100) == [7, 9]
    # The trim compacted the lists (over half dead): the trimmed entries no longer count.
    assert (index.entries_for(0, 0), index.entries_for(1, 0)) == (4, 2)
    index.forget_site(1)
    assert index.records_for(1, 0, 100) == [] and index.entries_for(1, 0) == 0
    assert index.records_for(0, 0, 100) == [6, 7, 8, 9]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), masks), max_size=60), st.data())
def test_snapshot_plus_the_records_after_it_rebuilds_the_same_index(
    steps: list[tuple[int, int]], data: st.DataObject
) -> None:
    offsets, offset = [], -1
    for gap, mask in steps:
        offset += gap
        offsets.append((offset, mask))
    cut = data.draw(st.integers(0, len(offsets)))
    trim_at = data.draw(st.integers(0, offset + 1 if offsets else 0))
    whole, part = TagIndex(), TagIndex()
    for at, mask in offsets[:cut]:
        whole.add(at, one_each(mask))
        part.add(at, one_each(mask))
    whole.trim(trim_at)
    part.trim(trim_at)
    restored = TagIndex.restore(part.snapshot())
    from_file, _ = decode_index(encode_index(part, dict.fromkeys(range(64), 0)))
    for at, mask in offsets[cut:]:
        whole.add(at, one_each(mask))
        restored.add(at, one_each(mask))
        from_file.add(at, one_each(mask))
    for site in range(64):
        for index in (restored, from_file):
            assert index.records_for(site, 0, 10**6) == whole.records_for(site, 0, 10**6)
            assert index.entries_for(site, 0) == whole.entries_for(site, 0)
    assert restored.covers == from_file.covers == whole.covers
    for site in range(64):  # and the index counts exactly the entries not trimmed
        kept = [(at, mask) for at, mask in offsets[:cut] if at >= trim_at] + offsets[cut:]
        assert whole.entries_for(site, 0) == sum(one_each(m).get(site, 0) for _, m in kept)
