"""A broker of a cluster that restarts serves no partition before the cluster has told it its
role there (``cluster.node.Undecided``), and a follower whose log holds records its leader never
wrote finds them and cuts them (``cluster.replication``: the fetch's CRC of the record before).

Before, a restarted broker's gRPC port answered before its cluster node's first step, and for
those seconds (its old lease must expire before it can register again) every partition it loaded
from disk took publishes as a single broker's: appended, synced, acknowledged, then cut when it
followed the real leader, or, in the same leader epoch, kept, so the follower stopped copying for
good (every fetch failed on a timestamp older than its own newest) and never rejoined the ISR."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import (
    Cluster,
    Producer,
    copies_of,
    running_cluster,
    stop_all,
    wait_for,
)

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.log import LogConfig, NewRecord, SegmentedLog
from tidelog.process import ServerProcess, free_port

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback


def _restart_on(cluster_root: Path, server: ServerProcess, port: int) -> threading.Thread:
    """Start ``server`` again on ``port`` (the same data directory) in a thread: its start
    returns only at the ready line, after the node's first step, and the test must knock
    before that."""
    server.extra = [*server.extra, "--port", str(port)]
    thread = threading.Thread(target=server.start, daemon=True)
    thread.start()
    return thread


def test_a_restarting_ex_leader_acknowledges_nothing_before_it_knows_its_role(
    tmp_path: Path,
) -> None:
    # Restarted at once, the broker finds its own registration from before the kill alive for
    # most of a 4 s lease, and waits for it to expire: seconds in which its port answers and
    # its node has not yet read the cluster's state (a few ms when the lease had expired).
    with running_cluster(tmp_path, env={"TIDELOG_CLUSTER_LEASE_TTL_S": "4"}) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        acked: dict[int, bytes] = {}
        refused: list[str] = []
        try:
            producer.wait_acked(10)
            old = wait_for(producer.leader, what="a live leader")
            cluster.kill(old)
            port = free_port()
            starting = _restart_on(tmp_path, cluster.servers[old], port)
            # A client with stale metadata keeps sending to the broker it knew, from the moment
            # its port answers until well after it is ready.
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                api = pb_grpc.APIStub(channel)
                deadline = time.monotonic() + 30
                ready_at: float | None = None
                n = 0
                while time.monotonic() < deadline:
                    if ready_at is None and not starting.is_alive():
                        ready_at = time.monotonic()
                    if ready_at is not None and time.monotonic() > ready_at + 2:
                        break
                    value = b"stale-%d" % n
                    n += 1
                    try:
                        ack = api.Publish(
                            pb.PublishRequest(
                                stream="s", partition=0, value=value, ackPolicy=pb.AckPolicy.ALL
                            ),
                            timeout=2,
                        )
                    except grpc.RpcError as error:
                        if error.code() != grpc.StatusCode.UNAVAILABLE:
                            refused.append(f"{error.code().name}: {error.details()}")
                        time.sleep(0.01)
                        continue
                    acked[ack.ack.offset] = value
            assert ready_at is not None, "the restarted broker never became ready"
            assert cluster.servers[old].port == port, "restarted on another port"
            # It follows the new leader and is back in the ISR within seconds, under load.
            wait_for(lambda: len(cluster.partition("s").isr) == 3, 15, "the ISR back to three")
            producer.wait_acked(10)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        wait_for(lambda: len(cluster.partition("s").isr) == 3, 30)
        stop_all(cluster)
        copies = copies_of(cluster, "s")
    first = next(iter(copies.values()))
    for broker_id, records in copies.items():
        assert records == first, f"{broker_id}'s replica differs"
    stored = {offset: value for offset, _, value in first}
    lost = {o: v for o, v in acked.items() if stored.get(o) != v}
    assert not lost, f"acknowledged by the restarting broker, then lost: {sorted(lost.items())}"
    # Its node had not read the cluster's state yet: it named no leader, and said so.
    assert refused, f"the broker was never reached before its first step ({len(acked)} acked)"
    assert all("not partition leader" in r for r in refused), refused[:3]


def test_a_follower_holding_records_its_leader_never_wrote_cuts_them_and_rejoins(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        try:
            producer.wait_acked(10)
            leader = wait_for(producer.leader, what="a live leader")
            follower = next(b for b in sorted(cluster.servers) if b != leader)
            assert cluster.servers[follower].stop() == 0
            # Records no leader wrote, at the end of the stopped follower's log, stamped now:
            # the leader's records at those offsets will be others, and older.
            log = SegmentedLog(tmp_path / follower / "streams" / "s" / "0", LogConfig())
            try:
                log.append([NewRecord(b"foreign-%d" % i) for i in range(3)])
                log.flush()
            finally:
                log.close()
            producer.wait_acked(20)  # the leader goes on past them in the same leader epoch
            cluster.start(follower)
            wait_for(lambda: len(cluster.partition("s").isr) == 3, 15, "the follower rejoined")
            producer.wait_acked(10)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        stop_all(cluster)
        logs = cluster.servers[follower].stderr_lines
        copies = copies_of(cluster, "s")
    first = copies[leader]
    for broker_id, records in copies.items():
        assert records == first, f"{broker_id}'s replica differs"
    assert not any(v.startswith(b"foreign") for _, _, v in first)
    assert any("cutting back" in line for line in logs), "the divergence was not what cut them"


def _publish_to(cluster: Cluster, partition: int, value: bytes) -> None:
    leader = wait_for(lambda: cluster.partition("s", partition).leader, what="a leader")
    cluster.api(leader).Publish(
        pb.PublishRequest(stream="s", partition=partition, value=value, ackPolicy=pb.AckPolicy.ALL),
        timeout=10,
    )


def test_a_stream_deleted_while_a_broker_was_away_is_refused_there_and_replaced_when_recreated(
    tmp_path: Path,
) -> None:
    """The broker keeps the files (a broker pointed at the wrong etcd must not delete its
    data) but serves nothing of them: NOT_FOUND, not "no leader now; retry" for ever. Once the
    cluster creates the name again, they go, and its replicas there start empty: with three
    partitions it leads one of the new stream, which would otherwise serve the old records."""
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2, partitions=3)
        for n in range(3):
            _publish_to(cluster, n, b"old-%d" % n)
        away = "b3"

        def away_holds_them() -> bool:
            answer = cluster.api(away).FetchMetadata(
                pb.FetchMetadataRequest(streams=["s"]), timeout=2
            )
            return all(p.newestOffset == 0 for p in answer.streamMetadata[0].partitions.values())

        wait_for(away_holds_them, 20, "the broker to be away holds the old records")
        assert cluster.servers[away].stop() == 0
        cluster.api("b1").DeleteStream(pb.DeleteStreamRequest(name="s"), timeout=20)
        cluster.start(away)
        with pytest.raises(grpc.RpcError) as refused:
            cluster.api(away).Publish(
                pb.PublishRequest(stream="s", value=b"x", ackPolicy=pb.AckPolicy.ALL), timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
        cluster.create_stream("s", replication_factor=3, min_isr=2, partitions=3)
        leaders = {cluster.partition("s", n).leader for n in range(3)}
        for n in range(3):
            _publish_to(cluster, n, b"new-%d" % n)
        wait_for(
            lambda: all(len(cluster.partition("s", n).isr) == 3 for n in range(3)),
            20,
            "every replica in sync",
        )
        stop_all(cluster)
        copies = {
            (b, n): [v for _, _, v in records]
            for n in range(3)
            for b, records in copies_of(cluster, "s", n).items()
        }
    assert away in leaders, f"{away} leads none of the new partitions: {leaders}"
    assert all(values == [b"new-%d" % n] for (_, n), values in copies.items()), copies
