"""Arrow batches from ``RecordBatch`` frames (``tidelog.wire.arrow``) in the Spark source's schema,
without a JVM."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.wire import columns
from tidelog.wire.arrow import COLUMNS, MalformedBatch, arrow_batch, arrow_schema, gather

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def frame(
    offsets: list[int],
    timestamps: list[int],
    messages: v1.Messages,
) -> v1.RecordBatch:
    return v1.RecordBatch(
        offsets=columns.pack_int64(np.array(offsets)),
        timestamps=columns.pack_int64(np.array(timestamps)),
        messages=messages,
    )


ARROW_SCHEMA = arrow_schema()


def test_schema_is_what_spark_expects() -> None:
    # Spark refuses any batch whose schema differs from this (DATA_SOURCE_RETURN_SCHEMA_MISMATCH).
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


@pytest.mark.parametrize(
    "names",
    [("value",), ("partition",), ("partition", "value"), ("headers", "offset", "key"), COLUMNS],
)
def test_a_narrowed_schema_is_what_spark_expects_of_those_columns(names: tuple[str, ...]) -> None:
    """A read narrowed to some columns (a user-specified schema) emits exactly Spark's Arrow
    form of those fields, in the user's order."""
    spark_fields = StructType([SPARK_SCHEMA[name] for name in names])
    assert to_arrow_schema(spark_fields, timezone="UTC").equals(arrow_schema(names))


def test_a_narrowed_batch_holds_those_columns_only() -> None:
    messages = columns.pack([b"a", b"bc"], [b"k", None], [{"h": b"1"}, {}])
    full = arrow_batch(frame([4, 5], [10, 20], messages), "s", 2)
    narrowed = arrow_batch(frame([4, 5], [10, 20], messages), "s", 2, ("value", "partition"))
    assert narrowed.schema.names == ["value", "partition"]
    assert narrowed.to_pydict() == {"value": [b"a", b"bc"], "partition": [2, 2]}
    assert full.select(["value", "partition"]).equals(narrowed)


def test_an_unknown_column_is_refused() -> None:
    with pytest.raises(ValueError, match="no column 'topic'"):
        arrow_schema(("topic",))


def test_offsets_timestamps_keys_with_nulls_and_headers() -> None:
    ns = 1_700_000_000_123_456_789
    messages = columns.pack(
        [b"a", b"", b"ccc"],
        [b"k1", None, b""],
        [{"x": b"1", "y": b"\x00"}, {}, {"z": b""}],
    )
    batch = arrow_batch(frame([7, 8, 10], [ns, ns + 999, ns + 1000], messages), "s", 3)
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.to_pydict() == {
        "key": [b"k1", None, b""],
        "value": [b"a", b"", b"ccc"],
        "stream": ["s"] * 3,
        "partition": [3] * 3,
        "offset": [7, 8, 10],
        "timestamp": [
            dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC),  # floored to the µs
            dt.datetime(2023, 11, 14, 22, 13, 20, 123457, tzinfo=dt.UTC),
            dt.datetime(2023, 11, 14, 22, 13, 20, 123457, tzinfo=dt.UTC),
        ],
        "headers": [
            [{"key": "x", "value": b"1"}, {"key": "y", "value": b"\x00"}],
            None,  # no headers: null, as in Spark's Kafka source
            [{"key": "z", "value": b""}],
        ],
    }
    batch.validate(full=True)


def test_no_keys_and_no_headers() -> None:
    batch = arrow_batch(frame([0, 1], [5, 6], columns.pack([b"x", b"yz"])), "t", 0)
    assert batch.column("key").null_count == 2
    assert batch.column("headers").to_pylist() == [None, None]
    assert batch.column("value").to_pylist() == [b"x", b"yz"]
    batch.validate(full=True)


def test_empty_frame() -> None:
    batch = arrow_batch(frame([], [], columns.pack([])), "t", 0)
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


def test_reverse_frames_keep_delivery_order() -> None:
    messages = columns.pack([b"c", b"b", b"a"], [b"3", None, b"1"])
    batch = arrow_batch(frame([2, 1, 0], [30, 20, 10], messages), "s", 0)
    assert batch.column("offset").to_pylist() == [2, 1, 0]
    assert batch.column("value").to_pylist() == [b"c", b"b", b"a"]
    assert batch.column("key").to_pylist() == [b"3", None, b"1"]


def stored(values: list[bytes], gaps: list[int]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Values laid out with ``gaps[i]`` filler bytes before each, as records are on disk."""
    blob, starts = b"", []
    for value, gap in zip(values, gaps, strict=True):
        blob += b"#" * gap
        starts.append(len(blob))
        blob += value
    return blob + b"#", np.array(starts, dtype=np.int64), np.array([len(v) for v in values])


@pytest.mark.parametrize(
    ("values", "gaps"),
    [
        ([b"abc"] * 4, [5] * 4),  # evenly spaced: one strided copy
        ([b"abc", b"def"], [0, 0]),  # back to back
        ([b"a", b"bcd", b"", b"ef"], [3, 0, 7, 1]),  # uneven: a mask
        ([b"only"], [9]),
    ],
)
def test_value_positions_are_gathered(values: list[bytes], gaps: list[int]) -> None:
    blob, starts, sizes = stored(values, gaps)
    batch = arrow_batch(
        frame(list(range(len(values))), [0] * len(values), columns.pack_at(blob, starts, sizes)),
        "s",
        0,
    )
    assert batch.column("value").to_pylist() == values
    batch.validate(full=True)


@given(st.lists(st.tuples(st.binary(max_size=20), st.integers(0, 30)), max_size=40), st.randoms())
def test_gather_equals_slicing_in_any_order(layout: list[tuple[bytes, int]], rng: object) -> None:
    values = [v for v, _ in layout]
    blob, starts, sizes = stored(values, [g for _, g in layout])
    order = list(range(len(values)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    starts, sizes = starts[order], sizes[order]
    buffer = np.frombuffer(blob, dtype=np.uint8)
    expected = b"".join(blob[a : a + s] for a, s in zip(starts, sizes, strict=True))
    assert gather(buffer, starts, sizes).tobytes() == expected


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: setattr(f, "timestamps", f.timestamps[:8]),
        lambda f: setattr(f.messages, "value_sizes", f.messages.value_sizes[:4]),
        lambda f: setattr(f.messages, "values", f.messages.values + b"!"),
        lambda f: setattr(f.messages, "key_sizes", np.array([5, -1], "<i4").tobytes()),
        lambda f: setattr(f.messages, "value_positions", np.array([0, 99], "<u4").tobytes()),
    ],
)
def test_malformed_frames_are_refused(damage: object) -> None:
    broken = frame([0, 1], [0, 0], columns.pack([b"a", b"b"], [b"k", None]))
    damage(broken)  # type: ignore[operator]
    with pytest.raises(MalformedBatch):
        arrow_batch(broken, "s", 0)


def test_result_is_arrow() -> None:
    assert isinstance(arrow_batch(frame([0], [0], columns.pack([b"v"])), "s", 0), pa.RecordBatch)
