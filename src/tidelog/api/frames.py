"""The broker's batches and end reasons as ``tidelog.v1`` frames.

Two frame builders, both of verified batches (the log checked every record's CRC, value
included, when it read them): :func:`record_batch` sends the stored bytes with the values pointed
at; :func:`record_batch_without_values` (``SubscribeBatchesRequest.without_values``) sends every
column but the value bytes, with ``Messages.values_omitted`` set and each value's size kept.
"""

from __future__ import annotations

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.broker import EndReason, MessageBatch
from tidelog.wire import columns

END_REASONS = {
    EndReason.STOP: v1.END_REASON_STOP,
    EndReason.OLDEST: v1.END_REASON_OLDEST,
    EndReason.READONLY: v1.END_REASON_READONLY,
    None: v1.END_REASON_NONE,
}
"""Why a subscription ended, as the frame that says so."""


def record_batch(batch: MessageBatch) -> v1.RecordBatch:
    """A verified log batch as one columnar frame: the stored bytes as read, values pointed at."""
    starts, sizes = batch.value_spans()
    return v1.RecordBatch(
        offsets=columns.pack_int64(batch.offsets),
        timestamps=columns.pack_int64(batch.timestamps),
        # The records travel as read from disk, with their values pointed at: no copy per value.
        messages=columns.pack_at(
            batch.data,
            starts,
            sizes,
            batch.keys() if batch.has_keys() else None,
            batch.headers() if batch.has_headers() else None,
        ),
    )


def record_batch_without_values(batch: MessageBatch) -> v1.RecordBatch:
    """A verified log batch as one columnar frame without its value bytes: offsets, timestamps,
    keys, headers and each value's size (``Messages.values_omitted``). The records were read and
    CRC-checked whole, as for :func:`record_batch`; only the sending is spared."""
    _, sizes = batch.value_spans()
    return v1.RecordBatch(
        offsets=columns.pack_int64(batch.offsets),
        timestamps=columns.pack_int64(batch.timestamps),
        messages=columns.pack_without_values(
            sizes,
            batch.keys() if batch.has_keys() else None,
            batch.headers() if batch.has_headers() else None,
        ),
    )
