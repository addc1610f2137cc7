"""``SetStreamReadonly`` in a cluster: set through any broker, applied by every replica, so the
partition stays read-only when its leader dies, and writable again for all once cleared."""

from __future__ import annotations

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
