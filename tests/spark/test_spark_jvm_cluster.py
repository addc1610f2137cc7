"""The JVM reader (``tidelog.spark.jvm.read``, format ``tidelog-jvm``) against a cluster of three
brokers and etcd. A follower answers ``SubscribeBatches`` with FAILED_PRECONDITION, the trailer
``tidelog-not-leader`` and "(the leader is HOST:PORT)" (it serves reads only to the Python
client's read-replica subscriptions): the planner names each partition's leader (option
``leaders``) so tasks go there first, and a task that meets a broker that does not lead its
partition (a stale plan, only a follower in ``servers``) moves to the leader the refusal names.
One cluster for the module: starting one costs seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.cluster.clustertools import Cluster, running_cluster, wait_for

from tidelog.client import Client, ClientSettings
from tidelog.spark import jvm, remote
from tidelog.spark.options import parse
from tidelog.spark.source import plan_batch

pytestmark = pytest.mark.spark

STREAM = "jvm-replicated"
PARTITIONS = 2
COUNT = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("jvm-cluster")) as running:
        running.create_stream(STREAM, partitions=PARTITIONS, replication_factor=3, min_isr=2)
        address = next(iter(running.servers.values())).address
        with Client(address, settings=ClientSettings(ack_all=True)) as client:
            for p in range(PARTITIONS):
                client.publish_batch(STREAM, _numbers()[p::PARTITIONS], partition=p)
        yield running


def _numbers() -> list[bytes]:
    return [b"%d" % i for i in range(COUNT)]


def _values(df: Any) -> list[bytes]:
    return sorted((bytes(r.value) for r in df.select("value").collect()), key=int)


def _follower(cluster: Cluster, partition: int) -> str:
    """A broker that replicates ``partition`` and does not lead it."""
    leader = cluster.partition(STREAM, partition).leader
    return next(b for b in sorted(cluster.servers) if b != leader)


def test_a_read_planned_against_a_cluster_gets_every_record(spark: Any, cluster: Cluster) -> None:
    leaders = {cluster.partition(STREAM, p).leader for p in range(PARTITIONS)}
    outsider = next((b for b in sorted(cluster.servers) if b not in leaders), None)
    given = cluster.servers[outsider or _follower(cluster, 0)].address
    options = {"servers": given, "stream": STREAM, "maxOffsetsPerPartition": "500"}
    planned = jvm.connector_options(options, *_plan(options))
    assert planned["leaders"] == ",".join(
        f"{p}={cluster.servers[cluster.partition(STREAM, p).leader].address}"
        for p in range(PARTITIONS)
    )
    assert _values(jvm.read(spark, options)) == _numbers()


def _plan(options: dict[str, str]) -> tuple[Any, Any, Any]:
    parsed = parse(options)
    connection = remote.connect(parsed.servers, parsed.tls)
    try:
        return parsed, plan_batch(connection, parsed, None), connection.partition_leaders(STREAM)
    finally:
        connection.close()


def test_a_task_given_only_a_follower_moves_to_the_leader(spark: Any, cluster: Cluster) -> None:
    """The connector given a plan whose only server (and stale leader) is a follower of
    partition 0: its tasks follow the leader the follower names, within seconds."""
    follower = cluster.servers[_follower(cluster, 0)].address
    per_partition = COUNT // PARTITIONS
    options = {
        "servers": follower,
        "stream": STREAM,
        "leaders": f"0={follower}",
        "tasks": f"0:0:{per_partition};1:0:{per_partition}",
    }
    df = spark.read.format(jvm.FORMAT).options(**options).load()
    assert _values(df) == _numbers()


def test_a_plan_made_before_the_leader_died(spark: Any, cluster: Cluster) -> None:
    """The DataFrame's plan names partition 0's leader, which is then killed: its task finds
    the leader out of reach, asks the next server and follows the new leader it names. (Runs
    last: the module's cluster keeps two brokers.)"""
    given = cluster.servers[_follower(cluster, 0)].address
    df = jvm.read(spark, servers=given, stream=STREAM)
    dead = cluster.partition(STREAM, 0).leader
    cluster.kill(dead)
    wait_for(lambda: cluster.partition(STREAM, 0).leader not in ("", dead), 30, "a new leader")
    assert _values(df) == _numbers()
