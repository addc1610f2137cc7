"""Checksums of many records at once (``tidelog.log.crcs``, the native pass): a read that
verifies a batch through it (``check_records``) detects a damaged record inside the batch, and
names it, exactly as a record-by-record check with one ``crc32c`` call per record does, on the
hardware path and the portable one; recovery cuts such a log at the same byte. (The pass itself
is compared with the ``crc32c`` package in ``test_native_crc32c.py``.)"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from crc32c import crc32c
from logtools import crash_copy, flip_bit, open_damaged, read_forward, segment_logs

from tidelog.errors import CorruptRecord
from tidelog.log import FlushPolicy, LogConfig
from tidelog.log import record as record_module
from tidelog.log.crcs import check_records
from tidelog.log.record import HEADER_SIZE, encode_batch, verify_records

VALUE = 12
"""Bytes per value: records of 48 bytes."""
COUNT = 3000


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


def reference_error(data: bytes, positions, sizes, offsets, stamps) -> CorruptRecord | None:  # type: ignore[no-untyped-def]
    """The reference check, record by record in Python: one ``crc32c`` package call and one
    header decode per record, the first disagreement named as ``verify_records`` names it."""
    header = np.frombuffer(data, dtype=np.uint8)
    for i, (at, size) in enumerate(zip(positions.tolist(), sizes.tolist(), strict=True)):
        record = header[at : at + size].tobytes()
        stored_crc, stored_size = struct.unpack_from("<II", record)
        offset, timestamp = struct.unpack_from("<qq", record, 8)
        crc = crc32c(record[4:])
        if crc != stored_crc:
            detail = f"CRC-32C {crc:#010x} does not match stored {stored_crc:#010x}"
        elif (stored_size, offset, timestamp) != (size, int(offsets[i]), int(stamps[i])):
            detail = (
                f"record header (offset {offset}, size {stored_size}, timestamp {timestamp}) "
                f"disagrees with the index (offset {int(offsets[i])}, size {size}, timestamp "
                f"{int(stamps[i])})"
            )
        else:
            continue
        return CorruptRecord("s.log", 4096 + at, detail)
    return None


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("victim", [0, 1, COUNT // 2, COUNT - 1])
def test_a_damaged_record_inside_a_batch_is_named_as_the_reference_names_it(
    victim: int, portable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of one record of a 3,000-record batch, damaged in turn: the native check
    (three CRCs in step on the hardware path) raises the very error (segment, position, text)
    a record-by-record check in Python raises, in one call over the whole batch."""
    data, positions, sizes, offsets, stamps = batch_bytes()
    calls = []

    def native(chunk: bytes, *arrays: np.ndarray) -> tuple[int, int]:
        calls.append(len(arrays[0]))
        return check_records(chunk, *arrays, portable=portable)

    monkeypatch.setattr(record_module, "check_records", native)
    assert verify_error(data, positions, sizes, offsets, stamps) is None
    size = int(sizes[victim])
    start = int(positions[victim])
    for at in range(start, start + size):
        damaged = bytearray(data)
        damaged[at] ^= 1 << (at % 8)
        error = verify_error(bytes(damaged), positions, sizes, offsets, stamps)
        reference = reference_error(bytes(damaged), positions, sizes, offsets, stamps)
        assert error is not None and reference is not None
        assert (error.segment, error.position, str(error)) == (
            reference.segment,
            reference.position,
            str(reference),
        )
        assert error.position == 4096 + start
    assert calls == [COUNT] * (1 + size)  # one pass over the whole batch each time


def test_an_index_that_disagrees_is_named_and_an_entry_outside_is_found_first() -> None:
    data, positions, sizes, offsets, stamps = batch_bytes()
    later = stamps.copy()
    later[17] += 1
    error = verify_error(data, positions, sizes, offsets, later)
    reference = reference_error(data, positions, sizes, offsets, later)
    assert error is not None and reference is not None and str(error) == str(reference)
    assert "disagrees with the index" in str(error)
    damaged = bytearray(data)
    damaged[int(positions[5]) + HEADER_SIZE] ^= 1  # a CRC mismatch before the bad entry
    outside = sizes.copy()
    outside[2000] = len(data)
    error = verify_error(bytes(damaged), positions, outside, offsets, stamps)
    assert error is not None and "outside the segment file" in str(error)
    short = sizes.copy()
    short[9] = HEADER_SIZE - 1
    error = verify_error(data, positions, short, offsets, stamps)
    assert error is not None and "outside the segment file" in str(error)


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
