"""Materialised views across a cluster: declared once through any broker, built by every
replica from its own log, answered through any broker from each partition's leader, and still
answered after a leader dies (the new leader's views were built from its copy of the log)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.cluster.clustertools import Cluster, running_cluster, wait_for

from tidelog.client import Client, ClientSettings, Message, NotFound, View

pytestmark = pytest.mark.slow

PARTITIONS = 3
SETTINGS = ClientSettings(ack_all=True)


def client(cluster: Cluster, broker: str) -> Client:
    return Client(cluster.servers[broker].address, settings=SETTINGS)


def publish(cluster: Cluster, via: str, round_: int) -> dict[bytes, bytes]:
    """Two keys per partition, values naming the round; returns key -> value."""
    written: dict[bytes, bytes] = {}
    with client(cluster, via) as c:
        for partition in range(PARTITIONS):
            batch = [
                Message(
                    b"round %d p%d k%d" % (round_, partition, k), key=b"p%d-k%d" % (partition, k)
                )
                for k in range(2)
            ]
            c.publish_batch("v", batch, partition=partition)
            written.update({m.key: m.value for m in batch if m.key is not None})
    return written


def check(cluster: Cluster, via: str, latest: dict[bytes, bytes], rounds: int) -> None:
    with client(cluster, via) as c:
        for key, value in latest.items():
            found = c.view_get("v", "latest", key)
            assert found is not None and found.value == value, (via, key)
            values = [e.value for e in c.window_fetch("v", "minutes", key)]
            assert len(values) == rounds, (via, key, values)
        ranged = c.view_range("v", "latest")
        assert [(e.key, e.value) for e in ranged] == sorted(latest.items()), via
        newest = c.view_range("v", "latest", reverse=True, limit=2)
        assert [e.key for e in newest] == sorted(latest, reverse=True)[:2]
        statuses = {s.view.name: s for s in c.list_views("v")}
        assert set(statuses) == {"latest", "minutes"}
        assert len(statuses["latest"].applied_offsets) == PARTITIONS
        assert all(offset == 2 * rounds for offset in statuses["latest"].applied_offsets), via
        assert statuses["latest"].entries > 0


def test_views_are_built_on_every_replica_and_answered_by_the_leaders(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        # Two replicas of three partitions on three brokers: no broker holds every partition.
        cluster.create_stream("v", partitions=PARTITIONS, replication_factor=2, min_isr=1)
        with client(cluster, "b1") as c:
            c.declare_view("v", View.table("latest"))
            c.declare_view("v", View.window("minutes", 60_000))
            c.declare_view("v", View.table("latest"))  # the same again: nothing changes
        latest = publish(cluster, "b2", 1)
        for broker in ("b1", "b2", "b3"):  # at once: a broker builds a new view on first ask
            check(cluster, broker, latest, rounds=1)

        # The leader of partition 0 dies: its follower leads, with views built from its log.
        leader = cluster.partition("v", 0).leader
        cluster.kill(leader)
        wait_for(lambda: cluster.partition("v", 0).leader not in ("", leader), 20, "a new leader")
        survivor = next(b for b in sorted(cluster.live()))
        check(cluster, survivor, latest, rounds=1)
        latest = publish(cluster, survivor, 2)
        for broker in cluster.live():
            check(cluster, broker, latest, rounds=2)

        with client(cluster, survivor) as c:
            c.drop_view("v", "minutes")
        for broker in cluster.live():
            with client(cluster, broker) as c:
                assert [s.view.name for s in c.list_views("v")] == ["latest"]
                with pytest.raises(NotFound):
                    c.window_fetch("v", "minutes", b"p0-k0")


def test_views_declared_while_queries_arrive_are_built_once(tmp_path: Path) -> None:
    """Queries through every broker race the declaration (a broker builds a view it has not
    built yet when asked, while its metadata reconcile builds it too): every answer is right,
    every broker ends with one working copy, and a drop leaves none."""
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("v", partitions=PARTITIONS, replication_factor=2, min_isr=1)
        latest = publish(cluster, "b1", 1)
        errors: list[BaseException] = []

        def ask(broker: str, name: str) -> None:
            try:
                with client(cluster, broker) as c:
                    for key, value in latest.items():
                        found = c.view_get("v", name, key)
                        assert found is not None and found.value == value, (broker, key)
            except BaseException as error:  # reported below
                errors.append(error)

        for round_ in range(5):
            name = f"t{round_}"
            with client(cluster, "b1") as c:
                c.declare_view("v", View.table(name))
            threads = [threading.Thread(target=ask, args=(b, name)) for b in ("b1", "b2", "b3") * 2]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not errors, errors
            with client(cluster, "b2") as c:
                c.drop_view("v", name)
        for broker in ("b1", "b2", "b3"):
            wait_for(lambda b=broker: client_views(cluster, b) == [], 5, "views dropped")


def client_views(cluster: Cluster, broker: str) -> list[str]:
    with client(cluster, broker) as c:
        return [s.view.name for s in c.list_views("v")]
