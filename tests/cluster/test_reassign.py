"""Moving a partition between brokers (``tidelog cluster reassign``) with data in it: the new
replica copies the whole log, joins the ISR, the old one leaves and stops serving the partition,
and the leader hands over when it is the one leaving. ``tidelog cluster status`` shows brokers,
the controller and the partition; a single broker says it is not part of a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import publish_batch, running_cluster, stored_records, wait_for
from tests.support.server import served

from tidelog._proto.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("TIDELOG_SERVER", None)
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_partition_moves_to_a_new_replica_with_its_data(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=2, min_isr=1)
        before = cluster.partition("s")
        old_leader = before.leader
        newcomer = next(b for b in cluster.servers if b not in before.replicas)
        values = [b"r%05d" % n for n in range(3000)]
        for n in range(0, 3000, 500):
            publish_batch(cluster.v1(old_leader), "s", values[n : n + 500], "p", n)
        address = cluster.servers[newcomer].address
        keep = next(b for b in before.replicas if b != old_leader)
        moved = cli(
            "cluster", "reassign", "s", "0", "--replicas", f"{newcomer},{keep}", "--server", address
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert f"moving s/0 from {old_leader} to {newcomer},{keep}" in moved.stdout
        after = cluster.partition("s")
        assert sorted(after.replicas) == sorted([newcomer, keep])
        assert after.leader == newcomer, "the leaving leader handed over to the first target"
        shown = cli("cluster", "status", "--json", "--server", address)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert sorted(b["broker_id"] for b in status["brokers"]) == sorted(cluster.servers)
        assert sum(b["controller"] for b in status["brokers"]) == 1
        (part,) = status["partitions"]
        assert part["target"] == [] and part["leader"] == newcomer
        assert part["high_watermark"] == 2999
        table = cli("cluster", "status", "--server", address)
        assert "controller" in table.stdout and "s/0" in table.stdout
        # The broker that left refuses the partition and names the leader.
        try:
            publish_batch(cluster.v1(old_leader), "s", [b"late"], "p", 3000)
            raise AssertionError("a broker that left the partition took a publish")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert cluster.servers[newcomer].address in (error.details() or "")
        answer = publish_batch(cluster.v1(newcomer), "s", [b"late"], "p", 3000)
        assert answer.first_offset == 3000
        from_leader = pb.FetchMetadataRequest(streams=["s"])
        wait_for(
            lambda: (
                cluster.api(newcomer)
                .FetchMetadata(from_leader, timeout=2)
                .streamMetadata[0]
                .partitions[0]
                .highWatermark
                == 3000
            ),
            30,
            "the late record committed",
        )
        outsider = cluster.api(old_leader).FetchMetadata(from_leader, timeout=2)
        assert outsider.streamMetadata[0].partitions[0].highWatermark == -1  # not its to tell
        for broker_id in (newcomer, keep):
            assert cluster.servers[broker_id].stop() == 0
        copies = {b: stored_records(tmp_path / b, "s") for b in (newcomer, keep)}
    assert copies[newcomer] == copies[keep]
    assert [v for _, _, v in copies[newcomer]] == [*values, b"late"]


def test_cluster_commands_on_a_single_broker_say_it_is_not_a_cluster(tmp_path: Path) -> None:
    with served(tmp_path / "one") as server:
        shown = cli("cluster", "status", "--server", server.address)
    assert shown.returncode == 1
    assert "single broker, not part of a cluster" in shown.stdout + shown.stderr


def test_cluster_status_shows_a_dead_broker_as_down(tmp_path: Path) -> None:
    """A broker killed stays in the status (before, it vanished from the brokers, and its lag
    as a follower still showed a number): down, with no address and no lag."""
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = wait_for(lambda: cluster.partition("s").leader, what="a leader")
        publish_batch(cluster.v1(leader), "s", [b"x"], "p", 0)
        dead = next(b for b in sorted(cluster.servers) if b != leader)
        cluster.kill(dead)
        address = cluster.servers[leader].address

        def shown() -> dict | None:  # type: ignore[type-arg]
            answer = cli("cluster", "status", "s", "--json", "--server", address)
            assert answer.returncode == 0, answer.stderr
            status = json.loads(answer.stdout)
            brokers = {b["broker_id"]: b for b in status["brokers"]}
            return status if brokers.get(dead, {}).get("down") else None

        status = wait_for(shown, 20, "the dead broker shown down")
        brokers = {b["broker_id"]: b for b in status["brokers"]}
        assert sorted(brokers) == sorted(cluster.servers)
        assert brokers[dead]["address"] == "" and not brokers[dead]["controller"]
        assert not any(b["down"] for b in brokers.values() if b["broker_id"] != dead)
        (part,) = status["partitions"]
        (follower,) = [f for f in part["followers"] if f["broker_id"] == dead]
        assert follower["down"]
        table = cli("cluster", "status", "s", "--server", address)
        assert table.returncode == 0, table.stderr
        assert f"{dead}: down" in table.stdout, table.stdout
