"""``tidelog.v1.RecordBatch`` frames as Arrow record batches: the one frame→Arrow decoder.

Its schema (:data:`ARROW_SCHEMA`) is Kafka's record as Spark's Kafka source gives it, with
``stream`` for ``topic``; the Spark source (``tidelog.spark.source``) hands these batches to
Spark, which accepts a Python data source's Arrow batches only if their schema equals, field for
field, the Arrow form of its Spark schema, and moves them into the JVM without touching single
rows. So every column here is built from the frame's byte columns with numpy and
``pa.Array.from_buffers``: no Python work per record, except for headers, which the protocol
itself carries as one protobuf list per record.

Needs pyarrow (the ``spark`` extra): ``tidelog.wire`` does not import this module, so only its
users load pyarrow.

Values: without ``value_positions`` the frame's ``values`` buffer is used as is. With it (the
server points into the stored records instead of copying values out), the values are gathered
with numpy: one strided copy when the records are evenly spaced (the usual case: equal-sized
records), else a boolean mask over the buffer, else (values out of order or overlapping, which
the protocol allows but the server never sends) an index array.

Timestamps arrive in ns; Spark's are µs, so they are floored to the µs.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1

HEADER_TYPE: Final = pa.struct(
    [pa.field("key", pa.string(), nullable=True), pa.field("value", pa.binary(), nullable=True)]
)
HEADERS_TYPE: Final = pa.list_(pa.field("element", HEADER_TYPE, nullable=True))
TIMESTAMP_TYPE: Final = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("stream", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("headers", HEADERS_TYPE),
    ]
)
"""What ``pyspark.sql.pandas.types.to_arrow_schema`` makes of the Spark source's schema
(``tidelog.spark.source.SPARK_SCHEMA_DDL``), checked by ``tests/spark/test_spark_arrow.py``."""

_U32: Final = np.dtype("<u4")
_I32: Final = np.dtype("<i4")
_I64: Final = np.dtype("<i8")


class MalformedBatch(ValueError):
    """A frame whose columns do not fit together (a server bug, or not a tidelog server)."""


def arrow_batch(frame: v1.RecordBatch, stream: str, partition: int) -> pa.RecordBatch:
    """The records of one frame, in delivery order, as an Arrow batch in :data:`ARROW_SCHEMA`."""
    if len(frame.offsets) % 8 or len(frame.timestamps) != len(frame.offsets):
        raise MalformedBatch("malformed batch: offsets and timestamps must be n int64 each")
    n = len(frame.offsets) // 8
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(frame.offsets)])
    nanos = np.frombuffer(frame.timestamps, dtype=_I64)
    micros = np.floor_divide(nanos, 1000)
    timestamps = pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(micros)])
    messages = frame.messages
    return pa.RecordBatch.from_arrays(
        [
            _keys(messages, n),
            _values(messages, n),
            pa.repeat(pa.scalar(stream, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            offsets,
            timestamps,
            _headers(messages, n),
        ],
        schema=ARROW_SCHEMA,
    )


def _values(messages: v1.Messages, n: int) -> pa.Array:
    if len(messages.value_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: value_sizes must hold {n} u32 entries")
    sizes = np.frombuffer(messages.value_sizes, dtype=_U32).astype(np.int64)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if n else 0
    if total >= 1 << 31:
        raise MalformedBatch("a batch's values exceed 2 GiB, more than one Arrow array holds")
    arrow_offsets = np.zeros(n + 1, dtype=np.int32)
    arrow_offsets[1:] = ends
    blob = messages.values
    if not messages.value_positions:
        if total != len(blob):
            raise MalformedBatch(
                f"malformed batch: value sizes add up to {total} bytes but {len(blob)} were sent"
            )
        data = pa.py_buffer(blob)
    else:
        if len(messages.value_positions) != 4 * n:
            raise MalformedBatch(f"malformed batch: value_positions must hold {n} u32 entries")
        starts = np.frombuffer(messages.value_positions, dtype=_U32).astype(np.int64)
        if n and int((starts + sizes).max()) > len(blob):
            raise MalformedBatch("malformed batch: a value position points past the values sent")
        data = pa.py_buffer(gather(np.frombuffer(blob, dtype=np.uint8), starts, sizes))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(arrow_offsets), data])


def gather(
    buffer: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]:
    """The bytes ``buffer[starts[i] : starts[i] + sizes[i]]`` for every i, concatenated."""
    n = len(starts)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    first = int(starts[0])
    size = int(sizes[0])
    steps = np.diff(starts)
    if n == 1 or (bool((sizes == size).all()) and bool((steps == steps[0]).all())):
        stride = int(steps[0]) if n > 1 else size
        if stride == size:  # back to back already: one slice
            return buffer[first : first + n * size].copy()
        if stride > size:  # evenly spaced records: one strided copy
            view = np.lib.stride_tricks.as_strided(
                buffer[first:], shape=(n, size), strides=(stride, 1), writeable=False
            )
            return view.reshape(-1)  # reshape of a non-contiguous view copies
    ends = starts + sizes
    gaps = np.empty(n, dtype=np.int64)
    gaps[0] = first
    np.subtract(starts[1:], ends[:-1], out=gaps[1:])
    if int(gaps.min()) >= 0:  # in order, not overlapping: keep the value bytes, drop the rest
        counts = np.empty(2 * n, dtype=np.int64)
        counts[0::2] = gaps
        counts[1::2] = sizes
        pattern = np.zeros(2 * n, dtype=np.bool_)
        pattern[1::2] = True
        keep = np.repeat(pattern, counts)
        return buffer[: len(keep)][keep]
    out_starts = np.cumsum(sizes) - sizes
    index = np.repeat(starts - out_starts, sizes) + np.arange(int(sizes.sum()))
    return buffer[index]


def _keys(messages: v1.Messages, n: int) -> pa.Array:
    if not messages.key_sizes:
        if messages.keys:
            raise MalformedBatch("malformed batch: keys were sent without key_sizes")
        return pa.nulls(n, pa.binary())
    if len(messages.key_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: key_sizes must hold {n} i32 entries")
    sizes = np.frombuffer(messages.key_sizes, dtype=_I32)
    present = sizes >= 0
    arrow_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.maximum(sizes, 0), out=arrow_offsets[1:])
    if int(arrow_offsets[-1]) != len(messages.keys) or int(sizes.min(initial=0)) < -1:
        raise MalformedBatch("malformed batch: key sizes do not add up to the keys sent")
    nulls = n - int(np.count_nonzero(present))
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(arrow_offsets), pa.py_buffer(messages.keys)],
        null_count=nulls,
    )


def _headers(messages: v1.Messages, n: int) -> pa.Array:
    """One list of (key, value) per record; null for a record without headers, as in Spark's
    Kafka source (and cheaper for Spark than an empty array per row)."""
    lists = messages.headers
    if not len(lists):
        return pa.nulls(n, HEADERS_TYPE)
    if len(lists) != n:
        raise MalformedBatch(f"malformed batch: {len(lists)} header lists for {n} values")
    # The protocol carries one protobuf list per record: a Python pass per header is the least.
    counts = np.fromiter((len(h.headers) for h in lists), dtype=np.int32, count=n)
    arrow_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=arrow_offsets[1:])
    names = [h.name for hs in lists for h in hs.headers]
    values = [h.value for hs in lists for h in hs.headers]
    entries = pa.StructArray.from_arrays(
        [pa.array(names, type=pa.string()), pa.array(values, type=pa.binary())],
        fields=list(HEADER_TYPE),
    )
    present = counts > 0
    nulls = n - int(np.count_nonzero(present))
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        HEADERS_TYPE,
        n,
        [validity, pa.py_buffer(arrow_offsets)],
        null_count=nulls,
        children=[entries],
    )
