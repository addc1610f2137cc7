"""Brokers trust brokers by certificate: etcd over TLS with client certificates and its own
authentication, brokers calling each other over mutual TLS under an ACL, a follower's id taken
from its certificate (a fetch in another broker's name is refused), and nothing acknowledged
lost when the leader is killed under ack ALL publishes over all of it."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import (
    Cluster,
    Producer,
    copies_of,
    publish_batch,
    running_cluster,
    stop_all,
    stored_records,
    wait_for,
)
from tests.cluster.tlstools import make_pki, running_tls_cluster

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.process import EtcdTls, ServerProcess, running_etcd

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback

PUBLISHES = 5


@dataclass
class Spoofed:
    """What happened while a client fetched in the paused follower's name."""

    spoof: grpc.StatusCode | None = None
    """How the leader answered the spoofing fetch (None: it served it)."""
    fetched: int = 0
    acked: list[bytes] = field(default_factory=list)
    refused: list[grpc.StatusCode] = field(default_factory=list)
    isr: list[str] = field(default_factory=list)
    """The ISR once the publishes were answered."""
    survived: list[bytes] = field(default_factory=list)
    """What the paused follower holds in the end (it leads once the leader is killed, when it
    was still in the ISR)."""


def spoof_a_paused_follower(cluster: Cluster) -> Spoofed:
    """RF 2, minIsr 2: the follower is paused (SIGSTOP) while a client fetches in its name from
    the leader (keeping it in the ISR if the leader believes the claim), and publishes with ack
    ALL are sent; then the leader is killed and the follower resumed, so it leads."""
    cluster.create_stream("s", replication_factor=2, min_isr=2)
    wait_for(lambda: len(cluster.partition("s").isr) == 2, 30, "both replicas in sync")
    leader = cluster.partition("s").leader
    (follower,) = [b for b in cluster.servers if b != leader]
    status = cluster_pb2_grpc.ClusterAdminStub(cluster.channel(leader)).ClusterStatus(
        cpb.ClusterStatusRequest(stream="s", local_only=True), timeout=5
    )
    epoch = status.partitions[0].leader_epoch
    outcome = Spoofed()
    stop = threading.Event()
    replication = cluster_pb2_grpc.ReplicationStub(cluster.channel(leader))

    def impersonate() -> None:
        offset = 0
        deadline = time.monotonic() + 60  # bounded: the test stops it well before
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                answer = replication.ReplicaFetch(
                    cpb.ReplicaFetchRequest(
                        stream="s",
                        partition=0,
                        follower=follower,
                        leader_epoch=epoch,
                        fetch_offset=offset,
                        max_records=100,
                        max_wait_ms=200,
                    ),
                    timeout=5,
                )
            except grpc.RpcError as error:
                outcome.spoof = error.code()
                return
            offset += len(answer.stored_sizes) // 8  # one int64 per record
            outcome.fetched = offset

    def publish(n: int) -> None:
        value = b"acked-%d" % n
        try:
            publish_batch(cluster.v1(leader), "s", [value], f"p{n}", 0, timeout=15)
            outcome.acked.append(value)
        except grpc.RpcError as error:
            outcome.refused.append(error.code())

    os.kill(cluster.servers[follower].pid, signal.SIGSTOP)
    try:
        # The follower's last fetch, held at the leader, times out first (the fetch wait: half
        # the lag bound, 1 s here): answered with a record it would take on waking.
        time.sleep(1.5)
        spoofer = threading.Thread(target=impersonate, daemon=True)
        spoofer.start()
        publishers = [threading.Thread(target=publish, args=(n,)) for n in range(PUBLISHES)]
        for thread in publishers:
            thread.start()
        for thread in publishers:
            thread.join(30)
        stop.set()
        spoofer.join(10)
        outcome.isr = list(cluster.partition("s").isr)
        cluster.kill(leader)
    finally:
        os.kill(cluster.servers[follower].pid, signal.SIGCONT)
    if follower in outcome.isr:  # it can be elected: it leads once back
        wait_for(lambda: cluster.partition("s").leader == follower, 30, f"{follower} leading")
    assert cluster.servers[follower].stop() == 0
    outcome.survived = [value for _, _, value in stored_records(cluster.root / follower, "s")]
    return outcome


def test_without_client_certificates_a_fetch_in_a_followers_name_is_believed(
    tmp_path: Path,
) -> None:
    """The documented gap of a cluster without mutual TLS (docs/security.md): the claim is all
    the leader has, so a client that can reach it keeps a stopped follower in the ISR, and what
    it acknowledges is lost with the leader. The test that follows closes it."""
    with running_cluster(tmp_path, brokers=2) as cluster:
        outcome = spoof_a_paused_follower(cluster)
    print(outcome)
    assert outcome.spoof is None and outcome.fetched == PUBLISHES
    assert len(outcome.acked) == PUBLISHES
    assert len(outcome.isr) == 2, "the stopped follower stayed in the ISR"
    assert outcome.survived == [], "it led, without what was acknowledged"


def test_with_mutual_tls_a_fetch_in_another_brokers_name_is_refused(tmp_path: Path) -> None:
    # The spoofer presents admin's certificate: a super-user, so the ACL lets it make
    # inter-broker calls; what stops it is that its principal is not the follower it claims.
    with running_tls_cluster(tmp_path, brokers=2) as cluster:
        outcome = spoof_a_paused_follower(cluster)
    print(outcome)
    assert outcome.spoof == grpc.StatusCode.PERMISSION_DENIED
    assert outcome.acked == [], "a publish was acknowledged with the follower stopped"
    assert outcome.refused == [grpc.StatusCode.UNAVAILABLE] * PUBLISHES
    assert len(outcome.isr) == 1, "the stopped follower left the ISR"
    assert set(outcome.acked) <= set(outcome.survived)


def test_a_leader_kill_under_ack_all_over_tls_everywhere_loses_nothing(tmp_path: Path) -> None:
    slow = {"TIDELOG_TEST_REPLICA_FETCH_DELAY_S": "0.02"}  # the leader always ahead
    with running_tls_cluster(tmp_path, env=slow) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        try:
            producer.wait_acked(20)
            killed = []
            for _ in range(2):
                leader = wait_for(producer.leader, what="a live leader")
                killed.append(leader)
                cluster.kill(leader)
                producer.wait_acked(10)  # a new leader acknowledges with ALL, over mTLS
                cluster.start(leader)
                wait_for(lambda: len(cluster.partition("s").isr) == 3, 30, "the ISR back to three")
                producer.wait_acked(5)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        wait_for(lambda: len(cluster.partition("s").isr) == 3, 30)
        # The calls a broker hands to another, each over mutual TLS in its own name: a publish
        # to a broker that does not lead (forwarded to the leader), and the status fan-out.
        leader = cluster.partition("s").leader
        for broker_id in sorted(cluster.servers):
            request = pb.PublishRequest(stream="s", value=broker_id.encode(), ackPolicy=pb.ALL)
            assert cluster.api(broker_id).Publish(request, timeout=10).ack.offset >= 0
            status = cluster_pb2_grpc.ClusterAdminStub(cluster.channel(broker_id)).ClusterStatus(
                cpb.ClusterStatusRequest(stream="s"), timeout=10
            )
            (partition,) = status.partitions
            assert partition.leader == leader and partition.high_watermark > 0, partition
            assert all(f.log_end > 0 for f in partition.followers), partition
        stop_all(cluster)
        copies = copies_of(cluster, "s")
    first = next(iter(copies.values()))
    for broker_id, records in copies.items():
        assert records == first, f"{broker_id}'s replica differs"
    position = {value: offset for offset, _, value in first}
    for sequence, offsets in producer.acked.items():
        values = producer.values[sequence]
        assert [position.get(v) for v in values] == list(offsets), f"batch {sequence} lost"
    assert {b"b1", b"b2", b"b3"} <= set(position)
    print(f"{len(producer.acked)} batches acknowledged over TLS; leaders killed: {killed}")


def test_etcd_with_tls_refuses_a_broker_without_a_certificate_clearly(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    etcd = pki.issued("etcd")
    with running_etcd(tmp_path / "etcd", tls=EtcdTls(etcd.cert, etcd.key, pki.ca.cert)) as url:
        broker = ServerProcess(
            tmp_path / "b1",
            "--cluster",
            url,
            "--broker-id",
            "b1",
            env={"TIDELOG_ETCD_CA": str(pki.ca.cert)},  # etcd's CA, but no client certificate
        )
        with pytest.raises(RuntimeError):
            broker.start(timeout=20)
        assert broker.process is not None and broker.process.wait(10) != 0
        said = "".join(broker.stderr_lines)
        assert "refused this broker's TLS handshake" in said, said
        assert "etcd_cert" in said, said
        assert "Traceback" not in said, said
        print(said.strip().splitlines()[-1])
