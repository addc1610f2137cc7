"""One segment: its files, append and pread, lookups by offset and time, truncation, sealing."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tidelog.durable import faults
from tidelog.errors import DiskFull
from tidelog.log import NewRecord
from tidelog.log.filecache import FileCache
from tidelog.log.index import ENTRY_SIZE, read_index_file
from tidelog.log.record import encode_batch
from tidelog.log.segment import Segment, index_path, log_path, segment_name

PREALLOCATE = 1280
CACHE = FileCache(12)


def batch(offsets, timestamp, values=None):
    offsets = np.asarray(offsets, dtype=np.int64)
    if values is None:
        values = [f"value-{o}".encode() for o in offsets.tolist()]
    return encode_batch(values, offsets, timestamp, 1 << 20)


@pytest.fixture
def segment(tmp_path):
    seg = Segment.create(tmp_path, 100, preallocate_bytes=PREALLOCATE, cache=CACHE)
    yield seg
    seg.close()


def test_names_are_zero_padded_base_offsets(tmp_path):
    assert segment_name(42) == "00000000000000000042"
    assert log_path(tmp_path, 42) == tmp_path / "00000000000000000042.log"
    assert index_path(tmp_path, 42) == tmp_path / "00000000000000000042.index"


def test_an_empty_segment(segment):
    assert segment.count == 0 and segment.size == 0
    assert segment.oldest_offset == 100 and segment.newest_offset == 99
    assert segment.oldest_timestamp is None and segment.newest_timestamp is None
    assert segment.slot_at_or_after(0) == 0 and segment.slot_at_or_before(10**6) == -1
    assert segment.log_path.exists() and segment.index_path.exists()


def test_append_writes_records_back_to_back_and_indexes_them(segment):
    first = batch([100, 101, 102], 1_000)
    second = batch([103], 2_000, [NewRecord(b"v", key=b"k", headers={"h": b"x"})])
    segment.append(first)
    segment.append(second)
    data = bytes(first.data) + bytes(second.data)
    assert segment.size == len(data) == segment.log_path.stat().st_size
    assert segment.read(0, len(data)) == data
    entries = segment.entries(0, segment.count)
    assert entries["rel"].tolist() == [0, 1, 2, 3]
    assert entries["timestamp"].tolist() == [1_000, 1_000, 1_000, 2_000]
    sizes = first.sizes.tolist() + second.sizes.tolist()
    assert entries["size"].tolist() == sizes
    assert entries["position"].tolist() == [0, sizes[0], sizes[0] + sizes[1], sum(sizes[:3])]
    assert segment.offsets_of(entries).tolist() == [100, 101, 102, 103]
    assert (segment.oldest_offset, segment.newest_offset) == (100, 103)
    assert (segment.oldest_timestamp, segment.newest_timestamp) == (1_000, 2_000)


def test_read_past_the_end_is_short(segment):
    segment.append(batch([100], 1))
    assert segment.read(segment.size - 3, 100) == segment.read(0, segment.size)[-3:]


def test_offset_lookups_over_gaps(segment):
    segment.append(batch([100, 101, 105, 106, 120], 10))
    assert [segment.slot_at_or_after(o) for o in (0, 100, 101, 102, 105, 107, 120, 121)] == [
        0,
        0,
        1,
        2,
        2,
        4,
        4,
        5,
    ]
    assert [segment.slot_at_or_before(o) for o in (99, 100, 101, 104, 105, 119, 120, 500)] == [
        -1,
        0,
        1,
        1,
        2,
        3,
        4,
        4,
    ]


def test_timestamp_lookups_with_repeated_timestamps(segment):
    segment.append(batch([100, 101], 10))
    segment.append(batch([102, 103, 104], 20))
    segment.append(batch([105], 40))
    assert [segment.slot_at_or_after_timestamp(t) for t in (0, 10, 11, 20, 21, 40, 41)] == [
        0,
        0,
        2,
        2,
        5,
        5,
        6,
    ]
    assert [segment.slot_at_or_before_timestamp(t) for t in (9, 10, 19, 20, 39, 40, 99)] == [
        -1,
        1,
        1,
        4,
        4,
        5,
        5,
    ]


def test_truncate_drops_records_from_file_and_index(segment):
    segment.append(batch([100, 101, 102, 103], 10))
    keep = int(segment.entries(0, 4)["position"][2])
    segment.truncate(2)
    assert segment.count == 2 and segment.size == keep == segment.log_path.stat().st_size
    assert segment.newest_offset == 101
    segment.truncate(5)  # nothing at or after slot 5: no change
    assert segment.count == 2
    segment.append(batch([104], 11))
    assert segment.offsets_of(segment.entries(0, 3)).tolist() == [100, 101, 104]


def test_seal_trims_the_index(segment):
    segment.append(batch([100, 101], 10))
    segment.seal()
    assert not segment.active
    assert segment.index_path.stat().st_size == 2 * ENTRY_SIZE
    assert segment.offsets_of(segment.entries(0, 2)).tolist() == [100, 101]


def test_a_sealed_segment_stops_accepting_appends(segment):
    """``seal()`` promises "stop accepting appends": whether a later append raises or is
    ignored, the sealed files and entries must not change."""
    segment.append(batch([100, 101], 10))
    segment.seal()
    log_size, index_size = segment.log_path.stat().st_size, segment.index_path.stat().st_size
    with contextlib.suppress(Exception):
        segment.append(batch([102], 11))
    assert segment.count == 2
    assert segment.log_path.stat().st_size == log_size
    assert segment.index_path.stat().st_size == index_size


def test_a_sealed_segment_reopens_read_only(segment, tmp_path):
    segment.append(batch([100, 101, 102], 10))
    data = segment.read(0, segment.size)
    size = segment.size
    segment.seal()
    segment.close()
    reopened = Segment(
        tmp_path, 100, count=3, size=size, active=False, preallocate_bytes=PREALLOCATE, cache=CACHE
    )
    try:
        assert reopened.read(0, size) == data
        assert reopened.offsets_of(reopened.entries(0, 3)).tolist() == [100, 101, 102]
    finally:
        reopened.close()


@pytest.mark.parametrize("where", [".log", ".index"])
@pytest.mark.parametrize("keep", [None, 0, 7, 25])
def test_a_failed_write_is_undone(segment, where, keep):
    """Whichever file the write fails in, and however much of it was stored first."""
    segment.append(batch([100], 10))
    size_before = segment.size
    index_before = bytes(segment.entries(0, 1))
    faults.fail(where, keep=keep)
    try:
        with pytest.raises(DiskFull, match="disk space"):
            segment.append(batch([101, 102], 11))
        assert faults.hits, "the fault was never reached"
    finally:
        faults.clear()

    assert segment.size == size_before == segment.log_path.stat().st_size
    assert segment.count == 1 and bytes(segment.entries(0, 1)) == index_before
    assert not read_index_file(segment.index_path)[1:].tobytes().strip(b"\0")  # no stray entry
    segment.append(batch([101], 12))
    assert segment.offsets_of(segment.entries(0, 2)).tolist() == [100, 101]
    assert segment.entries(0, 2)["position"].tolist() == [0, size_before]
    assert segment.read(size_before, 10)[:10] == bytes(batch([101], 12).data)[:10]


def test_delete_removes_both_files(segment):
    segment.append(batch([100], 10))
    segment.delete()
    assert not segment.log_path.exists() and not segment.index_path.exists()
