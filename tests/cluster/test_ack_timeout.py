"""The ack timeout outlasts the ISR lag bound: a publish with ack ALL that waits for a follower
that stopped is acknowledged once the leader drops that follower from the ISR, rather than
failing at the very moment it would have been dropped (both were 5 s by default)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from tests.cluster.clustertools import publish_batch, running_cluster, wait_for

from tidelog.api.settings import ServerSettings
from tidelog.cluster.settings import ClusterSettings


def test_the_default_ack_timeout_outlasts_the_lag_bound_with_room_for_the_shrink() -> None:
    settings = ServerSettings()
    # The shrink takes a step of the leader's loop (100 ms) and an etcd write after the bound.
    assert settings.cluster_ack_timeout_s >= settings.replica_lag_max_s + 1
    node = ClusterSettings(etcd="http://127.0.0.1:1", broker_id="b", advertise="h:1")
    assert node.ack_timeout_s >= node.replica_lag_max_s + 1


@pytest.mark.slow
def test_a_publish_waiting_for_a_stopped_follower_is_acknowledged_once_it_leaves(
    tmp_path: Path,
) -> None:
    # The defaults' ratio, at test speed: lag 2 s, ack 4 s.
    env = {"TIDELOG_REPLICA_LAG_MAX_S": "2", "TIDELOG_CLUSTER_ACK_TIMEOUT_S": "4"}
    with running_cluster(tmp_path, env=env) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = wait_for(lambda: cluster.partition("s").leader, what="a leader")
        publish_batch(cluster.v1(leader), "s", [b"before"], "p", 0)
        stopped = next(b for b in sorted(cluster.servers) if b != leader)
        os.kill(cluster.servers[stopped].pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answer = publish_batch(cluster.v1(leader), "s", [b"during"], "p", 1)
            took = time.monotonic() - started
        finally:
            os.kill(cluster.servers[stopped].pid, signal.SIGCONT)
        assert answer.count == 1
        assert took < 4, f"acknowledged after {took:.1f} s"
