"""Cursors in a cluster: ``__cursors`` becomes a replicated stream on first use (three replicas,
minIsr 2), a cursor set is acknowledged once the ISR has it, a follower refuses cursor calls as
Liftbridge does (naming the leader), and every cursor survives the death of its partition's
leader: the new leader rebuilds its index from its copy of the log."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import running_cluster, wait_for

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.client import Client

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback

CURSORS = 30


def fetch_all(address: str) -> list[int]:
    with Client(address) as client:
        return [client.fetch_cursor(f"c{i}", "orders", i % 3) for i in range(CURSORS)]


def test_cursors_survive_the_death_of_their_leader(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        with Client(cluster.servers["b1"].address) as client:
            client.create_stream("orders", partitions=3)  # a cursor names a partition that exists
            for i in range(CURSORS):
                client.set_cursor(f"c{i}", "orders", i % 3, 100 + i)
        meta = cluster.partition("__cursors")
        assert len(meta.replicas) == 3
        assert len(meta.isr) >= 2
        leader = meta.leader

        follower = next(b for b in meta.replicas if b != leader)
        request = pb.FetchCursorRequest(cursorId="c0", stream="orders", partition=0)
        with pytest.raises(grpc.RpcError) as refused:
            cluster.api(follower).FetchCursor(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not partition leader" in (refused.value.details() or "")
        assert cluster.servers[leader].address in (refused.value.details() or "")

        cluster.kill(leader)
        wait_for(
            lambda: cluster.partition("__cursors").leader not in ("", leader), 30, "a new leader"
        )
        survivor = cluster.live()[0]
        assert fetch_all(cluster.servers[survivor].address) == [100 + i for i in range(CURSORS)]
        with Client(cluster.servers[survivor].address) as client:
            client.set_cursor("c0", "orders", 0, 555)

        # The old leader comes back as a follower and catches up; then its successor dies.
        cluster.start(leader)
        wait_for(lambda: len(cluster.partition("__cursors").isr) == 3, 30, "the ISR back")
        second = cluster.partition("__cursors").leader
        cluster.kill(second)
        wait_for(
            lambda: cluster.partition("__cursors").leader not in ("", second), 30, "a new leader"
        )
        wanted = [555] + [100 + i for i in range(1, CURSORS)]
        for broker_id in cluster.live():  # any broker: the client finds the leader
            assert fetch_all(cluster.servers[broker_id].address) == wanted
