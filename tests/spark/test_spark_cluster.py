"""The Spark source and sink against a cluster of three brokers and etcd: given only a broker
that leads no partition, a batch read gets every record from the leaders and a batch write
lands exactly once; after the leader of a partition is killed, both follow the new leader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sink_support import assert_exactly_once, values_of
from tests.cluster.clustertools import running_cluster, wait_for

from tidelog.client import Client, ClientSettings

pytestmark = pytest.mark.spark

PARTITIONS = 2
COUNT = 3000


def read(spark: Any, address: str, stream: str) -> list[bytes]:
    df = spark.read.format("tidelog").option("servers", address).option("stream", stream).load()
    return [bytes(row.value) for row in df.select("value").collect()]


def write(spark: Any, address: str, stream: str, values: list[bytes]) -> None:
    df = spark.createDataFrame([(v.decode(),) for v in values], "value STRING").repartition(2)
    df.write.format("tidelog").mode("append").option("servers", address).option(
        "stream", stream
    ).save()


def test_the_spark_source_and_sink_follow_the_leaders(spark: Any, tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        for name in ("source", "sink"):
            cluster.create_stream(name, partitions=PARTITIONS, replication_factor=3, min_isr=2)
        leaders = {cluster.partition("source", p).leader for p in range(PARTITIONS)}
        outsider = next(b for b in sorted(cluster.servers) if b not in leaders)
        address = cluster.servers[outsider].address
        numbers = [b"%d" % i for i in range(COUNT)]
        with Client(address, settings=ClientSettings(ack_all=True)) as client:
            for p in range(PARTITIONS):
                client.publish_batch("source", numbers[p::PARTITIONS], partition=p)

        assert sorted(read(spark, address, "source"), key=int) == numbers
        write(spark, address, "sink", numbers[: COUNT // 2])

        leader = cluster.partition("source", 0).leader
        cluster.kill(leader)
        wait_for(
            lambda: (
                cluster.partition("source", 0).leader not in ("", leader)
                and cluster.partition("sink", 0).leader not in ("", leader)
            ),
            30,
            "new leaders",
        )
        survivor = next(b for b in cluster.live() if b != leader)
        address = cluster.servers[survivor].address
        with Client(address) as client:  # the new leaders commit what their ISR holds
            wait_for(
                lambda: all(
                    client.partition_info("source", p).high_watermark == COUNT // PARTITIONS - 1
                    for p in range(PARTITIONS)
                ),
                30,
                "the new leaders' high watermarks",
            )
        assert sorted(read(spark, address, "source"), key=int) == numbers
        write(spark, address, "sink", numbers[COUNT // 2 :])
        with Client(address) as client:
            assert_exactly_once(values_of(client, "sink"), COUNT)
