"""The sink through Spark against a real server: batch writes, copying a stream, the errors a
user sees, and exactly-once streaming writes across a failure in the middle of a micro-batch
and across a broker crash."""

from __future__ import annotations

import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from sink_support import assert_exactly_once, publish_numbers, read_all, values_of
from tests.support.server import ServerProcess

from tidelog.client import Client, Message

pytestmark = pytest.mark.spark


def write(
    df: Any, server: ServerProcess, stream: str, mode: str = "append", **options: str
) -> None:
    (
        df.write.format("tidelog")
        .mode(mode)
        .option("servers", server.address)
        .option("stream", stream)
        .options(**options)
        .save()
    )


def test_batch_write_keys_partitions_headers(
    spark: Any, server: ServerProcess, client: Client
) -> None:
    client.create_stream("written", partitions=3)
    rows = [
        ("a", None, None, None),
        ("b", "k1", None, [("h", b"1"), ("__producer", b"spoof")]),
        ("c", None, 2, []),
        ("d", "k2", 0, None),
    ]
    df = spark.createDataFrame(
        rows,
        "value STRING, key STRING, partition INT, "
        "headers ARRAY<STRUCT<key: STRING, value: BINARY>>",
    ).coalesce(1)
    write(df, server, "written")
    stored = read_all(client, "written")
    placed = {m.value: (p, m.key, dict(m.headers)) for p, ms in stored.items() for m in ms}
    assert set(placed) == {b"a", b"b", b"c", b"d"}
    assert placed[b"a"][:2] == (0, None)  # no key, no partition: task 0 % 3
    assert placed[b"b"][:2] == (zlib.crc32(b"k1") % 3, b"k1")
    assert placed[b"b"][2].get("h") == b"1"  # the input's reserved header was dropped
    assert placed[b"c"][:2] == (2, None)
    assert placed[b"d"][:2] == (0, b"k2")


def test_copy_a_stream_read_with_the_tidelog_source(
    spark: Any, server: ServerProcess, client: Client
) -> None:
    client.create_stream("original", partitions=2)
    client.create_stream("copy", partitions=2)
    for p in range(2):
        client.publish_batch(
            "original",
            [
                Message(
                    b"v%d.%d" % (p, i), key=b"k%d" % i if i % 2 else None, headers={"n": b"%d" % i}
                )
                for i in range(300)
            ],
            partition=p,
        )
    df = (
        spark.read.format("tidelog")
        .option("servers", server.address)
        .option("stream", "original")
        .load()
    )
    # Keep each record in its partition, in order (one task per source partition).
    write(df, server, "copy", maxChunkRecords="50")
    original, copied = read_all(client, "original"), read_all(client, "copy")
    for p in range(2):
        assert [(m.key, m.value) for m in copied[p]] == [(m.key, m.value) for m in original[p]]
        assert [m.headers.get("n") for m in copied[p]] == [m.headers.get("n") for m in original[p]]


@pytest.mark.parametrize(
    ("mode", "columns", "stream", "message"),
    [
        ("overwrite", "value", "errors", "cannot be overwritten"),
        ("append", "CAST(value AS STRING) AS v", "errors", "needs a 'value' column"),
        ("append", "CAST(1 AS INT) AS value", "errors", "column 'value' is int"),
        ("append", "value", "no-such-stream", "no stream 'no-such-stream'"),
    ],
)
def test_write_errors(
    spark: Any,
    server: ServerProcess,
    client: Client,
    mode: str,
    columns: str,
    stream: str,
    message: str,
) -> None:
    if not any(s.name == "errors" for s in client.list_streams()):
        client.create_stream("errors")
    df = spark.createDataFrame([(b"x",)], "value BINARY").selectExpr(columns)
    with pytest.raises(Exception, match=message):
        write(df, server, stream, mode=mode)
    assert client.stream_info("errors").partitions[0].high_watermark == -1


def test_missing_stream_option(spark: Any, server: ServerProcess) -> None:
    df = spark.createDataFrame([(b"x",)], "value BINARY")
    with pytest.raises(Exception, match="option 'stream' is required"):
        df.write.format("tidelog").mode("append").option("servers", server.address).save()


# -- streaming, exactly once ---------------------------------------------------------------


def stream_copy(
    spark: Any,
    source: ServerProcess,
    sink: ServerProcess,
    checkpoint: Path,
    transform: Any = None,
    source_options: dict[str, str] | None = None,
    **options: str,
) -> Any:
    """Start an availableNow query copying stream "input" of ``source`` to "output" of
    ``sink``, 500 offsets per partition and micro-batch."""
    df = (
        spark.readStream.format("tidelog")
        .option("servers", source.address)
        .option("stream", "input")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1000")
        .options(**(source_options or {}))
        .load()
    )
    if transform is not None:
        df = transform(df)
    return (
        df.select("value")
        .writeStream.format("tidelog")
        .option("servers", sink.address)
        .option("stream", "output")
        .option("checkpointLocation", str(checkpoint))
        .options(**options)
        .trigger(availableNow=True)
        .start()
    )


def failing_once(marker: Path, poison: bytes) -> Any:
    """A transform whose UDF raises on the row ``poison`` the first time only (the marker file
    remembers), so the task fails after it wrote the chunks before that row."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import BinaryType

    path = str(marker)

    def check(value):  # type: ignore[no-untyped-def]  # hints would make a pandas UDF
        import os

        if value == poison and not os.path.exists(path):
            open(path, "w").close()
            raise RuntimeError("injected failure in the middle of a micro-batch")
        return value

    checked = udf(check, BinaryType())
    return lambda df: df.withColumn("value", checked(col("value")))


@pytest.mark.slow
def test_exactly_once_when_a_micro_batch_fails_midway_and_the_query_restarts(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    count = 3000
    client.create_stream("input", partitions=2)
    client.create_stream("output", partitions=2)
    publish_numbers(client, "input", 2, count)
    marker = tmp_path / "failed-once"
    # Input partition 1 holds the odd numbers: 2751 is its offset 1375, in micro-batch 2
    # (offsets 1000..1499 of each partition), read in tasks of 100 offsets: the 8th task of the
    # micro-batch, [1300, 1400), fails after 75 of its rows (3 chunks of 25) while the tasks
    # scheduled before it (all of partition 0's, partition 1's first two) have written theirs.
    transform = failing_once(marker, b"2751")
    source = {"maxOffsetsPerPartition": "100"}
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        first = stream_copy(
            spark, server, server, tmp_path / "cp", transform, source, maxChunkRecords="25"
        )
        with pytest.raises(Exception, match="injected failure"):
            first.awaitTermination(90)
        assert marker.exists()
        written = values_of(client, "output")
        assert 2000 < len(written) < count  # batches 0 and 1, and part of batch 2
        second = stream_copy(
            spark, server, server, tmp_path / "cp", transform, source, maxChunkRecords="25"
        )
        second.awaitTermination(90)
        assert second.exception() is None
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert_exactly_once(values_of(client, "output"), count)


@pytest.mark.slow
def test_exactly_once_when_the_broker_crashes_during_a_write(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """The source stays up (the module's server); the output's broker is killed with SIGKILL
    while the query writes, and started again on the same data directory and port. The sink
    retries its chunks, and the query finishes without a gap or a duplicate."""
    count = 6000
    client.create_stream("input-for-crash", partitions=2)
    publish_numbers(client, "input-for-crash", 2, count)
    data = tmp_path / "sink-data"
    broker = ServerProcess(data).start()
    try:
        with Client(broker.address) as sink_client:
            sink_client.create_stream("output", partitions=3)

            def slow(df: Any) -> Any:
                from pyspark.sql.functions import col, udf
                from pyspark.sql.types import BinaryType

                def pause(value):  # type: ignore[no-untyped-def]
                    import time

                    time.sleep(0.0005)
                    return value

                return df.withColumn("value", udf(pause, BinaryType())(col("value")))

            crashed = threading.Event()
            held_at_crash: list[int] = []

            def crash_and_restart() -> None:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with Client(broker.address) as watcher:
                        held = sum(
                            p.high_watermark + 1 for p in watcher.stream_info("output").partitions
                        )
                    if held >= 1000:
                        break
                    time.sleep(0.02)
                port = broker.port
                broker.kill()
                held_at_crash.append(held)
                crashed.set()
                time.sleep(1.0)
                broker.extra = ["--port", str(port)]
                broker.start()

            thread = threading.Thread(target=crash_and_restart, daemon=True)
            thread.start()
            df = (
                spark.readStream.format("tidelog")
                .option("servers", server.address)
                .option("stream", "input-for-crash")
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "2000")
                .load()
            )
            query = (
                slow(df)
                .select("value")
                .writeStream.format("tidelog")
                .option("servers", broker.address)
                .option("stream", "output")
                .option("maxChunkRecords", "100")
                .option("writeRetryTimeoutSeconds", "30")
                .option("checkpointLocation", str(tmp_path / "cp"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(120)
            thread.join(30)
            assert crashed.is_set()
            assert held_at_crash[0] < count  # killed while the query was writing
            assert query.exception() is None
        with Client(broker.address) as sink_client:
            assert_exactly_once(values_of(sink_client, "output"), count)
    finally:
        broker.kill()
