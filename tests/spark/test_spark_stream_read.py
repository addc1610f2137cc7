"""Streaming reads through Spark (``Trigger.AvailableNow``, checkpoints under ``tmp_path``):
resuming from a checkpoint, admission control, partitions that join, data loss."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from test_spark_batch_read import wait_for_retention
from tests.support.server import ServerProcess

from tidelog.client import Client

pytestmark = pytest.mark.spark


class Batches:
    """A foreachBatch sink that keeps each micro-batch's (partition, offset) pairs."""

    def __init__(self) -> None:
        self.seen: list[list[tuple[int, int]]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        self.seen.append(sorted((r.partition, r.offset) for r in df.collect()))

    @property
    def rows(self) -> list[tuple[int, int]]:
        return sorted(row for batch in self.seen for row in batch)


def run(
    spark: Any, server: ServerProcess, stream: str, checkpoint: Path, **options: str
) -> Batches:
    """One availableNow query to its end; the batches it produced."""
    sink = Batches()
    query = (
        spark.readStream.format("tidelog")
        .option("servers", server.address)
        .option("stream", stream)
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sink


def publish(client: Client, stream: str, partition: int, count: int) -> None:
    client.publish_batch(stream, [b"m%d" % i for i in range(count)], partition=partition)


@pytest.mark.slow
def test_restart_resumes_from_the_checkpoint_and_picks_up_partitions(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    client.create_stream("resume", partitions=3)
    for p in range(3):
        publish(client, "resume", p, 10)
    first = run(spark, server, "resume", tmp_path, startingOffsets="earliest", partitions="0,1")
    assert first.rows == [(p, o) for p in (0, 1) for o in range(10)]
    publish(client, "resume", 0, 5)
    publish(client, "resume", 2, 5)
    # The same checkpoint, now with partition 2 too: it joins at its earliest offset.
    second = run(spark, server, "resume", tmp_path, partitions="0,1,2")
    assert second.rows == [(0, o) for o in range(10, 15)] + [(2, o) for o in range(15)]
    assert run(spark, server, "resume", tmp_path, partitions="0,1,2").rows == []
    offsets = sorted((tmp_path / "offsets").iterdir())
    assert offsets[-1].read_text().splitlines()[-1] == '{"resume": {"0": 15, "1": 10, "2": 15}}'


@pytest.mark.slow
def test_starting_latest_by_default_and_max_offsets_per_trigger(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    client.create_stream("limited", partitions=2)
    publish(client, "limited", 0, 7)
    assert run(spark, server, "limited", tmp_path / "a").rows == []  # default: latest
    publish(client, "limited", 0, 60)
    publish(client, "limited", 1, 20)
    sink = run(spark, server, "limited", tmp_path / "a", maxOffsetsPerTrigger="30")
    assert [len(b) for b in sink.seen] == [30, 30, 20]
    assert sink.rows == [(0, o) for o in range(7, 67)] + [(1, o) for o in range(20)]
    # In proportion to each partition's lag: 60 and 20 behind, so 22.5 to 7.5; the tied
    # remainder goes to the lower partition.
    assert sum(1 for p, _ in sink.seen[0] if p == 0) == 23


@pytest.mark.slow
def test_fail_on_data_loss_both_ways(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    client.create_stream("lossy", segment_max_bytes=4096, retention_messages=6)
    record = b"." * 1000  # about 4 records per 4 KiB segment
    client.publish_batch("lossy", [record] * 2, partition=0)
    first = run(spark, server, "lossy", tmp_path / "strict", startingOffsets="earliest")
    assert first.rows == [(0, 0), (0, 1)]
    shutil.copytree(tmp_path / "strict", tmp_path / "lenient")
    for _ in range(20):
        client.publish_batch("lossy", [record], partition=0)
    oldest = wait_for_retention(client, "lossy", above=2)
    with pytest.raises(Exception, match=r"offsets 2\.\.\d+ .* removed by retention"):
        run(spark, server, "lossy", tmp_path / "strict")
    lenient = run(spark, server, "lossy", tmp_path / "lenient", failOnDataLoss="false")
    assert lenient.rows == [(0, o) for o in range(oldest, 22)]


def test_batch_only_options_are_refused(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    client.create_stream("plain")
    # Spark creates the stream reader when the query starts: the query fails at once.
    with pytest.raises(Exception, match="applies to batch reads only"):
        run(spark, server, "plain", tmp_path, endingOffsets="latest")
