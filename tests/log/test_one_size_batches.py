"""Batches of plain ``bytes`` values of one size (``record_layout.encode_one_size``, the append
path of the log benchmark): the records are byte for byte those of a record-by-record reference
encoding (so each stores ``crc32c`` of its bytes [4, size)), they read back equal through the log
after a reopen, and batches that only look like one size (a value of another length or type in
the middle) are encoded as the reference too."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.log import SegmentedLog, record_layout
from tidelog.log.record import CONTINUES, MAGIC, encode_batch, scan_records

LIMIT = 1 << 20
TAIL = struct.Struct("<IqqBBHii")


def reference(values: list[bytes], offsets: list[int], timestamp: int, atomic: bool) -> bytes:
    """The records as the format describes them, one at a time with ``struct``."""
    out = bytearray()
    for i, (value, offset) in enumerate(zip(values, offsets, strict=True)):
        attrs = CONTINUES if atomic and i < len(values) - 1 else 0
        tail = TAIL.pack(36 + len(value), offset, timestamp, MAGIC, attrs, 0, -1, len(value))
        out += struct.pack("<I", crc32c(tail + value)) + tail + value
    return bytes(out)


def increasing(first: int, gaps: list[int]) -> list[int]:
    offsets = [first]
    for gap in gaps:
        offsets.append(offsets[-1] + gap)
    return offsets


one_size = st.integers(min_value=17, max_value=200).flatmap(
    lambda n: st.tuples(
        st.integers(min_value=0, max_value=300).flatmap(
            lambda size: st.lists(st.binary(min_size=size, max_size=size), min_size=n, max_size=n)
        ),
        st.integers(min_value=0, max_value=(1 << 62)),
        st.lists(
            st.sampled_from([1, 1, 1, 2, 255, 256, 65_537, 1 << 33]), min_size=n - 1, max_size=n - 1
        ),
    )
)


@settings(max_examples=150, deadline=None)
@given(
    batch=one_size,
    timestamp=st.integers(min_value=0, max_value=(1 << 63) - 1),
    atomic=st.booleans(),
)
def test_one_size_batches_are_the_reference_records(
    batch: tuple[list[bytes], int, list[int]], timestamp: int, atomic: bool
) -> None:
    values, first, gaps = batch
    offsets = increasing(first, gaps)
    assert record_layout.one_size(values) == len(values[0])  # the path under test
    encoded = encode_batch(
        values, np.array(offsets, dtype=np.int64), timestamp, LIMIT, atomic=atomic
    )
    assert encoded.data.tobytes() == reference(values, offsets, timestamp, atomic)
    assert encoded.sizes.tolist() == [36 + len(values[0])] * len(values)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.binary(min_size=0, max_size=40), min_size=17, max_size=80),
    middle=st.sampled_from(["longer", "bytearray", "subclass", "memoryview"]),
    atomic=st.booleans(),
)
def test_batches_that_only_look_one_size(values: list[bytes], middle: str, atomic: bool) -> None:
    size = len(values[0])
    values = [v[:size].ljust(size, b"-") for v in values]
    at = len(values) // 2
    mixed: list[object] = list(values)

    class Bytes(bytes):
        pass

    if middle == "longer":
        values[at] += b"!"
        mixed[at] = values[at]
    elif middle == "bytearray":
        mixed[at] = bytearray(values[at])
    elif middle == "subclass":
        mixed[at] = Bytes(values[at])
    else:
        mixed[at] = memoryview(values[at])
    assert record_layout.one_size(mixed) == -1
    offsets = list(range(5, 5 + len(values)))
    encoded = encode_batch(
        mixed,  # type: ignore[arg-type]
        np.array(offsets, dtype=np.int64),
        9,
        LIMIT,
        atomic=atomic,
    )
    assert encoded.data.tobytes() == reference(values, offsets, 9, atomic)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=6),
    count=st.integers(min_value=17, max_value=120),
    gap=st.integers(min_value=1, max_value=1_000),
    seed=st.integers(min_value=0, max_value=1 << 30),
)
def test_one_size_batches_read_back_equal_after_reopen(
    sizes: list[int], count: int, gap: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    written: list[tuple[int, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="tidelog-one-size-") as root:
        log = SegmentedLog(Path(root) / "log")
        try:
            for i, size in enumerate(sizes):
                values = [rng.bytes(size) for _ in range(count)]
                if i % 2:  # replicas and compaction choose offsets, with gaps
                    first = log.next_offset + gap
                    chosen = list(range(first, first + gap * count, gap))
                    log.append_at(values, chosen)
                else:
                    chosen = list(log.append(values))
                written += zip(chosen, values, strict=True)
            log.close()
            for path in sorted((Path(root) / "log").glob("*.log")):
                data = path.read_bytes()  # every stored record passes its CRC and framing checks
                assert scan_records(data, 0, -1, 0)[1] == len(data)
            log = SegmentedLog(Path(root) / "log")
            assert log.next_offset == written[-1][0] + 1
            read: list[tuple[int, bytes]] = []
            for batch in log.forward_reader(0):  # every record CRC-checked as it is read
                read += zip(batch.offsets.tolist(), batch.values(), strict=True)
            assert read == written
        finally:
            log.close()
