"""``SetStreamReadonly`` in a cluster: set through any broker, applied by every replica, so the
partition stays read-only when its leader dies, and writable again for all once cleared."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import Cluster, running_cluster, wait_for

from tidelog._proto.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.slow


def publish(cluster: Cluster, partition: int) -> grpc.StatusCode:
    leader = cluster.partition("r", partition).leader
    try:
        cluster.api(leader).Publish(
            pb.PublishRequest(stream="r", partition=partition, value=b"x", ackPolicy=pb.LEADER),
            timeout=5,
        )
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def readonly_seen(cluster: Cluster, partition: int) -> set[bool]:
    """The flag as every live broker reports it."""
    seen = set()
    for broker in cluster.live():
        answer = cluster.api(broker).FetchMetadata(pb.FetchMetadataRequest(streams=["r"]))
        seen.add(answer.streamMetadata[0].partitions[partition].readonly)
    return seen


def test_a_read_only_partition_stays_read_only_on_a_new_leader(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("r", partitions=2, replication_factor=3, min_isr=1)
        leader = cluster.partition("r", 0).leader
        elsewhere = next(b for b in sorted(cluster.live()) if b != leader)
        cluster.api(elsewhere).SetStreamReadonly(
            pb.SetStreamReadonlyRequest(name="r", partitions=[0], readonly=True), timeout=10
        )
        wait_for(lambda: publish(cluster, 0) == grpc.StatusCode.FAILED_PRECONDITION, 5)
        assert publish(cluster, 1) == grpc.StatusCode.OK, "only the partition named"
        wait_for(lambda: readonly_seen(cluster, 0) == {True}, 5, "every broker's metadata")
        assert readonly_seen(cluster, 1) == {False}

        cluster.kill(leader)
        wait_for(lambda: cluster.partition("r", 0).leader not in ("", leader), 20)
        assert publish(cluster, 0) == grpc.StatusCode.FAILED_PRECONDITION, "the new leader too"

        with pytest.raises(grpc.RpcError) as internal:
            cluster.api(elsewhere).SetStreamReadonly(
                pb.SetStreamReadonlyRequest(name="__cursors", readonly=True), timeout=10
            )
        assert internal.value.code() == grpc.StatusCode.PERMISSION_DENIED
        cluster.api(elsewhere).SetStreamReadonly(
            pb.SetStreamReadonlyRequest(name="r", readonly=False), timeout=10
        )
        wait_for(lambda: publish(cluster, 0) == grpc.StatusCode.OK, 5, "writable again")


def test_replicated_partitions_are_never_paused(tmp_path: Path) -> None:
    """Auto-pause is per broker: on a follower, which takes no publishes, it used to close the
    replica and stop its replication (the ISR then shrank below minIsr and ack ALL failed).
    Replicated partitions are not auto-paused, and PauseStream on them is refused."""
    env = {"TIDELOG_MAINTENANCE_INTERVAL_S": "0.2"}
    with running_cluster(tmp_path, env=env) as cluster:
        request = pb.CreateStreamRequest(name="r", subject="r", replicationFactor=3, partitions=1)
        request.minIsr.value = 3
        request.autoPauseTime.value = 500  # ms
        cluster.api("b1").CreateStream(request, timeout=20)
        assert publish_all(cluster) == grpc.StatusCode.OK
        time.sleep(2.0)  # four times the auto-pause time, ten maintenance passes
        assert publish_all(cluster) == grpc.StatusCode.OK, "every replica still replicates"
        assert readonly_seen(cluster, 0) == {False}
        for broker in cluster.live():
            answer = cluster.api(broker).FetchMetadata(pb.FetchMetadataRequest(streams=["r"]))
            assert not answer.streamMetadata[0].partitions[0].paused, broker
        with pytest.raises(grpc.RpcError) as refused:
            cluster.api("b2").PauseStream(pb.PauseStreamRequest(name="r"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "replicat" in (refused.value.details() or "")


def publish_all(cluster: Cluster) -> grpc.StatusCode:
    leader = cluster.partition("r", 0).leader
    try:
        cluster.api(leader).Publish(
            pb.PublishRequest(stream="r", partition=0, value=b"x", ackPolicy=pb.ALL), timeout=10
        )
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_a_stream_of_more_partitions_than_one_etcd_transaction_holds(tmp_path: Path) -> None:
    """etcd refuses a transaction of more than 128 operations: 200 partitions (and their
    read-only flags) are written in steps, and the stream works as any other. Leases and lag
    at the production defaults: nothing here is about failover, and opening 600 replicas on a
    loaded machine may hold a broker's loop longer than the failover tests' 2 s."""
    env = {"TIDELOG_CLUSTER_LEASE_TTL_S": "10", "TIDELOG_REPLICA_LAG_MAX_S": "5"}
    with running_cluster(tmp_path, env=env) as cluster:
        cluster.create_stream("r", partitions=200, replication_factor=3, min_isr=2)
        partitions = cluster.metadata("r").partitions
        assert sorted(partitions) == list(range(200))
        assert all(p.leader and len(p.replicas) == 3 for p in partitions.values())
        for number in (0, 127, 128, 199):
            leader = cluster.partition("r", number).leader
            cluster.api(leader).Publish(
                pb.PublishRequest(stream="r", partition=number, value=b"x", ackPolicy=pb.ALL),
                timeout=10,
            )
        cluster.api("b2").SetStreamReadonly(
            pb.SetStreamReadonlyRequest(name="r", readonly=True), timeout=10
        )
        wait_for(lambda: publish(cluster, 199) == grpc.StatusCode.FAILED_PRECONDITION, 5)
        assert publish(cluster, 0) == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as taken:
            cluster.create_stream("r", partitions=200, replication_factor=1, min_isr=1)
        assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
