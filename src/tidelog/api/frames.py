"""The broker's batches and end reasons as ``tidelog.v1`` frames.

Three frame builders, all of verified batches (the log checked every record's CRC, value
included, when it read them). :func:`record_batch` builds the protobuf message (``Consume`` nests
it in its own), and :func:`encoded_record_batch` lays out the very bytes that message serialises
to, without building it. The second is what ``SubscribeBatches`` sends (on a transport that
takes :class:`~tidelog.api.framed.Framed`, as pieces: :func:`framed_record_batch`): building a
``RecordBatch`` copies every column into the message and serialising it copies them again (for a
256 KiB frame of 100-byte values, measured 0.06 µs per message, a tenth of the server's read
path), while one join copies them once, and tidelog's own transport needs not even that
(it writes the pieces beside each other). grpcio's serializer for the method is told to pass
``bytes`` through as they are (``tidelog.api.decoding.passing_bytes``).
:func:`record_batch_without_values` (``SubscribeBatchesRequest.without_values``) sends every
column but the value bytes, with ``Messages.values_omitted`` set and each value's size kept
(or left out too: ``without_value_sizes``). Each builder leaves the timestamps out when asked
(``without_timestamps``, ``RecordBatch.timestamps_omitted``).

Invariant: ``encoded_record_batch(b) == record_batch(b).SerializeToString()`` byte for byte
(fields in field-number order, as protobuf writes them; ``tests/api/test_encoded_frames.py``),
and the same bytes are the pieces of :func:`encoded_record_batch_pieces` joined.
"""

from __future__ import annotations

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.api.framed import Framed
from tidelog.broker import EndReason, MessageBatch
from tidelog.wire import columns
from tidelog.wire.varints import uvarint

END_REASONS = {
    EndReason.STOP: v1.END_REASON_STOP,
    EndReason.OLDEST: v1.END_REASON_OLDEST,
    EndReason.READONLY: v1.END_REASON_READONLY,
    None: v1.END_REASON_NONE,
}
"""Why a subscription ended, as the frame that says so."""

# Protobuf tags of the length-delimited fields written by hand: (field number << 3) | 2.
_RECORD_BATCH_OFFSETS = b"\x0a"
_RECORD_BATCH_TIMESTAMPS = b"\x12"
_RECORD_BATCH_MESSAGES = b"\x1a"
_MESSAGES_VALUES = b"\x0a"
_MESSAGES_VALUE_SIZES = b"\x12"
_MESSAGES_VALUE_POSITIONS = b"\x32"
_RECORD_BATCH_TIMESTAMPS_OMITTED = b"\x28\x01"
"""Field 5 (``timestamps_omitted``), a varint, true."""


def _field(tag: bytes, payload: bytes) -> list[bytes]:
    """A length-delimited field; proto3 leaves an empty one out."""
    return [tag, uvarint(len(payload)), payload] if payload else []


def record_batch(batch: MessageBatch, *, timestamps: bool = True) -> v1.RecordBatch:
    """A verified log batch as one columnar frame: the stored bytes as read, values pointed at
    (``timestamps=False``: without them, ``timestamps_omitted`` set)."""
    starts, sizes = batch.value_spans()
    return v1.RecordBatch(
        offsets=columns.pack_int64(batch.offsets),
        timestamps=columns.pack_int64(batch.timestamps) if timestamps else b"",
        timestamps_omitted=not timestamps,
        # The records travel as read from disk, with their values pointed at: no copy per value.
        messages=columns.pack_at(
            batch.data,
            starts,
            sizes,
            batch.keys() if batch.has_keys() else None,
            batch.headers() if batch.has_headers() else None,
        ),
    )


def encoded_record_batch(batch: MessageBatch, *, timestamps: bool = True) -> bytes:
    """``record_batch(batch).SerializeToString()``, laid out directly: one copy of the records."""
    return b"".join(encoded_record_batch_pieces(batch, timestamps=timestamps))


def encoded_record_batch_pieces(batch: MessageBatch, *, timestamps: bool = True) -> list[bytes]:
    """The bytes of :func:`encoded_record_batch` as pieces in order, the records' bytes
    (``batch.data``) one of them as they are: for a transport that sends pieces without joining
    them (:func:`framed_record_batch`)."""
    starts, sizes = batch.value_spans()
    # Keys and headers (fields 3 to 5 of Messages) are rare in a catch-up: protobuf writes them.
    middle = b""
    if batch.has_keys() or batch.has_headers():
        rest = v1.Messages()
        columns.add_keys_and_headers(
            rest,
            len(batch),
            batch.keys() if batch.has_keys() else None,
            batch.headers() if batch.has_headers() else None,
        )
        middle = rest.SerializeToString()
    messages = [
        *_field(_MESSAGES_VALUES, batch.data),
        *_field(_MESSAGES_VALUE_SIZES, sizes.astype("<u4").tobytes()),
        middle,
        *_field(_MESSAGES_VALUE_POSITIONS, starts.astype("<u4").tobytes()),
    ]
    length = sum(map(len, messages))
    return [
        *_field(_RECORD_BATCH_OFFSETS, columns.pack_int64(batch.offsets)),
        *(_field(_RECORD_BATCH_TIMESTAMPS, columns.pack_int64(batch.timestamps)) * timestamps),
        _RECORD_BATCH_MESSAGES,
        uvarint(length),
        *messages,
        *(() if timestamps else (_RECORD_BATCH_TIMESTAMPS_OMITTED,)),
    ]


def framed_record_batch(batch: MessageBatch, *, timestamps: bool = True) -> Framed:
    """:func:`encoded_record_batch` as one gRPC message in pieces (``Framed.pieces``), the
    records' bytes not copied, for a transport that takes them (``framed.takes_framed``)."""
    return Framed.of_message(encoded_record_batch_pieces(batch, timestamps=timestamps))


def record_batch_without_values(
    batch: MessageBatch, *, timestamps: bool = True, value_sizes: bool = True
) -> v1.RecordBatch:
    """A verified log batch as one columnar frame without its value bytes: offsets, timestamps,
    keys, headers and each value's size (``Messages.values_omitted``); ``timestamps`` and
    ``value_sizes`` false leave those out too (``timestamps_omitted``,
    ``value_sizes_omitted``). The records were read and CRC-checked whole, as for
    :func:`record_batch`; only the sending is spared."""
    return v1.RecordBatch(
        offsets=columns.pack_int64(batch.offsets),
        timestamps=columns.pack_int64(batch.timestamps) if timestamps else b"",
        timestamps_omitted=not timestamps,
        messages=columns.pack_without_values(
            batch.value_sizes() if value_sizes else None,
            batch.keys() if batch.has_keys() else None,
            batch.headers() if batch.has_headers() else None,
            count=len(batch),
        ),
    )
