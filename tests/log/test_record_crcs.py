"""Checksums of many records at once (``tidelog.log.crcs``): the vectorised pass computes exactly
what one ``crc32c`` call per record computes, and a read that verifies many small records of one
size through it detects a damaged record inside the batch, and names it, exactly as the
per-record calls did; recovery cuts such a log at the same byte."""

from __future__ import annotations

import random

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from logtools import crash_copy, flip_bit, open_damaged, read_forward, segment_logs

from tidelog.errors import CorruptRecord
from tidelog.log import FlushPolicy, LogConfig
from tidelog.log import crcs as crcs_module
from tidelog.log.crcs import record_crcs, same_size_crcs, vectorised_pays
from tidelog.log.record import HEADER_SIZE, encode_batch, verify_records

VALUE = 12
"""Bytes per value: records of 48 bytes, small enough for the vectorised pass to pay."""
COUNT = 3000


def per_record(chunk: bytes, starts: list[int], ends: list[int]) -> list[int]:
    return [crc32c(chunk[a:b]) for a, b in zip(starts, ends, strict=True)]


@settings(deadline=None)
@given(
    st.integers(1, 40),  # records
    st.integers(0, 23),  # checksummed bytes each: every remainder modulo 4
    st.integers(0, 9),  # filler between them
    st.integers(0, 7),  # where the first starts
    st.randoms(use_true_random=False),
)
def test_the_vectorised_pass_equals_one_crc32c_call_per_record(
    count: int, length: int, gap: int, first: int, rng: random.Random
) -> None:
    stride = length + gap
    chunk = rng.randbytes(first + count * stride + 3)
    starts = [first + i * stride for i in range(count)]
    ends = [s + length for s in starts]
    got = same_size_crcs(chunk, first, stride, count, length)
    assert got.tolist() == per_record(chunk, starts, ends)


@given(st.lists(st.binary(max_size=30), min_size=1, max_size=30), st.randoms())
def test_record_crcs_of_any_ranges_equals_the_calls(
    values: list[bytes], rng: random.Random
) -> None:
    chunk = b"".join(values)
    ends = np.cumsum([len(v) for v in values]).astype(np.int64)
    starts = ends - np.array([len(v) for v in values], dtype=np.int64)
    got = record_crcs(chunk, starts, ends)
    assert got.tolist() == per_record(chunk, starts.tolist(), ends.tolist())


def test_the_cost_model_takes_the_vectorised_pass_for_many_small_records_only() -> None:
    assert vectorised_pays(COUNT, HEADER_SIZE - 4 + VALUE)
    assert vectorised_pays(7700, 132)  # a 1 MiB read of 100-byte values
    assert vectorised_pays(4600, 52)  # a 256 KiB frame of 20-byte values
    assert not vectorised_pays(1927, 132)  # a 256 KiB frame of 100-byte values: too close
    assert not vectorised_pays(50, 132)  # a live frame of a few records
    assert not vectorised_pays(10_000, 1_000)  # large records: one call each is cheaper


def batch_bytes() -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    values = [random.Random(7).randbytes(VALUE) for _ in range(COUNT)]
    batch = encode_batch(values, np.arange(COUNT, dtype=np.int64), 5_000, 1 << 20)
    positions = np.cumsum(batch.sizes) - batch.sizes
    stamps = np.full(COUNT, batch.timestamp, dtype=np.int64)
    return batch.data.tobytes(), positions, batch.sizes, batch.offsets, stamps


def verify_error(data: bytes, positions, sizes, offsets, stamps) -> CorruptRecord | None:  # type: ignore[no-untyped-def]
    try:
        verify_records(data, positions, sizes, offsets, stamps, "s.log", 4096)
    except CorruptRecord as error:
        return error
    return None


@pytest.mark.parametrize("victim", [0, 1, COUNT // 2, COUNT - 1])
def test_a_damaged_record_inside_a_batch_is_named_as_the_calls_named_it(
    victim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of one record of a 3,000-record batch, damaged in turn: the vectorised read
    raises the very error (segment, position, text) the per-record calls raise."""
    data, positions, sizes, offsets, stamps = batch_bytes()
    calls = []
    real = crcs_module.same_size_crcs
    monkeypatch.setattr(crcs_module, "same_size_crcs", lambda *a: calls.append(a) or real(*a))
    assert verify_error(data, positions, sizes, offsets, stamps) is None
    size = int(sizes[victim])
    start = int(positions[victim])
    for at in range(start, start + size):
        damaged = bytearray(data)
        damaged[at] ^= 1 << (at % 8)
        vectorised = verify_error(bytes(damaged), positions, sizes, offsets, stamps)
        with monkeypatch.context() as calls_only:
            calls_only.setattr(crcs_module, "vectorised_pays", lambda count, length: False)
            one_by_one = verify_error(bytes(damaged), positions, sizes, offsets, stamps)
        assert vectorised is not None and one_by_one is not None
        assert (vectorised.segment, vectorised.position, str(vectorised)) == (
            one_by_one.segment,
            one_by_one.position,
            str(one_by_one),
        )
        assert vectorised.position == 4096 + start
    assert len(calls) == 1 + size  # the vectorised pass did every check but the reference's


def test_two_damaged_records_name_the_first() -> None:
    data, positions, sizes, offsets, stamps = batch_bytes()
    damaged = bytearray(data)
    for victim in (2000, 700):
        damaged[int(positions[victim]) + HEADER_SIZE] ^= 0x10
    error = verify_error(bytes(damaged), positions, sizes, offsets, stamps)
    assert error is not None and error.position == 4096 + int(positions[700])


CONFIG = LogConfig(segment_max_bytes=1 << 20, flush_policy=FlushPolicy.NEVER)


def test_a_log_damaged_inside_a_large_batch_is_cut_at_the_damaged_record(make_log, tmp_path):  # type: ignore[no-untyped-def]
    """One batch of 3,000 small records: a read through the vectorised pass stops with the
    damaged record; after a crash, recovery cuts the segment at its first byte."""
    log = make_log(config=CONFIG)
    values = [b"%012d" % i for i in range(COUNT)]
    log.append(values)
    victim = 1234
    start = victim * (HEADER_SIZE + VALUE)

    copy = crash_copy(log, tmp_path / "crashed")
    segment = segment_logs(copy)[-1]
    size_before = segment.stat().st_size
    flip_bit(segment, start + HEADER_SIZE + 3, 5)
    recovered = open_damaged(copy, CONFIG)
    assert recovered.recovery_report.truncated == [(0, size_before - start)]
    assert segment.stat().st_size == start
    assert [r.value for r in read_forward(recovered, max_messages=COUNT)] == values[:victim]

    log.close()
    sealed = segment_logs(log.directory)[-1]
    flip_bit(sealed, start + HEADER_SIZE + 3, 5)
    reopened = open_damaged(log.directory, CONFIG)
    with pytest.raises(CorruptRecord) as raised:
        reopened.forward_reader(0).read(COUNT, 1 << 20)
    assert (raised.value.segment, raised.value.position) == (sealed.name, start)
