"""The sink's sans-IO core without a JVM: options, schema checks, partition choice, chunking
and sequence numbers (``tidelog.spark.sink_options``, ``tidelog.spark.chunks``)."""

from __future__ import annotations

import zlib

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog.client import Message
from tidelog.errors import InvalidOption
from tidelog.spark.chunks import (
    CHUNKS_PER_BATCH,
    Chunk,
    InvalidRecord,
    Outbox,
    batch_producer_id,
    choose_partitions,
    header_map,
    rows,
    sequence,
    stream_producer_id,
)
from tidelog.spark.sink_options import (
    DEFAULT_MAX_CHUNK_BYTES,
    InputColumns,
    InvalidSchema,
    OverwriteRefused,
    check_schema,
    parse_write_options,
    refuse_overwrite,
)

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


VALUE_ONLY = InputColumns("value")


def outbox(
    columns: InputColumns = VALUE_ONLY,
    partitions: int = 4,
    task: int = 1,
    batch_id: int = 0,
    *,
    max_bytes: int = 1 << 20,
    max_records: int = 1000,
) -> Outbox:
    return Outbox(
        columns,
        partitions,
        task,
        batch_id,
        max_chunk_bytes=max_bytes,
        max_chunk_records=max_records,
    )


def values_batch(values: list[bytes], **columns: pa.Array) -> pa.RecordBatch:
    return pa.record_batch({"value": pa.array(values, pa.binary()), **columns})


# -- options and schema ----------------------------------------------------------------------


def test_write_options_defaults_and_overrides() -> None:
    options = parse_write_options({"servers": "h:1,h:2", "STREAM": "out"})
    assert options.servers == ("h:1", "h:2")
    assert options.stream == "out"
    assert options.max_chunk_bytes == DEFAULT_MAX_CHUNK_BYTES
    assert options.retry_timeout_s == 60
    assert options.request_timeout_s == 30
    tuned = parse_write_options(
        {
            "stream": "out",
            "maxChunkBytes": "100",
            "maxChunkRecords": "7",
            "writeRetryTimeoutSeconds": "2.5",
            "writeRequestTimeoutSeconds": "0",
        }
    )
    assert (tuned.max_chunk_bytes, tuned.max_chunk_records, tuned.retry_timeout_s) == (100, 7, 2.5)
    assert tuned.request_timeout_s == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'stream' is required"),
        ({"stream": "s", "maxChunkBytes": "0"}, "maxChunkBytes: expected an integer from 1"),
        ({"stream": "s", "maxChunkBytes": str(64 << 20)}, "maxChunkBytes"),
        ({"stream": "s", "maxChunkRecords": "x"}, "maxChunkRecords"),
        ({"stream": "s", "writeRetryTimeoutSeconds": "-1"}, "writeRetryTimeoutSeconds"),
        ({"stream": "s", "writeRetryTimeoutSeconds": "inf"}, "writeRetryTimeoutSeconds"),
        ({"stream": "s", "writeRequestTimeoutSeconds": "-2"}, "writeRequestTimeoutSeconds"),
        ({"stream": "s", "servers": "nohost"}, "servers: expected host:port"),
    ],
)
def test_bad_write_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        parse_write_options(options)


def test_overwrite_is_refused() -> None:
    refuse_overwrite(False)
    with pytest.raises(OverwriteRefused, match="cannot be overwritten"):
        refuse_overwrite(True)


def test_schema_of_a_tidelog_read_is_writable_as_it_is() -> None:
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("stream", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("headers", HEADERS),
        ]
    )
    assert check_schema(schema) == InputColumns("value", "key", "partition", "headers")


def test_schema_value_only_strings_and_case() -> None:
    schema = StructType([StructField("VALUE", StringType()), StructField("n", DoubleType())])
    assert check_schema(schema) == InputColumns("VALUE")
    keyed = StructType(
        [
            StructField("value", BinaryType()),
            StructField("key", StringType()),
            StructField("partition", LongType()),
        ]
    )
    assert check_schema(keyed) == InputColumns("value", "key", "partition")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([StructField("v", BinaryType())], "needs a 'value' column .* has v"),
        ([StructField("value", IntegerType())], "column 'value' is int"),
        (
            [StructField("value", BinaryType()), StructField("key", TimestampType())],
            "column 'key' is timestamp",
        ),
        (
            [StructField("value", BinaryType()), StructField("partition", StringType())],
            "column 'partition' is string, .* an integer type",
        ),
        (
            [
                StructField("value", BinaryType()),
                StructField("headers", ArrayType(StringType())),
            ],
            "column 'headers' is array<string>",
        ),
    ],
)
def test_schema_errors(fields: list[StructField], message: str) -> None:
    with pytest.raises(InvalidSchema, match=message):
        check_schema(StructType(fields))


def test_headers_may_have_string_values() -> None:
    kind = ArrayType(
        StructType([StructField("key", StringType()), StructField("value", StringType())])
    )
    schema = StructType([StructField("value", BinaryType()), StructField("headers", kind)])
    assert check_schema(schema).headers == "headers"


# -- producer ids, sequences, partition choice -----------------------------------------------


def test_producer_ids_and_sequences() -> None:
    assert stream_producer_id("q-1", 3) == "spark:q-1:3"
    assert batch_producer_id("j", 0) == "spark-batch:j:0"
    assert sequence(0, 0) == 0
    assert sequence(2, 5) == 2 * CHUNKS_PER_BATCH + 5
    # A later micro-batch's first chunk is above any chunk of an earlier one.
    assert sequence(3, 0) > sequence(2, CHUNKS_PER_BATCH - 1)
    with pytest.raises(InvalidRecord, match="more than"):
        sequence(1, CHUNKS_PER_BATCH)


def test_partition_choice_matches_the_client() -> None:
    keys: list[bytes | None] = [b"alpha", None, b"beta", b""]
    chosen = choose_partitions(keys, 4, 5, task=7)
    assert chosen.tolist() == [zlib.crc32(b"alpha") % 5, 7 % 5, zlib.crc32(b"beta") % 5, 0]
    assert choose_partitions(None, 3, 4, task=6).tolist() == [2, 2, 2]


def test_partition_column_wins_and_null_means_choose() -> None:
    batch = values_batch(
        [b"a", b"b", b"c"],
        key=pa.array([b"k", None, None]),
        partition=pa.array([None, 3, None], pa.int32()),
    )
    found = rows(batch, InputColumns("value", "key", "partition"), 4, task=2)
    assert found.partitions.tolist() == [zlib.crc32(b"k") % 4, 3, 2]


@pytest.mark.parametrize("bad", [4, -1])
def test_partition_out_of_range(bad: int) -> None:
    batch = values_batch([b"a"], partition=pa.array([bad], pa.int64()))
    with pytest.raises(InvalidRecord, match=f"partition {bad}, but the output stream has 4"):
        rows(batch, InputColumns("value", partition="partition"), 4, task=0)


# -- Arrow to messages -------------------------------------------------------------------------


def test_rows_convert_strings_null_keys_and_headers() -> None:
    headers = pa.array(
        [
            [{"key": "h", "value": b"1"}, {"key": "__producer", "value": b"x"}],
            None,
            [{"key": "h", "value": None}, None, {"key": "h", "value": b"2"}],
        ],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    batch = pa.record_batch(
        {
            "value": pa.array(["é", "b", ""], pa.string()),
            "key": pa.array(["k", None, "kk"], pa.large_string()),
            "headers": headers,
        }
    )
    found = rows(batch, InputColumns("value", "key", headers="headers"), 2, task=0)
    assert found.values == ["é".encode(), b"b", b""]
    assert found.keys == [b"k", None, b"kk"]
    assert found.headers == [{"h": b"1"}, {}, {"h": b"2"}]
    assert found.sizes.tolist() == [2 + 1 + 2, 1, 2 + 2]


def test_a_null_value_is_refused() -> None:
    with pytest.raises(InvalidRecord, match="holds a null"):
        rows(values_batch([b"a", None]), InputColumns("value"), 1, task=0)  # type: ignore[list-item]


def test_header_map() -> None:
    assert header_map(None) == {}
    assert header_map([{"key": "a", "value": "text"}, {"key": None, "value": b"x"}]) == {
        "a": b"text"
    }


def test_chunk_messages_are_plain_values_without_keys_and_headers() -> None:
    assert Chunk(0, 0, [b"a"], [None], [{}]).messages() == [b"a"]
    assert Chunk(0, 0, [b"a", b"b"], [b"k", None], None).messages() == [
        Message(b"a", key=b"k"),
        Message(b"b"),
    ]
    assert Chunk(0, 0, [b"a"], None, [{"h": b"1"}]).messages() == [
        Message(b"a", headers={"h": b"1"})
    ]


# -- chunking ----------------------------------------------------------------------------------


def chunk_all(box: Outbox, batches: list[pa.RecordBatch]) -> list[Chunk]:
    chunks = [c for b in batches for c in box.add(b)]
    return chunks + box.finish()


@pytest.mark.parametrize("split", [1, 3, 7, 100])
def test_chunks_do_not_depend_on_how_spark_batches_the_rows(split: int) -> None:
    values = [bytes([65 + i % 26]) * (1 + i % 5) for i in range(100)]
    keys = [None if i % 3 else b"key%d" % (i % 7) for i in range(100)]
    batches = [
        values_batch(values[i : i + split], key=pa.array(keys[i : i + split], pa.binary()))
        for i in range(0, 100, split)
    ]
    whole = values_batch(values, key=pa.array(keys, pa.binary()))
    columns = InputColumns("value", "key")
    expected = chunk_all(outbox(columns, batch_id=4, max_bytes=40, max_records=9), [whole])
    got = chunk_all(outbox(columns, batch_id=4, max_bytes=40, max_records=9), batches)
    # The same chunks (the order across partitions may differ: it does not matter).
    assert sorted((c.partition, c.sequence, c.values, c.keys) for c in got) == sorted(
        (c.partition, c.sequence, c.values, c.keys) for c in expected
    )
    # Per partition: every row once, in input order, sequences from batch 4 rising by one.
    for partition in {c.partition for c in expected}:
        mine = [c for c in got if c.partition == partition]
        assert [c.sequence for c in mine] == [4 * CHUNKS_PER_BATCH + i for i in range(len(mine))]
        wanted = [
            v
            for v, p in zip(values, choose_partitions(keys, 100, 4, task=1).tolist(), strict=True)
            if p == partition
        ]
        assert [v for c in mine for v in c.values] == wanted
    for chunk in got:
        assert len(chunk.values) <= 9
        assert chunk.size <= 40
        assert chunk.size == sum(
            len(v) + len(k or b"") for v, k in zip(chunk.values, chunk.keys or [], strict=True)
        )


def test_a_record_over_the_byte_bound_travels_alone() -> None:
    box = outbox(max_bytes=10, max_records=100)
    chunks = chunk_all(box, [values_batch([b"a" * 4, b"b" * 25, b"c" * 4, b"d" * 4, b"e" * 3])])
    assert [c.values for c in chunks] == [[b"a" * 4], [b"b" * 25], [b"c" * 4, b"d" * 4], [b"e" * 3]]
    assert [c.sequence for c in chunks] == [0, 1, 2, 3]
    assert {c.partition for c in chunks} == {1}  # no key: task 1 % 4


def test_empty_batches_make_no_chunks() -> None:
    box = outbox()
    assert chunk_all(box, [values_batch([]), values_batch([])]) == []


def test_headers_in_a_later_batch_line_up_with_their_records() -> None:
    kind = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    box = outbox(InputColumns("value", headers="headers"), partitions=1)
    chunks = chunk_all(
        box,
        [
            values_batch([b"a", b"b"], headers=pa.array([[], None], kind)),
            values_batch([b"c", b"d"], headers=pa.array([[{"key": "h", "value": b"1"}], []], kind)),
            values_batch([b"e"], headers=pa.array([None], kind)),
        ],
    )
    assert len(chunks) == 1
    assert chunks[0].headers == [{}, {}, {"h": b"1"}, {}, {}]
    assert chunks[0].size == 5 + 2
