"""The records part laid out in runs (``tidelog/kafka/layout.py``) is byte for byte the records
part gathered record by record, whatever the shapes, gaps, strides and headers; and a batch laid
out in runs reads back in kafka-python, an independent implementation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from tidelog.kafka.layout import (
    HeaderList,
    lay_out,
    lay_out_gathered,
    lay_out_in_runs,
)
from tidelog.kafka.records import build_batch


@dataclass(frozen=True)
class Block:
    """Records of one shape: ``count`` of them, each with a key and a value of these lengths
    (-1: null) and these headers."""

    count: int
    key_len: int
    value_len: int
    headers: HeaderList | None


@dataclass
class Columns:
    offset_deltas: np.ndarray
    timestamp_deltas: np.ndarray
    keys: tuple[bytes, np.ndarray, np.ndarray] | None
    values: tuple[bytes, np.ndarray, np.ndarray]
    headers: list[HeaderList | None]
    n: int

    def args(self) -> tuple[object, ...]:
        return (
            self.offset_deltas,
            self.timestamp_deltas,
            self.keys,
            self.values,
            self.headers,
            self.n,
        )


_HEADERS: list[HeaderList | None] = [
    None,
    [("h", b"v")],
    [("trace", b"0123456789"), ("null", None)],
    [(b"\xff", b"")],
]

blocks = st.lists(
    st.builds(
        Block,
        count=st.integers(1, 300),
        key_len=st.sampled_from([-1, -1, 0, 3, 40]),
        value_len=st.sampled_from([-1, 0, 1, 100, 100, 200]),
        headers=st.sampled_from(_HEADERS),
    ),
    min_size=1,
    max_size=6,
)


def _column(
    data: st.DataObject, lengths: np.ndarray, shared: bytes | None = None
) -> tuple[bytes, np.ndarray]:
    """A buffer holding a value of each length: back to back (evenly spaced within a run of
    equal lengths), with gaps between some, or after ``shared`` (keys and values in one)."""
    gaps = data.draw(st.sampled_from(["none", "some", "every"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    spans = np.maximum(lengths, 0)
    if gaps == "none":
        gap = np.zeros(len(lengths), dtype=np.int64)
    elif gaps == "some":
        gap = np.where(rng.random(len(lengths)) < 0.02, rng.integers(1, 9, len(lengths)), 0)
    else:
        gap = np.full(len(lengths), data.draw(st.integers(1, 30)), dtype=np.int64)
    head = len(shared) if shared is not None else 0
    starts = head + np.cumsum(spans + gap) - spans
    size = int(starts[-1] + spans[-1]) if len(starts) else head
    payload = rng.integers(0, 256, size - head, dtype=np.uint8).tobytes()
    return (shared or b"") + payload, starts.astype(np.int64)


def _columns(data: st.DataObject, shape: list[Block]) -> Columns:
    counts = [b.count for b in shape]
    n = sum(counts)
    key_len = np.repeat([b.key_len for b in shape], counts).astype(np.int64)
    value_len = np.repeat([b.value_len for b in shape], counts).astype(np.int64)
    headers: list[HeaderList | None] = [b.headers for b in shape for _ in range(b.count)]
    # Offsets ascend with gaps (a compacted log) that cross the varint widths' bounds.
    steps = np.array(data.draw(st.lists(st.sampled_from([1, 1, 1, 2, 60, 8000]), min_size=n,
                                        max_size=n)), dtype=np.int64)  # fmt: skip
    offset_deltas = np.cumsum(steps) - steps[0]
    # Timestamps mostly advance, sometimes step back (CreateTime from many producers).
    jumps = data.draw(st.lists(st.sampled_from([0, 0, 1, 5, -3, 70, 9000, -100_000]),
                               min_size=n, max_size=n))  # fmt: skip
    timestamp_deltas = np.cumsum(np.array(jumps, dtype=np.int64))
    keys: tuple[bytes, np.ndarray, np.ndarray] | None = None
    values_buffer, value_start = _column(data, value_len)
    if bool((key_len >= 0).any()):
        if data.draw(st.booleans()):
            keys_buffer, key_start = _column(data, key_len)
        else:  # keys in the values' buffer, after them: the same object
            values_buffer, key_start = _column(data, key_len, shared=values_buffer)
            keys_buffer = values_buffer
        keys = (keys_buffer, key_start, key_len)
    return Columns(
        offset_deltas,
        timestamp_deltas,
        keys,
        (values_buffer, value_start, value_len),
        headers,
        n,
    )


@settings(max_examples=150, deadline=None)
@given(shape=blocks, data=st.data())
def test_runs_lay_out_the_same_bytes_as_the_gather(shape: list[Block], data: st.DataObject) -> None:
    columns = _columns(data, shape)
    gathered = lay_out_gathered(*columns.args())  # type: ignore[arg-type]
    assert lay_out_in_runs(*columns.args()) == gathered  # type: ignore[arg-type]
    assert lay_out(*columns.args()) == gathered  # type: ignore[arg-type]


def test_a_uniform_batch_is_laid_out_in_runs_and_kafka_python_reads_it() -> None:
    n = 20_000  # a few runs: offset deltas of 1, 2 and 3 bytes, and each record with headers
    rng = np.random.default_rng(3)
    values = rng.integers(0, 256, n * 100, dtype=np.uint8).tobytes()
    starts = np.arange(n, dtype=np.int64) * 100
    lengths = np.full(n, 100, dtype=np.int64)
    offsets = 1000 + np.arange(n, dtype=np.int64)
    stamps = 1_700_000_000_000 + np.arange(n, dtype=np.int64) // 7
    headers = {5: [("k", b"v")], n - 1: [("last", None)]}
    built = build_batch(
        offsets=offsets, timestamps=stamps, values=(values, starts, lengths), headers=headers
    )
    batch = DefaultRecordBatch(built)
    assert batch.validate_crc()
    records = list(batch)
    assert [r.offset for r in records] == offsets.tolist()
    assert [r.timestamp for r in records] == stamps.tolist()
    assert all(r.value == values[i * 100 : (i + 1) * 100] for i, r in enumerate(records))
    assert all(r.key is None for r in records)
    assert records[5].headers == [("k", b"v")]
    assert records[-1].headers == [("last", None)]
    assert all(not r.headers for i, r in enumerate(records) if i not in (5, n - 1))


def test_lay_out_handles_no_records() -> None:
    empty = np.zeros(0, dtype=np.int64)
    args = (empty, empty, None, (b"", empty, empty), None, 0)
    assert lay_out(*args) == lay_out_in_runs(*args) == lay_out_gathered(*args) == b""
