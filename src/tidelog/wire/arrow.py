"""``tidelog.v1.RecordBatch`` frames as Arrow record batches: the one frame→Arrow decoder.

Its schema (:func:`arrow_schema`) is Kafka's record as Spark's Kafka source gives it, with
``stream`` for ``topic``; the Spark source (``tidelog.spark.source``) hands these batches to
Spark, which accepts a Python data source's Arrow batches only if their schema equals, field for
field, the Arrow form of its Spark schema, and moves them into the JVM without touching single
rows. So every column here is built from the frame's byte columns with numpy and
``pa.Array.from_buffers``: no Python work per record, except for headers, which the protocol
itself carries as one protobuf list per record.

A batch may hold a subset of the columns, in any order (``columns``): the ones not asked for are
not built at all, which is how a Spark read narrowed to a few columns saves the work of the
others (``docs/spark.md``, "Reading fast"). Every column asked for is checked against the
frame; offsets and timestamps always are.

pyarrow is an optional extra (``spark``) and numpy is loaded only when a batch is built: this
module imports neither at import time, so a client that never builds an Arrow batch loads
neither. Without pyarrow, :func:`arrow_batch` raises :class:`~tidelog.errors.MissingExtra`
naming the extra.

Values: without ``value_positions`` the frame's ``values`` buffer is used as is. With it (the
server points into the stored records instead of copying values out), the values are gathered
with numpy: one strided copy when the records are evenly spaced (the usual case: equal-sized
records), else a boolean mask over the buffer, else (values out of order or overlapping, which
the protocol allows but the server never sends) an index array.

Timestamps arrive in ns; Spark's are µs, so they are floored to the µs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.errors import MissingExtra, ValuesOmitted
from tidelog.wire.columns import FrameBytes

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

COLUMNS: Final = ("key", "value", "stream", "partition", "offset", "timestamp", "headers")
"""The source's columns, in the order of its full schema."""


class MalformedBatch(ValueError):
    """A frame whose columns do not fit together (a server bug, or not a tidelog server)."""


def pyarrow() -> Any:
    """The ``pyarrow`` module; :class:`MissingExtra` when it is not installed."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]  # optional extra: loaded on first use
    except ImportError as error:
        raise MissingExtra(
            "Arrow batches need pyarrow, which tidelog's 'spark' extra installs: "
            "pip install 'tidelog[spark]' (or pip install pyarrow)"
        ) from error
    return pa


@cache
def _types() -> dict[str, Any]:
    pa = pyarrow()
    header = pa.struct(
        [pa.field("key", pa.string(), nullable=True), pa.field("value", pa.binary(), nullable=True)]
    )
    return {
        "key": pa.binary(),
        "value": pa.binary(),
        "stream": pa.string(),
        "partition": pa.int32(),
        "offset": pa.int64(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "headers": pa.list_(pa.field("element", header, nullable=True)),
    }


@cache
def arrow_schema(columns: tuple[str, ...] = COLUMNS) -> Any:
    """The Arrow schema of ``columns`` (all nullable): with every column, what
    ``pyspark.sql.pandas.types.to_arrow_schema`` makes of the Spark source's schema
    (``tidelog.spark.source.SPARK_SCHEMA_DDL``), checked by ``tests/spark/test_spark_arrow.py``."""
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"no column {unknown[0]!r}: the columns are {', '.join(COLUMNS)}")
    pa = pyarrow()
    types = _types()
    return pa.schema([pa.field(name, types[name]) for name in columns])


def arrow_batch(
    frame: v1.RecordBatch | FrameBytes,
    stream: str,
    partition: int,
    columns: Sequence[str] = COLUMNS,
    *,
    partitions: bytes | None = None,
) -> Any:
    """The records of one frame, in delivery order, as a ``pyarrow.RecordBatch`` of ``columns``
    (:func:`arrow_schema`). ``partitions``: a browse page's per-record partitions (n
    little-endian int32), in place of the one ``partition``."""
    import numpy as np  # with pyarrow: see the module's docstring

    pa = pyarrow()
    wanted = tuple(columns)
    schema = arrow_schema(wanted)
    got = frame if isinstance(frame, FrameBytes) else FrameBytes.of(frame)
    if len(got.offsets) % 8 or len(got.timestamps) != len(got.offsets):
        raise MalformedBatch(
            "malformed batch: offsets and timestamps must be n int64 each (this client never"
            " asks for frames without timestamps, SubscribeBatchesRequest.without_timestamps)"
        )
    n = len(got.offsets) // 8
    if partitions is not None and len(partitions) != 4 * n:
        raise MalformedBatch(f"malformed batch: partitions must hold {n} int32 entries")
    builders = {
        "key": lambda: _keys(got, n),
        "value": lambda: _values(got, n),
        "stream": lambda: pa.repeat(pa.scalar(stream, pa.string()), n),
        "partition": lambda: (
            pa.repeat(pa.scalar(partition, pa.int32()), n)
            if partitions is None
            else pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(partitions)])
        ),
        "offset": lambda: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(got.offsets)]),
        "timestamp": lambda: pa.Array.from_buffers(
            _types()["timestamp"],
            n,
            [None, pa.py_buffer(np.floor_divide(np.frombuffer(got.timestamps, "<i8"), 1000))],
        ),
        "headers": lambda: _headers(got, n),
    }
    return pa.RecordBatch.from_arrays([builders[name]() for name in wanted], schema=schema)


def _values(got: FrameBytes, n: int) -> Any:
    import numpy as np

    pa = pyarrow()
    if got.values_omitted:
        raise ValuesOmitted(
            "a frame read without its values (without_values) has no value column to build"
        )
    if len(got.value_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: value_sizes must hold {n} u32 entries")
    sizes = np.frombuffer(got.value_sizes, dtype="<u4").astype(np.int64)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if n else 0
    if total >= 1 << 31:
        raise MalformedBatch("a batch's values exceed 2 GiB, more than one Arrow array holds")
    arrow_offsets = np.zeros(n + 1, dtype=np.int32)
    arrow_offsets[1:] = ends
    blob = got.values
    if not got.value_positions:
        if total != len(blob):
            raise MalformedBatch(
                f"malformed batch: value sizes add up to {total} bytes but {len(blob)} were sent"
            )
        data = pa.py_buffer(blob)
    else:
        if len(got.value_positions) != 4 * n:
            raise MalformedBatch(f"malformed batch: value_positions must hold {n} u32 entries")
        starts = np.frombuffer(got.value_positions, dtype="<u4").astype(np.int64)
        if n and int((starts + sizes).max()) > len(blob):
            raise MalformedBatch("malformed batch: a value position points past the values sent")
        data = pa.py_buffer(gather(np.frombuffer(blob, dtype=np.uint8), starts, sizes))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(arrow_offsets), data])


def gather(
    buffer: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]:
    """The bytes ``buffer[starts[i] : starts[i] + sizes[i]]`` for every i, concatenated."""
    import numpy as np

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
            # a copy: reshape alone may keep a strided view (values of one byte)
            return np.ascontiguousarray(view).reshape(-1)
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
        picked: npt.NDArray[np.uint8] = buffer[: len(keep)][keep]
        return picked
    out_starts = np.cumsum(sizes) - sizes
    index = np.repeat(starts - out_starts, sizes) + np.arange(int(sizes.sum()))
    indexed: npt.NDArray[np.uint8] = buffer[index]
    return indexed


def _keys(got: FrameBytes, n: int) -> Any:
    import numpy as np

    pa = pyarrow()
    if not got.key_sizes:
        if got.keys:
            raise MalformedBatch("malformed batch: keys were sent without key_sizes")
        return pa.nulls(n, pa.binary())
    if len(got.key_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: key_sizes must hold {n} i32 entries")
    sizes = np.frombuffer(got.key_sizes, dtype="<i4")
    present = sizes >= 0
    arrow_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.maximum(sizes, 0), out=arrow_offsets[1:])
    if int(arrow_offsets[-1]) != len(got.keys) or int(sizes.min(initial=0)) < -1:
        raise MalformedBatch("malformed batch: key sizes do not add up to the keys sent")
    nulls = n - int(np.count_nonzero(present))
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(arrow_offsets), pa.py_buffer(got.keys)],
        null_count=nulls,
    )


def _headers(got: FrameBytes, n: int) -> Any:
    """One list of (key, value) per record; null for a record without headers, as in Spark's
    Kafka source (and cheaper for Spark than an empty array per row)."""
    import numpy as np

    pa = pyarrow()
    headers_type = _types()["headers"]
    lists = got.headers
    if not len(lists):
        return pa.nulls(n, headers_type)
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
        fields=list(headers_type.value_type),
    )
    present = counts > 0
    nulls = n - int(np.count_nonzero(present))
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        headers_type,
        n,
        [validity, pa.py_buffer(arrow_offsets)],
        null_count=nulls,
        children=[entries],
    )
