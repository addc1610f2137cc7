"""How a Kafka record is stored as a tidelog record, and read back as one.

The mapping (decided with the Kafka front, DESIGN item 12):

- key -> key (a null key -> no key; an empty key stays empty), value -> value (a null value ->
  an empty value and a flag);
- the record's FIRST header is always ``__kafka``, 10 bytes little-endian: ``u8 version (1) |
  u8 flags | i64 timestamp_ms``. Flag bit 0: the Kafka value was null. Flag bit 1: the Kafka
  headers could not be tidelog headers (a name repeated, a null value, a name starting ``__``
  or not UTF-8, or more or longer than a record holds), so they follow the 10 bytes raw, in
  Kafka's header wire form (varint count, then varint key length, key, varint value length (-1
  null), value), and the record has no other tidelog header of its own;
- otherwise the Kafka headers follow ``__kafka`` as tidelog headers, in order;
- the timestamp is the producer's CreateTime (the tidelog record keeps the broker's own time);
  a batch sent with LogAppendTime stores -1.

Read back (:func:`to_kafka`), a record without ``__kafka`` (published over gRPC) gets the
broker's time in ms and its tidelog headers except the reserved ones (names starting ``__``,
such as the ``__producer`` and ``__owner`` the broker adds to an idempotent batch's last record);
so do those reserved headers on a record with ``__kafka``. A ``__kafka`` header that is not
well formed (another version, unknown flags, raw headers that do not parse: only a gRPC
client could have written it) is ignored, as if absent.

Theory of operation. Both directions are vectorised for the common record, whose only header
is ``__kafka`` (10 bytes): :func:`to_tidelog` builds every ``__kafka`` value as a row of one
array and lets the log lay out the bodies (``RecordBodies.from_columns``); :func:`to_kafka`
reads them back as rows (``MessageBatch.first_header``) and builds the batch from columns. Only
records with other headers cost Python work per record.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Final

import numpy as np

from tidelog.broker import MessageBatch, RecordBodies
from tidelog.kafka.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    HeaderList,
    KafkaBatch,
    RawHeader,
    build_batch,
    read_headers,
)
from tidelog.kafka.varint import Int64Array

KAFKA_HEADER: Final = "__kafka"
VERSION: Final = 1
META_SIZE: Final = 10
NULL_VALUE: Final = 0x01
RAW_HEADERS: Final = 0x02
NO_TIMESTAMP: Final = -1
RESERVED_PREFIX: Final = "__"
MAX_KAFKA_HEADERS: Final = 0xFFFF - 3
"""Kafka headers a record can hold as tidelog headers: a record holds 65535, less ``__kafka``
and the ``__producer`` and ``__owner`` an idempotent batch's last record gets."""
MAX_NAME_BYTES: Final = 0xFFFF
NS_PER_MS: Final = 1_000_000
"""Nanoseconds in a millisecond: tidelog keeps times in ns, Kafka answers and asks in ms."""


def to_tidelog(batch: KafkaBatch) -> RecordBodies:
    """The records of a produced batch as tidelog records, ready to publish (module docstring).

    Control and transactional batches are the caller's to refuse; this maps any batch."""
    n = batch.count
    if batch.timestamp_type == LOG_APPEND_TIME:
        stamps = np.full(n, NO_TIMESTAMP, dtype=np.int64)
    else:
        stamps = batch.timestamp
    rows = np.empty((n, META_SIZE), dtype=np.uint8)
    rows[:, 0] = VERSION
    rows[:, 1] = batch.value_len < 0  # NULL_VALUE
    rows[:, 2:] = stamps.astype("<i8").view(np.uint8).reshape(n, 8)
    headers: dict[int, Mapping[str, bytes]] = {}
    for i in np.flatnonzero(batch.header_count).tolist():
        raw = batch.raw_headers_of(i)
        stored = _as_tidelog_headers(raw)
        if stored is not None:
            headers[i] = {KAFKA_HEADER: rows[i].tobytes(), **stored}
        else:
            meta = rows[i].copy()
            meta[1] |= RAW_HEADERS
            block = batch.records[int(batch.headers_start[i]) : int(batch.headers_end[i])]
            headers[i] = {KAFKA_HEADER: meta.tobytes() + block}
    return RecordBodies.from_columns(
        batch.records,
        (batch.key_start, batch.key_len),
        (batch.value_start, np.maximum(batch.value_len, 0)),
        first_header=(KAFKA_HEADER, rows),
        headers=headers,
    )


def joined(parts: list[RecordBodies]) -> RecordBodies:
    """The records of ``parts`` in order, as one batch to publish atomically."""
    if len(parts) == 1:
        return parts[0]
    return RecordBodies(
        b"".join(p.blob for p in parts),
        np.concatenate([p.keylens for p in parts]),
        np.concatenate([p.vallens for p in parts]),
        np.concatenate([p.hcounts for p in parts]),
        np.concatenate([p.sizes for p in parts]),
        frozenset().union(*(p.header_names for p in parts)),
    )


def _as_tidelog_headers(raw: list[RawHeader]) -> dict[str, bytes] | None:
    """Kafka headers as tidelog headers, or None when they cannot be (module docstring)."""
    if len(raw) > MAX_KAFKA_HEADERS:
        return None
    out: dict[str, bytes] = {}
    for key, value in raw:
        if value is None or len(key) > MAX_NAME_BYTES:
            return None
        try:
            name = key.decode()
        except UnicodeDecodeError:
            return None
        if name.startswith(RESERVED_PREFIX) or name in out:
            return None
        out[name] = value
    return out


def to_kafka(
    batch: MessageBatch, *, log_append_time: bool, partition_leader_epoch: int = -1
) -> bytes:
    """Records read from a partition (a forward batch) as Kafka record batches, uncompressed.

    One batch; with ``log_append_time`` (the stream's choice) every record's timestamp is the
    broker's, and since a Kafka batch of that type gives all its records one time (its max
    timestamp), one batch per run of records stored in the same millisecond. Offsets keep their
    gaps (compaction). Empty bytes for an empty batch."""
    n = len(batch)
    if not n:
        return b""
    found, meta = batch.first_header(KAFKA_HEADER, META_SIZE)
    counts = batch.header_counts()
    simple = (
        found & (counts == 1) & (meta[:, 0] == VERSION) & ((meta[:, 1] | NULL_VALUE) == NULL_VALUE)
    )
    broker_ms = batch.timestamps // NS_PER_MS
    sent = np.ascontiguousarray(meta[:, 2:]).view("<i8").reshape(n).astype(np.int64)
    use_sent = simple & (sent != NO_TIMESTAMP)
    timestamps = np.where(use_sent, sent, broker_ms)
    value_start, value_len = batch.value_spans()
    value_len = np.where(simple & ((meta[:, 1] & NULL_VALUE) > 0), -1, value_len)
    key_start, key_len = batch.key_spans()
    headers: dict[int, HeaderList] = {}
    others = np.flatnonzero(~simple & (counts > 0))
    if len(others):
        for i, stored in zip(others.tolist(), batch.headers_of(others), strict=True):
            ts, null, kafka_headers = _from_tidelog_headers(stored)
            if ts != NO_TIMESTAMP:
                timestamps[i] = ts
            if null:
                value_len[i] = -1
            if kafka_headers:
                headers[i] = kafka_headers
    if log_append_time:
        return _log_append_batches(
            batch,
            broker_ms,
            (key_start, key_len),
            (value_start, value_len),
            headers,
            partition_leader_epoch,
        )
    return build_batch(
        offsets=batch.offsets,
        timestamps=timestamps,
        keys=(batch.data, key_start, key_len),
        values=(batch.data, value_start, value_len),
        headers=headers,
        timestamp_type=CREATE_TIME,
        partition_leader_epoch=partition_leader_epoch,
    )


def _from_tidelog_headers(stored: Mapping[str, bytes]) -> tuple[int, bool, HeaderList]:
    """(sent timestamp or -1, value was null, Kafka headers) of a record read back."""
    items = list(stored.items())
    meta = _meta(items[0][1]) if items and items[0][0] == KAFKA_HEADER else None
    if meta is None:
        return NO_TIMESTAMP, False, [(k, v) for k, v in items if not k.startswith(RESERVED_PREFIX)]
    flags, ts, raw = meta
    if raw is not None:
        return ts, bool(flags & NULL_VALUE), raw
    rest = [(k, v) for k, v in items[1:] if not k.startswith(RESERVED_PREFIX)]
    return ts, bool(flags & NULL_VALUE), rest


def _meta(value: bytes) -> tuple[int, int, list[tuple[str | bytes, bytes | None]] | None] | None:
    """(flags, timestamp, raw headers or None) of a ``__kafka`` value; None if malformed."""
    if len(value) < META_SIZE or value[0] != VERSION or value[1] & ~(NULL_VALUE | RAW_HEADERS):
        return None
    flags = value[1]
    ts = int.from_bytes(value[2:META_SIZE], "little", signed=True)
    if not flags & RAW_HEADERS:
        return (flags, ts, None) if len(value) == META_SIZE else None
    try:
        raw = read_headers(value, META_SIZE, len(value))
    except ValueError:
        return None
    return flags, ts, list[tuple[str | bytes, bytes | None]](raw)


def _log_append_batches(
    batch: MessageBatch,
    broker_ms: Int64Array,
    keys: tuple[Int64Array, Int64Array],
    values: tuple[Int64Array, Int64Array],
    headers: dict[int, HeaderList],
    partition_leader_epoch: int,
) -> bytes:
    """One LogAppendTime batch per run of records stored in the same millisecond."""
    n = len(batch)
    key_start, key_len = keys
    value_start, value_len = values
    cuts = [0, *(np.flatnonzero(np.diff(broker_ms)) + 1).tolist(), n]
    runs: list[dict[int, HeaderList]] = [{} for _ in cuts[:-1]]
    for i, h in headers.items():  # each record's headers to its run, by its place in it
        run = bisect_right(cuts, i) - 1
        runs[run][i - cuts[run]] = h
    out: list[bytes] = []
    for a, b, run_headers in zip(cuts[:-1], cuts[1:], runs, strict=True):
        out.append(
            build_batch(
                offsets=batch.offsets[a:b],
                timestamps=broker_ms[a:b],
                keys=(batch.data, key_start[a:b], key_len[a:b]),
                values=(batch.data, value_start[a:b], value_len[a:b]),
                headers=run_headers,
                timestamp_type=LOG_APPEND_TIME,
                partition_leader_epoch=partition_leader_epoch,
            )
        )
    return b"".join(out)
