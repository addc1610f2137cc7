"""Three brokers and etcd on loopback: the leader of a replicated partition (RF 3, minIsr 2) is
killed with SIGKILL while a producer publishes with ack policy ALL, round after round, and
restarted. No acknowledged message is lost, none is stored twice, and once the cluster settles
every replica holds the same records, offsets and timestamps included. The same holds through a
rolling restart, each broker stopped gracefully and started again in turn."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.cluster.clustertools import (
    Producer,
    copies_of,
    running_cluster,
    stop_all,
    wait_for,
)

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback


def test_killing_the_leader_twenty_times_loses_no_acknowledged_message(tmp_path: Path) -> None:
    # Followers append each fetch 20 ms late: the leader is always ahead of them, so an ack that
    # did not wait for the ISR would be lost with the leader (checked by hand: it is).
    slow = {"TIDELOG_TEST_REPLICA_FETCH_DELAY_S": "0.02"}
    with running_cluster(tmp_path, env=slow) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        try:
            producer.wait_acked(20)
            leaders = []
            for _ in range(20):
                leader = wait_for(producer.leader, what="a live leader")
                leaders.append(leader)
                cluster.kill(leader)
                producer.wait_acked(10)  # a new leader acknowledges with ALL
                cluster.start(leader)
                wait_for(lambda: len(cluster.partition("s").isr) == 3, 30, "the ISR back to three")
                producer.wait_acked(5)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        assert len(set(leaders)) >= 2, leaders
        # Settle: every replica has the leader's log end.
        wait_for(
            lambda: (
                len({cluster.partition("s").newestOffset}) == 1
                and len(cluster.partition("s").isr) == 3
            ),
            30,
        )
        stop_all(cluster)
        copies = copies_of(cluster, "s")

    first = next(iter(copies.values()))
    for broker_id, records in copies.items():
        assert records == first, f"{broker_id}'s replica differs"
    stored = [value for _, _, value in first]
    assert len(stored) == len(set(stored)), "a value is stored twice"
    position = {value: offset for offset, _, value in first}
    for sequence, offsets in producer.acked.items():
        values = producer.values[sequence]
        assert [position.get(v) for v in values] == list(offsets), f"batch {sequence} lost"
    print(
        f"{len(producer.acked)} batches acknowledged, {producer.failures} retries, "
        f"leaders killed in turn: {leaders}"
    )


def test_a_rolling_restart_of_every_broker_under_load_loses_nothing(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        producer = Producer(cluster, "s")
        producer.start()
        try:
            producer.wait_acked(20)
            for broker_id in sorted(cluster.servers):
                server = cluster.servers[broker_id]
                code = server.stop()  # SIGTERM: a graceful restart
                assert code == 0, f"{broker_id} exited {code}: {''.join(server.stderr_lines[-30:])}"
                producer.wait_acked(10)
                cluster.start(broker_id)
                wait_for(lambda: len(cluster.partition("s").isr) == 3, 30, "the ISR back")
                producer.wait_acked(10)
        finally:
            producer.stop.set()
            producer.join(30)
        assert producer.error is None, producer.error
        wait_for(lambda: len(cluster.partition("s").isr) == 3, 30)
        stop_all(cluster)
        copies = copies_of(cluster, "s")
    first = next(iter(copies.values()))
    assert all(records == first for records in copies.values())
    stored = [value for _, _, value in first]
    assert len(stored) == len(set(stored))
    position = {value: offset for offset, _, value in first}
    for sequence, offsets in producer.acked.items():
        assert [position.get(v) for v in producer.values[sequence]] == list(offsets)
