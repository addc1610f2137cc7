"""Checksums computed on the append path (``tidelog.log.crcs.stamp_crcs``): every record
``encode_batch`` writes carries ``crc32c`` of its bytes [4, size), whatever shape the batch
arrives in (plain bytes of one size or many, ``bytearray``, ``NewRecord`` with keys and headers,
``PackedValues``, atomic or not), and recovery still cuts a log written this way at a damaged
record."""

from __future__ import annotations

import random

import numpy as np
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from logtools import crash_copy, flip_bit, open_damaged, read_forward, segment_logs

from tidelog.log import FlushPolicy, LogConfig, NewRecord
from tidelog.log.record import HEADER_SIZE, PackedValues, encode_batch

LIMIT = 1 << 20


def stored_crcs_match(data: bytes, sizes: list[int]) -> None:
    """Every record of ``data`` (records back to back) stores crc32c of its bytes [4, size)."""
    at = 0
    for i, size in enumerate(sizes):
        stored = int.from_bytes(data[at : at + 4], "little")
        assert stored == crc32c(data[at + 4 : at + size]), i
        at += size
    assert at == len(data)


def shaped(values: list[bytes], shape: str, rng: random.Random) -> list[object] | PackedValues:
    if shape == "packed":
        return PackedValues(b"".join(values), np.array([len(v) for v in values], dtype=np.int64))
    if shape == "bytearray":
        return [bytearray(v) for v in values]
    if shape == "records":
        return [
            NewRecord(
                v,
                key=rng.choice([None, b"", rng.randbytes(rng.randrange(9))]),
                headers={f"h{k}": rng.randbytes(rng.randrange(5)) for k in range(rng.randrange(3))},
            )
            for v in values
        ]
    return list(values)


@settings(deadline=None, max_examples=150)
@given(
    st.integers(17, 300),  # records: above the small-batch path
    st.sampled_from(["same", "mixed"]),
    st.sampled_from(["bytes", "bytearray", "records", "packed"]),
    st.integers(0, 2**62),  # the first offset: carries through any of its bytes
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_every_record_written_stores_crc32c_of_its_bytes(
    count: int, sizes: str, shape: str, first: int, atomic: bool, rng: random.Random
) -> None:
    length = rng.randrange(0, 200)
    values = [
        rng.randbytes(length if sizes == "same" else rng.randrange(0, 200)) for _ in range(count)
    ]
    offsets = np.arange(first, first + count, dtype=np.int64)
    if rng.random() < 0.3:  # gaps between offsets, as replicas and compaction leave
        offsets = first + np.cumsum(np.array([rng.randrange(1, 1000) for _ in range(count)]))
    batch = encode_batch(
        shaped(values, shape, rng),  # type: ignore[arg-type]
        offsets,
        rng.randrange(2**63),
        LIMIT,
        atomic=atomic,
    )
    stored_crcs_match(bytes(batch.data), batch.sizes.tolist())


def test_recovery_cuts_a_log_written_in_large_batches_at_the_damaged_record(make_log, tmp_path):
    config = LogConfig(flush_policy=FlushPolicy.NEVER)
    log = make_log(config=config)
    rng = random.Random(7)
    same = [rng.randbytes(100) for _ in range(500)]
    mixed = [NewRecord(rng.randbytes(rng.randrange(300)), key=b"k") for _ in range(500)]
    log.append(same)
    log.append(PackedValues(b"".join(same), np.full(500, 100, dtype=np.int64)))
    log.append(mixed)
    copy = crash_copy(log, tmp_path / "crashed")
    (segment,) = segment_logs(copy)
    # Damage one byte of the value of offset 1200 (in the third, mixed-size batch).
    start = 2 * 500 * (HEADER_SIZE + 100) + sum(HEADER_SIZE + 1 + len(m.value) for m in mixed[:200])
    flip_bit(segment, start + HEADER_SIZE + 1, 3)
    size_before = segment.stat().st_size

    recovered = open_damaged(copy, config)
    survivors = read_forward(recovered)
    assert [r.offset for r in survivors] == list(range(1200))
    assert [r.value for r in survivors] == same + same + [m.value for m in mixed[:200]]
    assert recovered.recovery_report.truncated == [(0, size_before - start)]
    assert segment.stat().st_size == start
