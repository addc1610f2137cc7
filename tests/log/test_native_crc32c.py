"""tidelog's native CRC-32C pass (``tidelog._crc32c`` through ``tidelog.log.crcs``): both of its
paths, the CPU's crc32 instruction and the portable table pass, compute exactly what the
``crc32c`` package computes for any ranges of any buffer (empty ones, unaligned starts, lengths
0..300); stamping writes every record's checksum of its bytes [4, size) into its CRC field; and
nothing outside a buffer is ever read or written: bad ranges, lengths and array types raise."""

from __future__ import annotations

import mmap
import platform
import random
import struct
import threading
from array import array
from pathlib import Path

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import _crc32c
from tidelog.log.crcs import hardware, record_crcs, stamp_crcs

PATHS = [False, True]
"""``portable``: the hardware path (where the CPU has one), then the table pass forced."""


def as_kind(data: bytes, kind: str) -> object:
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(b"!" + data)[1:]  # a view that does not start at its object's start
    if kind == "numpy":
        return np.frombuffer(data, dtype=np.uint8)
    return data


@settings(deadline=None, max_examples=300)
@given(
    st.binary(max_size=700),
    st.lists(st.tuples(st.integers(0, 700), st.integers(0, 300)), max_size=40),
    st.sampled_from(PATHS),
    st.sampled_from(["bytes", "bytearray", "memoryview", "numpy"]),
)
def test_every_range_gets_what_the_crc32c_package_computes(
    data: bytes, ranges: list[tuple[int, int]], portable: bool, kind: str
) -> None:
    spans = [
        (min(a, len(data)), min(a, len(data)) + min(n, len(data) - min(a, len(data))))
        for a, n in ranges
    ]
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    ends = np.array([b for _, b in spans], dtype=np.int64)
    got = record_crcs(as_kind(data, kind), starts, ends, portable=portable)  # type: ignore[arg-type]
    assert got.dtype == np.uint32
    assert got.tolist() == [crc32c(data[a:b]) for a, b in spans]


@pytest.mark.parametrize("portable", PATHS)
def test_every_length_and_alignment_up_to_300_bytes(portable: bool) -> None:
    data = random.Random(3).randbytes(320)
    spans = [(a, a + n) for a in range(9) for n in range(301)]
    starts = array("q", [a for a, _ in spans])
    ends = array("q", [b for _, b in spans])
    got = record_crcs(data, starts, ends, portable=portable)
    assert got.tolist() == [crc32c(data[a:b]) for a, b in spans]


@settings(deadline=None)
@given(
    st.lists(st.binary(min_size=4, max_size=300), max_size=30),
    st.integers(0, 7),
    st.sampled_from(PATHS),
)
def test_stamping_writes_each_records_crc_of_its_bytes_from_4(
    records: list[bytes], lead: int, portable: bool
) -> None:
    data = bytearray(lead) + bytearray(b"".join(records))
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    positions = lead + np.cumsum(sizes) - sizes
    stamp_crcs(data, positions, sizes, portable=portable)
    assert data[:lead] == bytes(lead)
    for record, at in zip(records, positions.tolist(), strict=True):
        assert int.from_bytes(data[at : at + 4], "little") == crc32c(record[4:])
        assert data[at + 4 : at + len(record)] == record[4:]


def test_a_large_pass_releases_the_gil_and_stays_exact() -> None:
    """Over 64 KiB the pass runs without the GIL: two threads at once still get it right."""
    rng = random.Random(5)
    data = rng.randbytes(1 << 20)
    ends = np.sort(np.array([rng.randrange(len(data)) for _ in range(2000)], dtype=np.int64))
    starts = ends // 2
    want = [crc32c(data[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    results: list[list[int]] = []

    def run() -> None:
        for _ in range(5):
            results.append(record_crcs(data, starts, ends).tolist())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [want] * 10


def test_an_mmap_is_a_buffer_like_any_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "segment"
    path.write_bytes(b"tidelog" * 1000)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        got = record_crcs(mapped, np.array([0, 7], dtype=np.int64), np.array([7000, 7000]))
    assert got.tolist() == [crc32c(b"tidelog" * 1000), crc32c(b"tidelog" * 999)]


def test_the_cpus_instruction_is_used_where_there_is_one() -> None:
    cpu = Path("/proc/cpuinfo").read_text() if platform.system() == "Linux" else ""
    if platform.machine() == "x86_64" and " sse4_2" in cpu:
        assert hardware()
    assert _crc32c.hardware() is hardware()


ONE = np.array([0], dtype=np.int64)


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize(
    ("start", "end"),
    [(-1, 3), (0, 11), (5, 4), (10, 11), (11, 11), (2**62, 2**62 + 1), (-(2**63), 0)],
)
def test_a_range_outside_the_buffer_raises_and_nothing_is_read(
    start: int, end: int, portable: bool
) -> None:
    starts = np.array([0, start], dtype=np.int64)
    ends = np.array([4, end], dtype=np.int64)
    out = np.zeros(2, dtype=np.uint32)
    with pytest.raises(ValueError, match=r"range 1, .* buffer of 10 bytes"):
        _crc32c.crc32c_ranges(bytes(10), starts, ends, out, portable=portable)
    assert out[0] == crc32c(bytes(4))  # the ranges before the bad one are done


@pytest.mark.parametrize(
    ("position", "size"), [(-1, 8), (0, 3), (0, 11), (8, 4), (10, 4), (2**62, 8), (4, 2**63 - 1)]
)
def test_a_record_outside_the_buffer_or_without_a_crc_field_raises(
    position: int, size: int
) -> None:
    data = bytearray(10)
    with pytest.raises(ValueError, match=r"record 0, .* buffer of 10 bytes"):
        stamp_crcs(data, np.array([position], dtype=np.int64), np.array([size], dtype=np.int64))
    assert data == bytearray(10)


def test_arrays_of_the_wrong_type_shape_or_length_raise() -> None:
    data = bytes(64)
    eight = np.arange(8, dtype=np.int64)
    out = np.empty(8, dtype=np.uint32)
    ranges = _crc32c.crc32c_ranges
    with pytest.raises(TypeError, match=r"starts must be .* int64"):
        ranges(data, eight.astype(np.int32), eight, out)
    with pytest.raises(TypeError, match=r"ends must be .* int64"):
        ranges(data, eight, eight.astype(np.float64), out)
    with pytest.raises(TypeError, match=r"ends must be .* int64"):
        ranges(data, eight, eight.reshape(2, 4), out)
    with pytest.raises(TypeError, match=r"out must be .* uint32"):
        ranges(data, eight, eight, out.astype(np.int64))
    with pytest.raises(ValueError, match="not C-contiguous"):
        ranges(data, np.arange(16, dtype=np.int64)[::2], eight, out)
    with pytest.raises(ValueError, match="8 starts but 7 ends"):
        ranges(data, eight, eight[:7], out)
    with pytest.raises(ValueError, match="out holds 7 items for 8 ranges"):
        ranges(data, eight, eight, out[:7])
    with pytest.raises(ValueError, match="read-only"):
        ranges(data, eight, eight, np.frombuffer(bytes(32), dtype=np.uint32))
    with pytest.raises(TypeError):
        ranges("not bytes", eight, eight, out)
    with pytest.raises(BufferError):
        stamp_crcs(bytes(64), ONE, ONE + 8)  # bytes are immutable
    with pytest.raises(TypeError, match="bytes-like object is required, not 'list'"):
        stamp_crcs(bytearray(64), ONE, [8])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sizes must be .* int64"):
        stamp_crcs(bytearray(64), ONE, array("i", [8]))
    with pytest.raises(ValueError, match="1 positions but 2 sizes"):
        stamp_crcs(bytearray(64), ONE, np.array([8, 8], dtype=np.int64))


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("bad", [0, 1, 2, 3, 4])
def test_the_ranges_before_a_bad_one_are_done_inside_a_group_of_three(
    bad: int, portable: bool
) -> None:
    """Ranges are checked in groups of three (the hardware path computes three at once): those
    before the bad one are still written, those after it are not."""
    data = random.Random(5).randbytes(100)
    starts = np.array([0, 10, 20, 30, 40], dtype=np.int64)
    ends = starts + 50
    ends[bad] = 101
    out = np.zeros(5, dtype=np.uint32)
    with pytest.raises(ValueError, match=rf"range {bad}, "):
        _crc32c.crc32c_ranges(data, starts, ends, out, portable=portable)
    assert out[:bad].tolist() == [crc32c(data[a : a + 50]) for a in starts[:bad].tolist()]
    assert not out[bad:].any()


def first_disagreement(
    data: bytes, positions: list[int], sizes: list[int], offsets: list[int], stamps: list[int]
) -> tuple[int, int]:
    """``check_records`` written out record by record: (1, i) for the first entry outside the
    buffer (all looked at first), (2, i) for the first record that disagrees, else (0, -1)."""
    for i, (at, size) in enumerate(zip(positions, sizes, strict=True)):
        if at < 0 or size < 36 or at + size > len(data):
            return 1, i
    for i, (at, size) in enumerate(zip(positions, sizes, strict=True)):
        crc, stored_size, offset, stamp = struct.unpack_from("<IIqq", data, at)
        if (crc, stored_size, offset, stamp) != (
            crc32c(data[at + 4 : at + size]),
            size,
            offsets[i],
            stamps[i],
        ):
            return 2, i
    return 0, -1


@settings(deadline=None, max_examples=300)
@given(
    st.lists(st.integers(0, 90), min_size=0, max_size=12),
    st.lists(
        st.tuples(st.sampled_from(["byte", "size", "offset", "stamp"]), st.integers(0, 10**6))
    ),
    st.sampled_from(PATHS),
)
def test_check_records_names_the_first_record_that_disagrees(
    lengths: list[int], damage: list[tuple[str, int]], portable: bool
) -> None:
    """Records of any lengths, any damage to their bytes or to their index entries: the native
    check answers what a record-by-record check answers."""
    blob = bytearray()
    positions, sizes, offsets, stamps = [], [], [], []
    for i, length in enumerate(lengths):
        body = bytes([i]) * length
        record = struct.pack("<Iqq", 36 + length, 100 + i, 7_000 + i) + bytes(12) + body
        positions.append(len(blob))
        sizes.append(4 + len(record))
        offsets.append(100 + i)
        stamps.append(7_000 + i)
        blob += struct.pack("<I", crc32c(record)) + record
    for kind, at in damage:
        if not positions:
            break
        i = at % len(positions)
        if kind == "byte":
            blob[at % len(blob)] ^= 1 << (at % 8)
        elif kind == "size":
            sizes[i] += at % 5 - 2
        elif kind == "offset":
            offsets[i] += 1
        else:
            stamps[i] -= 1
    data = bytes(blob)
    if not damage:
        assert len(data) == sum(36 + n for n in lengths)
    arrays = [np.array(column, dtype=np.int64) for column in (positions, sizes, offsets, stamps)]
    assert _crc32c.check_records(data, *arrays, portable=portable) == first_disagreement(
        data, positions, sizes, offsets, stamps
    )


def test_check_records_takes_strided_offsets_and_timestamps() -> None:
    """The index's columns are fields of a structured array: read with their stride."""
    record = struct.pack("<Iqq", 36, 5, 9) + bytes(12)
    data = struct.pack("<I", crc32c(record)) + record
    index = np.zeros(1, dtype=[("rel", "<u4"), ("timestamp", "<i8"), ("offset", "<i8")])
    index["timestamp"], index["offset"] = 9, 5
    one, size = np.zeros(1, dtype=np.int64), np.array([36], dtype=np.int64)
    assert _crc32c.check_records(data, one, size, index["offset"], index["timestamp"]) == (0, -1)
    index["timestamp"] = 8
    assert _crc32c.check_records(data, one, size, index["offset"], index["timestamp"]) == (2, 0)
    with pytest.raises(ValueError, match="2 timestamps for 1 records"):
        _crc32c.check_records(data, one, size, index["offset"], np.zeros(2, dtype=np.int64))
    with pytest.raises(TypeError, match="offsets must be a one-dimensional array of int64"):
        _crc32c.check_records(data, one, size, index["rel"], index["timestamp"])
