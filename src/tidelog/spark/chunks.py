"""What one Spark write task sends: its rows, per output partition, cut into numbered chunks.

Sans-IO: :class:`Outbox` takes the task's Arrow batches and returns :class:`Chunk` s ready to
publish; ``tidelog.spark.sink`` does the publishing. Each chunk is one idempotent, atomic batch
(``publish_batch(..., producer_id=..., producer_sequence=...)``, docs/api.md), and the broker
keeps per partition and producer the highest sequence it stored, answering ``duplicate`` for any
sequence not above it. Exactly-once rests on these invariants:

- **The producer id names the task's slot, not the attempt**: ``spark:<queryId>:<task>``
  (streaming; the query id is stable across restarts from one checkpoint) or
  ``spark-batch:<jobId>:<task>`` (a batch write; the job id is made once on the driver). A
  retried task, a speculative copy, and a micro-batch replayed after a restart all produce under
  the same id as the first attempt.
- **The sequence names the chunk's place in the output**: ``batchId * CHUNKS_PER_BATCH + i``
  where ``i`` counts the chunks this task sent to this partition in this micro-batch (``i``
  alone for a batch write). Sequences rise with ``batchId``, so a later micro-batch is never
  taken for a replay of an earlier one.
- **Chunk boundaries depend only on the rows of the partition, in order**: a chunk closes when
  the next record would take it over ``max_chunk_bytes`` (key + value + header bytes) or past
  ``max_chunk_records``; never on timing or on how Spark batched the rows. So a replay that sees
  the same rows per output partition in the same order makes the same chunks with the same
  sequences, and the broker stores each exactly once.

Partition choice (per row): the ``partition`` column when it is not null; else CRC-32 of the key
modulo the partition count (as ``tidelog.client``); else, without a key, ``task % count`` (a
fixed function of the task, so a replay sends the rows where the first attempt did).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pyarrow.compute as pc  # type: ignore[import-untyped]

from tidelog.client import Message
from tidelog.errors import SparkSourceError
from tidelog.spark.sink_options import InputColumns

CHUNKS_PER_BATCH: Final = 1_000_000
"""Sequence numbers per micro-batch, task and partition: a task may send at most this many
chunks to one partition in one micro-batch (16 TB at the default chunk size)."""

RESERVED_HEADER_PREFIX: Final = "__"
"""Header names the broker reserves (``__producer``); the sink drops them from its input, so a
stream read with ``format("tidelog")`` can be written back as it is."""


class InvalidRecord(SparkSourceError, ValueError):
    """A row the sink cannot write: a null value, or a partition the stream does not have."""


def stream_producer_id(query_id: str, task: int) -> str:
    return f"spark:{query_id}:{task}"


def batch_producer_id(job_id: str, task: int) -> str:
    return f"spark-batch:{job_id}:{task}"


def sequence(batch_id: int, chunk_index: int) -> int:
    """The producer sequence of chunk ``chunk_index`` of micro-batch ``batch_id`` (0 for a
    batch write)."""
    if not 0 <= chunk_index < CHUNKS_PER_BATCH:
        raise InvalidRecord(
            f"a task sent more than {CHUNKS_PER_BATCH} chunks to one partition in one "
            f"micro-batch; raise maxChunkBytes/maxChunkRecords or repartition the input"
        )
    if batch_id < 0:
        raise ValueError(f"batch id must be >= 0, got {batch_id}")
    return batch_id * CHUNKS_PER_BATCH + chunk_index


@dataclass(slots=True)
class Chunk:
    """One idempotent batch: records for ``partition`` in input order."""

    partition: int
    sequence: int
    values: list[bytes]
    keys: list[bytes | None] | None = None
    headers: list[dict[str, bytes]] | None = None
    size: int = 0
    """Key, value and header bytes."""

    def messages(self) -> list[bytes] | list[Message]:
        """What ``publish_batch`` takes: plain values when no record has a key or headers."""
        keys, headers = self.keys, self.headers
        has_keys = keys is not None and any(k is not None for k in keys)
        has_headers = headers is not None and any(headers)
        if not has_keys and not has_headers:
            return self.values
        n = len(self.values)
        key_list: list[bytes | None] = keys if keys is not None else [None] * n
        header_list: list[dict[str, bytes]] = headers if headers is not None else [{}] * n
        return [
            Message(v, key=k, headers=h)
            for v, k, h in zip(self.values, key_list, header_list, strict=True)
        ]


@dataclass(slots=True)
class Rows:
    """The columns of an Arrow batch as the sink needs them."""

    partitions: npt.NDArray[np.int64]
    """Target partition of each row."""
    values: list[bytes]
    keys: list[bytes | None] | None
    headers: list[dict[str, bytes]] | None
    sizes: npt.NDArray[np.int64]


def rows(batch: pa.RecordBatch, columns: InputColumns, partition_count: int, task: int) -> Rows:
    """Values, keys, headers and target partitions of the rows of ``batch``."""
    n = batch.num_rows
    value = _as_binary(batch.column(columns.value))
    if value.null_count:
        raise InvalidRecord(
            f"column {columns.value!r} holds a null: a tidelog message always has a value; "
            f"filter nulls out or use an empty value (coalesce(value, ''))"
        )
    values: list[bytes] = value.to_pylist()
    sizes = _lengths(value)
    keys: list[bytes | None] | None = None
    if columns.key is not None:
        key = _as_binary(batch.column(columns.key))
        keys = key.to_pylist()
        sizes += _lengths(key)
    headers: list[dict[str, bytes]] | None = None
    listed = None if columns.headers is None else batch.column(columns.headers)
    if listed is not None and len(listed.flatten()):  # all null or empty (a copy): no work
        headers = [header_map(h) for h in listed.to_pylist()]
        sizes += np.fromiter(
            (sum(len(k) + len(v) for k, v in h.items()) for h in headers), np.int64, count=n
        )
    chosen = choose_partitions(keys, n, partition_count, task)
    if columns.partition is not None:
        chosen = _given_partitions(batch.column(columns.partition), chosen, partition_count)
    return Rows(chosen, values, keys, headers, sizes)


def choose_partitions(
    keys: list[bytes | None] | None, n: int, partition_count: int, task: int
) -> npt.NDArray[np.int64]:
    """CRC-32 of the key modulo the count, or ``task % count`` for a row without a key."""
    default = task % partition_count
    if keys is None:
        return np.full(n, default, dtype=np.int64)
    return np.fromiter(
        (default if k is None else zlib.crc32(k) % partition_count for k in keys),
        dtype=np.int64,
        count=n,
    )


def header_map(entries: Iterable[Mapping[str, Any] | None] | None) -> dict[str, bytes]:
    """One row's headers: null entries and reserved names (``__...``) dropped, a null value
    as empty, string values as UTF-8; a repeated name keeps its last value."""
    found: dict[str, bytes] = {}
    for entry in entries or ():
        if entry is None:
            continue
        name, value = entry.get("key"), entry.get("value")
        if name is None or name.startswith(RESERVED_HEADER_PREFIX):
            continue
        found[name] = b"" if value is None else value.encode() if isinstance(value, str) else value
    return found


def _as_binary(array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return array
    return array.cast(pa.large_binary())  # strings: the same UTF-8 bytes


def _lengths(array: pa.Array) -> npt.NDArray[np.int64]:
    lengths = pc.fill_null(pc.binary_length(array), 0)
    return np.array(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)  # writable


def _given_partitions(
    column: pa.Array, chosen: npt.NDArray[np.int64], partition_count: int
) -> npt.NDArray[np.int64]:
    given = column.cast(pa.int64())
    if given.null_count == len(given):
        return chosen
    low, high = pc.min_max(given).values()
    if low.as_py() < 0 or high.as_py() >= partition_count:
        bad = low.as_py() if low.as_py() < 0 else high.as_py()
        raise InvalidRecord(
            f"a row has partition {bad}, but the output stream has {partition_count} "
            f"partitions (0..{partition_count - 1}); leave 'partition' null to let the sink "
            f"choose"
        )
    numbers = np.asarray(pc.fill_null(given, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.where(numbers >= 0, numbers, chosen)


@dataclass(slots=True)
class _Pending:
    """The open chunk of one partition."""

    partition: int
    batch_id: int
    with_keys: bool
    next_index: int = 0
    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    headers: list[dict[str, bytes]] | None = None
    """``None`` until a record with headers comes (batches without any skip the work)."""
    size: int = 0

    def close(self) -> Chunk:
        chunk = Chunk(
            self.partition,
            sequence(self.batch_id, self.next_index),
            self.values,
            self.keys if self.with_keys else None,
            self.headers,
            self.size,
        )
        self.next_index += 1
        self.values, self.keys, self.headers, self.size = [], [], None, 0
        return chunk


class Outbox:
    """Cuts a task's rows into chunks per partition (see the module docstring).

    ``add`` returns the chunks that filled up, ``finish`` the partly filled rest; publish them
    in the order returned (per partition, sequences must rise)."""

    def __init__(
        self,
        columns: InputColumns,
        partition_count: int,
        task: int,
        batch_id: int,
        *,
        max_chunk_bytes: int,
        max_chunk_records: int,
    ) -> None:
        self.columns = columns
        self.partition_count = partition_count
        self.task = task
        self.batch_id = batch_id
        self.max_chunk_bytes = max_chunk_bytes
        self.max_chunk_records = max_chunk_records
        self._pending: dict[int, _Pending] = {}

    def add(self, batch: pa.RecordBatch) -> list[Chunk]:
        found = rows(batch, self.columns, self.partition_count, self.task)
        targets = found.partitions
        if not len(targets):
            return []
        ready: list[Chunk] = []
        first = int(targets[0])
        if bool((targets == first).all()):
            self._append(first, found, None, ready)
            return ready
        for partition in np.unique(targets).tolist():
            self._append(partition, found, np.flatnonzero(targets == partition), ready)
        return ready

    def finish(self) -> list[Chunk]:
        return [p.close() for _, p in sorted(self._pending.items()) if p.values]

    def _append(
        self,
        partition: int,
        found: Rows,
        index: npt.NDArray[np.intp] | None,
        ready: list[Chunk],
    ) -> None:
        pending = self._pending.get(partition)
        if pending is None:
            pending = self._pending[partition] = _Pending(
                partition, self.batch_id, found.keys is not None
            )
        if index is None:
            values, keys, headers, sizes = found.values, found.keys, found.headers, found.sizes
        else:
            picks = index.tolist()
            values = [found.values[i] for i in picks]
            keys = None if found.keys is None else [found.keys[i] for i in picks]
            headers = None if found.headers is None else [found.headers[i] for i in picks]
            sizes = found.sizes[index]
        start, n = 0, len(values)
        while start < n:
            room = self.max_chunk_records - len(pending.values)
            totals = np.cumsum(sizes[start : start + max(room, 0)])
            take = int(np.searchsorted(totals, self.max_chunk_bytes - pending.size, "right"))
            if take == 0 and not pending.values:
                take = 1  # a record over max_chunk_bytes travels alone
            if take:
                stop = start + take
                pending.values.extend(values[start:stop])
                if keys is not None:
                    pending.keys.extend(keys[start:stop])
                if headers is not None:
                    if pending.headers is None:
                        pending.headers = [{} for _ in range(len(pending.values) - take)]
                    pending.headers.extend(headers[start:stop])
                elif pending.headers is not None:
                    pending.headers.extend({} for _ in range(take))
                pending.size += int(totals[take - 1])
                start = stop
            if start < n:  # the rest does not fit: this chunk is full
                ready.append(pending.close())
