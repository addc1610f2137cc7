"""Reads narrowed to some columns (``tidelog.spark.columns``): a user-specified schema or the
``columns`` option makes the source emit only those Arrow columns, batch and streaming, with the
same rows as a full read; a schema the source cannot answer fails naming the column.

The first tests need no JVM (the schema checks are pure); the rest read through Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType
from tests.support.server import ServerProcess

from tidelog.client import Client, Message
from tidelog.errors import InvalidOption, UnknownColumn
from tidelog.spark import remote
from tidelog.spark.columns import columns_of, ddl, source_schema
from tidelog.spark.options import parse
from tidelog.spark.source import SPARK_SCHEMA_DDL, ReadRange, read_range
from tidelog.wire.arrow import COLUMNS

STREAM = "narrow"
PARTITIONS = 2
PER_PARTITION = 40


def test_the_source_schema_is_every_column() -> None:
    assert columns_of(source_schema()) == COLUMNS
    assert ddl() == SPARK_SCHEMA_DDL
    assert ddl(("value", "partition")) == "value BINARY, partition INT"


def test_a_user_schema_names_the_columns_in_its_order() -> None:
    schema = StructType([StructField("value", BinaryType()), StructField("offset", LongType())])
    assert columns_of(schema) == ("value", "offset")


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ([StructField("topic", BinaryType())], "does not have"),
        ([StructField("VALUE", BinaryType())], "names are exact"),
        ([StructField("partition", LongType())], "type bigint; the tidelog source's is int"),
        ([StructField("value", BinaryType(), nullable=False)], "NOT NULL"),
        ([StructField("offset", LongType()), StructField("offset", LongType())], "twice"),
        ([], "no column"),
    ],
)
def test_a_schema_the_source_cannot_answer_names_the_column(
    fields: list[StructField], complaint: str
) -> None:
    with pytest.raises(UnknownColumn, match=complaint):
        columns_of(StructType(fields))


def test_the_columns_option() -> None:
    assert parse({"columns": "partition, value"}).columns == ("partition", "value")
    assert parse({}).columns is None
    with pytest.raises(UnknownColumn, match="'topic'"):
        parse({"columns": "value,topic"})
    with pytest.raises(InvalidOption, match="twice"):
        parse({"COLUMNS": "value,value"})


# -- through Spark -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(client: Client) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record."""
    client.create_stream(STREAM, partitions=PARTITIONS)
    rows = []
    for partition in range(PARTITIONS):
        acks = client.publish_batch(
            STREAM,
            [
                Message(b"v%d.%d" % (partition, i), key=b"k", headers={"h": b"x"})
                for i in range(PER_PARTITION)
            ],
            partition=partition,
        )
        rows += [(partition, a.offset, b"v%d.%d" % (partition, a.offset)) for a in acks]
    return rows


def reader(spark: Any, server: ServerProcess) -> Any:
    return spark.read.format("tidelog").option("servers", server.address).option("stream", STREAM)


def test_read_range_emits_only_the_asked_columns(
    server: ServerProcess, published: list[tuple[int, int, bytes]]
) -> None:
    """Without Spark: an executor's read of a range builds Arrow batches of those columns."""
    task = ReadRange(
        (server.address,), parse({}).tls, STREAM, 1, 0, 10, columns=("value", "partition")
    )
    batches = list(read_range(task))
    assert {tuple(b.schema.names) for b in batches} == {("value", "partition")}
    got = [row for b in batches for row in zip(*b.to_pydict().values(), strict=True)]
    assert got == [(v, p) for p, o, v in published if p == 1 and o < 10]


def test_a_read_without_the_value_column_moves_no_value_bytes(
    server: ServerProcess,
    published: list[tuple[int, int, bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without Spark: a task whose columns leave out ``value`` reads frames without values
    (``without_values``), and its other columns are those of a full read."""
    tls = parse({}).tls
    client = remote.connect((server.address,), tls)
    try:
        bare = list(remote.read_range(client, STREAM, 1, 0, 30, values=False))
        full = list(remote.read_range(client, STREAM, 1, 0, 30))
    finally:
        client.close()
    assert all(b.values_omitted and not b.frame.messages.values for b in bare)
    assert sum(map(len, bare)) == 30
    columns = ("partition", "offset", "timestamp", "key", "headers")
    assert [b.to_arrow(columns).to_pydict() for b in bare] == [
        b.to_arrow(columns).to_pydict() for b in full
    ]
    asked = []
    plain_read = remote.read_range

    def spying(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["values"])
        return plain_read(*args, **kwargs)

    monkeypatch.setattr(remote, "read_range", spying)
    for columns in (("offset", "key"), ("value", "offset")):
        task = ReadRange((server.address,), tls, STREAM, 1, 0, 30, columns=columns)
        got = [r for b in read_range(task) for r in b.column("offset").to_pylist()]
        assert got == list(range(30))
    assert asked == [False, True]


@pytest.mark.spark
def test_a_user_schema_reads_the_same_rows_with_those_columns(
    spark: Any, server: ServerProcess, published: list[tuple[int, int, bytes]]
) -> None:
    df = reader(spark, server).schema("partition INT, offset BIGINT, value BINARY").load()
    assert df.columns == ["partition", "offset", "value"]
    rows = sorted((r.partition, r.offset, r.value) for r in df.collect())
    assert rows == sorted(published)
    assert reader(spark, server).schema("partition INT").load().count() == len(published)
    counts = reader(spark, server).schema("partition INT").load().groupBy("partition").count()
    assert sorted((r.partition, r["count"]) for r in counts.collect()) == [
        (p, PER_PARTITION) for p in range(PARTITIONS)
    ]


@pytest.mark.spark
def test_the_columns_option_narrows_the_schema(
    spark: Any, server: ServerProcess, published: list[tuple[int, int, bytes]]
) -> None:
    df = reader(spark, server).option("columns", "value,offset").load()
    assert df.schema == StructType(
        [StructField("value", BinaryType()), StructField("offset", LongType())]
    )
    assert sorted(r.value for r in df.collect()) == sorted(v for _, _, v in published)


@pytest.mark.spark
def test_pushdown_works_on_a_narrowed_read(
    spark: Any, server: ServerProcess, published: list[tuple[int, int, bytes]]
) -> None:
    df = reader(spark, server).schema("partition INT, offset BIGINT").load()
    picked = df.where("partition = 1 AND offset >= 30")
    assert sorted(r.offset for r in picked.collect()) == list(range(30, PER_PARTITION))


@pytest.mark.spark
def test_a_schema_the_source_cannot_answer_fails_naming_the_column(
    spark: Any, server: ServerProcess, published: list[tuple[int, int, bytes]]
) -> None:
    with pytest.raises(Exception, match="topic") as raised:
        reader(spark, server).schema("topic STRING").load().collect()
    assert "does not have" in str(raised.value)
    with pytest.raises(Exception, match="bigint"):
        reader(spark, server).schema("partition BIGINT").load().collect()
    assert StructField("partition", IntegerType()) in source_schema().fields


@pytest.mark.spark
def test_a_streaming_read_narrows_too(
    spark: Any, server: ServerProcess, published: list[tuple[int, int, bytes]], tmp_path: Path
) -> None:
    seen: list[tuple[int, bytes]] = []
    query = (
        spark.readStream.format("tidelog")
        .option("servers", server.address)
        .option("stream", STREAM)
        .option("startingOffsets", "earliest")
        .schema("offset BIGINT, value BINARY")
        .load()
        .writeStream.foreachBatch(
            lambda df, _: seen.extend((r.offset, r.value) for r in df.collect())
        )
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None
    assert sorted(seen) == sorted((o, v) for _, o, v in published)
