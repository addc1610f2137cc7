"""Fewer, larger Arrow batches for Spark: consecutive small batches joined before the handoff.

Why: a broker frame holds what one subscription's byte budget allows (256 KiB by default:
about 1,500 records of 100 B), and Spark pays per Arrow batch a Python data source yields: the
worker wraps and writes each as its own Arrow IPC message, and the JVM loads each into vectors
and starts a row iterator over it. Joining the frames of one task into batches of about
:data:`TARGET_ROWS` rows cut the CPU of a ``select("value")`` from 1.39 to 1.13 µs per row (JVM
0.47 → 0.33, workers 0.59 → 0.50; ``docs/performance.md``, "Spark: the fixed costs of a read").

Invariants: rows keep their order, none is added, dropped or changed; a batch is yielded once
the held rows reach :data:`TARGET_ROWS` or their buffers :data:`TARGET_BYTES` (whichever comes
first), and the rest at the end; a batch that alone reaches either passes through without a
copy. Every input batch must have the same schema (one task's batches do).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed

TARGET_ROWS: Final = 16_384
"""Rows per batch handed to Spark (Spark's own Arrow paths use 10,000: ``maxRecordsPerBatch``)."""

TARGET_BYTES: Final = 16 << 20
"""And at most about this many buffer bytes held before a batch is handed over (large values)."""


def coalesce(
    batches: Iterable[pa.RecordBatch],
    *,
    rows: int = TARGET_ROWS,
    max_bytes: int = TARGET_BYTES,
) -> Iterator[pa.RecordBatch]:
    """``batches`` joined into batches of about ``rows`` rows (see the module docstring)."""
    held: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        held.append(batch)
        held_rows += batch.num_rows
        held_bytes += batch.nbytes
        if held_rows >= rows or held_bytes >= max_bytes:
            yield _joined(held)
            held, held_rows, held_bytes = [], 0, 0
    if held:
        yield _joined(held)


def _joined(held: list[pa.RecordBatch]) -> pa.RecordBatch:
    return held[0] if len(held) == 1 else pa.concat_batches(held)
