"""``tidelog.spark.coalesce``: the frames of a task joined into larger Arrow batches."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.spark.coalesce import coalesce


def batch(first: int, n: int, size: int = 10) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "offset": pa.array(range(first, first + n), pa.int64()),
            "value": pa.array([b"x" * size] * n, pa.binary()),
        }
    )


def split_into(sizes: list[int]) -> list[pa.RecordBatch]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [batch(s, n) for s, n in zip(starts, sizes, strict=True)]


@settings(deadline=None)  # the first Arrow calls of a process are slow on a busy machine
@given(st.lists(st.integers(0, 50), max_size=20), st.integers(1, 120))
def test_rows_keep_their_order_and_batches_close_at_the_target(sizes: list[int], rows: int) -> None:
    out = list(coalesce(split_into(sizes), rows=rows))
    got = [o for b in out for o in b.column("offset").to_pylist()]
    assert got == list(range(sum(sizes)))
    assert all(b.schema == batch(0, 0).schema for b in out)
    # Every batch but the last reached the target; none is split.
    for b in out[:-1]:
        assert b.num_rows >= rows
    assert len(out) <= max(1, len(sizes))


def test_a_large_batch_passes_through_and_bytes_close_a_batch_too() -> None:
    big = batch(0, 100)
    assert next(coalesce([big], rows=50)) is big  # no copy
    small = [batch(i * 4, 4, size=1000) for i in range(6)]  # about 4 KB each
    out = list(coalesce(small, rows=1000, max_bytes=8000))
    assert [b.num_rows for b in out] == [8, 8, 8]


def test_nothing_in_nothing_out() -> None:
    assert list(coalesce([])) == []
