"""The ISR under faults, with three brokers and etcd on loopback: a deposed leader (paused with
SIGSTOP until another leads, then resumed) acknowledges nothing and drops its divergent tail
when it rejoins; below minIsr, publishes with ack ALL are refused with a retryable status and
accepted again once a replica is back; a follower that was down catches up."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import grpc
import pytest
from tests.cluster.clustertools import (
    Producer,
    publish_batch,
    running_cluster,
    stored_records,
    wait_for,
)

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback


def test_a_deposed_leader_acks_nothing_and_its_tail_is_cut_when_it_rejoins(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        try:
            producer.wait_acked(20)
            deposed = cluster.partition("s").leader
            os.kill(cluster.servers[deposed].pid, signal.SIGSTOP)
            try:
                # Publishes sent to it while it sleeps wait in its socket for when it wakes.
                outcomes: list[object] = []

                def to_deposed(sequence: int) -> None:
                    try:
                        answer = publish_batch(
                            cluster.v1(deposed), "s", [b"late-%d" % sequence], "z", sequence, 20
                        )
                        outcomes.append(answer)
                    except grpc.RpcError as error:
                        outcomes.append(error.code())

                late = [threading.Thread(target=to_deposed, args=(n,)) for n in range(3)]
                for thread in late:
                    thread.start()
                new_leader = wait_for(
                    lambda: (leader := cluster.partition("s").leader) != deposed and leader,
                    30,
                    "another leader",
                )
                producer.wait_acked(10)
            finally:
                os.kill(cluster.servers[deposed].pid, signal.SIGCONT)
            for thread in late:
                thread.join(30)
            assert len(outcomes) == 3
            assert all(isinstance(o, grpc.StatusCode) for o in outcomes), outcomes
            print("the deposed leader answered", outcomes)
            wait_for(lambda: len(cluster.partition("s").isr) == 3, 30, "the deposed one back")
            producer.wait_acked(10)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        assert cluster.partition("s").leader == new_leader
        wait_for(lambda: len(cluster.partition("s").isr) == 3, 30)
        for server in cluster.servers.values():
            assert server.stop() == 0
        copies = {b: stored_records(tmp_path / b, "s") for b in cluster.servers}
    cut = [line for line in cluster.servers[deposed].stderr_lines if "never had" in line]
    print("".join(cut) or "the deposed leader had no divergent tail")
    first = copies[new_leader]
    for broker_id, records in copies.items():
        assert records == first, f"{broker_id}'s replica differs from the leader's"
    assert not [v for _, _, v in first if v.startswith(b"late-")], "a deposed leader's write"
    position = {value: offset for offset, _, value in first}
    for sequence, offsets in producer.acked.items():
        assert [position.get(v) for v in producer.values[sequence]] == list(offsets)


def test_below_min_isr_publishes_are_refused_and_accepted_again_once_a_replica_is_back(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = cluster.partition("s").leader
        answer = publish_batch(cluster.v1(leader), "s", [b"before"], "p", 0)
        assert answer.count == 1
        followers = [b for b in cluster.servers if b != leader]
        for broker_id in followers:
            cluster.kill(broker_id)
        wait_for(lambda: cluster.partition("s").isr == [leader], 30, "the ISR shrunk")
        try:
            publish_batch(cluster.v1(leader), "s", [b"alone"], "p", 1)
            raise AssertionError("a publish with ack ALL succeeded below minIsr")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "minIsr 2" in (error.details() or ""), error.details()
        cluster.start(followers[0])
        wait_for(lambda: len(cluster.partition("s").isr) == 2, 30, "a replica back in the ISR")
        retried = publish_batch(cluster.v1(leader), "s", [b"alone"], "p", 1)
        assert retried.duplicate, "the refused batch was stored and is now committed"
        after = publish_batch(cluster.v1(leader), "s", [b"after"], "p", 2)
        assert (after.first_offset, after.duplicate) == (2, False)
        part = wait_for(lambda: (p := cluster.partition("s")).highWatermark == 2 and p, 30, "hw 2")
        assert part.newestOffset == 2
        for broker_id in (leader, followers[0]):
            assert cluster.servers[broker_id].stop() == 0
        values = {b: [v for _, _, v in stored_records(tmp_path / b, "s")] for b in cluster.servers}
    assert values[leader] == values[followers[0]] == [b"before", b"alone", b"after"]
    assert values[followers[1]] == [b"before"]  # killed before the rest: it never saw them
