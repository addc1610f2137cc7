"""Clients of a cluster, unchanged: ``tidelog.Client`` given any one broker publishes to and
reads from each partition's leader, and follows a new leader after the old one is killed, with
nothing lost and nothing twice; a Liftbridge publish sent to a follower is published by the
leader; a subscription with ``readISRReplica`` reads from a follower up to the high watermark, and
every follower learns a new high watermark as soon as the leader has it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import running_cluster, wait_for

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.client import Client, ClientSettings

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback


def test_the_client_follows_the_leader_through_a_crash(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = cluster.partition("s").leader
        follower = next(b for b in cluster.servers if b != leader)
        settings = ClientSettings(ack_all=True, retry_budget_s=30)
        received: list[bytes] = []

        def read() -> None:
            with Client(cluster.servers[follower].address, settings=settings) as reader:
                for message in reader.subscribe("s", start="earliest"):
                    received.append(message.value)
                    if len(received) >= 200:
                        return

        reading = threading.Thread(target=read, daemon=True)
        reading.start()
        with Client(cluster.servers[follower].address, settings=settings) as client:
            for n in range(100):
                acks = client.publish_batch("s", [b"v%d" % n], producer_id="p", producer_sequence=n)
                assert [a.offset for a in acks] == [n]
            cluster.kill(leader)
            for n in range(100, 200):
                acks = client.publish_batch("s", [b"v%d" % n], producer_id="p", producer_sequence=n)
                assert [a.offset for a in acks] == [n]
            assert cluster.partition("s").leader != leader
        reading.join(60)
        assert not reading.is_alive(), f"the subscription stopped at {len(received)}"
        assert received == [b"v%d" % n for n in range(200)]


def test_a_liftbridge_publish_to_a_follower_is_published_by_the_leader(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = cluster.partition("s").leader
        follower = next(b for b in cluster.servers if b != leader)
        api = cluster.api(follower)
        for n in range(3):
            answer = api.Publish(
                pb.PublishRequest(stream="s", value=b"x%d" % n, ackPolicy=pb.ALL), timeout=10
            )
            assert answer.ack.offset == n
        # PublishAsync too, one answer per request, in order.
        requests = [
            pb.PublishRequest(stream="s", value=b"y%d" % n, ackPolicy=pb.ALL, correlationId=str(n))
            for n in range(5)
        ]
        answers = list(api.PublishAsync(iter(requests), timeout=20))
        assert [(a.correlationId, a.ack.offset) for a in answers] == [
            (str(n), 3 + n) for n in range(5)
        ]
        # Reading from the follower: refused unless readISRReplica, then up to the high watermark.
        try:
            next(iter(api.Subscribe(pb.SubscribeRequest(stream="s"), timeout=5)))
            raise AssertionError("a follower served a subscription")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "not partition leader" in (error.details() or "")
        wait_for(lambda: cluster.partition("s").highWatermark == 7, 10)
        replica_read = api.Subscribe(
            pb.SubscribeRequest(
                stream="s",
                startPosition=pb.EARLIEST,
                stopPosition=pb.STOP_OFFSET,
                stopOffset=7,
                readISRReplica=True,
            ),
            timeout=10,
        )
        values = []
        try:
            for message in replica_read:
                if message.value or message.offset:
                    values.append(message.value)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error  # stop reached
        assert values == [b"x0", b"x1", b"x2", b"y0", b"y1", b"y2", b"y3", b"y4"]


def test_every_follower_learns_a_publish_completed_at_once(tmp_path: Path) -> None:
    """A follower waiting at the leader's log end is answered when the high watermark moves
    (the other follower's fetch completes the publish), not when its wait ends. With the wait
    at 10 s (half of replica_lag_max_s), a read of each acknowledged message from either
    follower (ReadISRReplica, bounded by 5 s) gets it."""
    with running_cluster(tmp_path, env={"TIDELOG_REPLICA_LAG_MAX_S": "20"}) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=3)
        leader = cluster.partition("s").leader
        followers = [b for b in sorted(cluster.servers) if b != leader]
        for n in range(3):
            time.sleep(0.5)  # the followers wait at the log end
            cluster.api(leader).Publish(
                pb.PublishRequest(stream="s", value=b"m%d" % n, ackPolicy=pb.ALL), timeout=10
            )
            for follower in followers:
                assert replica_read(cluster.api(follower), n) == b"m%d" % n, (follower, n)


def replica_read(api: object, offset: int) -> bytes | None:
    """The message at ``offset`` as a follower serves it, waiting at most 5 s for it."""
    request = pb.SubscribeRequest(
        stream="s",
        startPosition=pb.OFFSET,
        startOffset=offset,
        stopPosition=pb.STOP_OFFSET,
        stopOffset=offset,
        readISRReplica=True,
    )
    try:
        for message in api.Subscribe(request, timeout=5):  # type: ignore[attr-defined]
            if message.value:
                return bytes(message.value)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # the stop offset reached
            raise AssertionError(f"no message {offset}: {error.code()} {error.details()}") from None
    return None
