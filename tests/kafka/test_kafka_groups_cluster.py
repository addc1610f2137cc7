"""A Kafka consumer group in a cluster: etcd and three brokers as processes, each with a Kafka
listener, ``__cursors`` in six partitions (so a group's offsets, one cursor key per topic and
partition, hash to partitions that different brokers lead), and a group of two confluent-kafka
members (``kafka_group_member.py`` processes that commit every message synchronously).

- The coordinator takes every commit and answers every OffsetFetch, whichever broker leads the
  cursor partition each key hashes to (it hands those on): the group's commits are on at least
  two brokers' partitions, and OffsetFetch from the coordinator lists every partition's.
- The members stop and start again: they resume from the commits (no message below them read).
- The coordinator is killed with SIGKILL mid-run: FindCoordinator names another broker, the
  members join there, no acknowledged commit is lost (OffsetFetch from the new coordinator is at
  least each partition's last acknowledged commit), and consumption goes on, repeating only past
  the last commit (no offset committed twice).
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest
from tests.cluster.clustertools import wait_for
from tests.kafka.kafka_wire import call, connect
from tests.kafka.test_kafka_cluster import SETTLE_S, KafkaCluster, kafka_cluster
from tests.kafka.test_kafka_groups_clients import (
    Member,
    check_delivery,
    consumed,
    shares,
    until,
)

from tidelog.client import Client

pytestmark = pytest.mark.slow  # etcd and three brokers, members as processes, a kill -9

TOPIC = "orders"
PARTITIONS = 6
CURSOR_PARTITIONS = 6


def cursor_partition(group: str, topic: str, partition: int) -> int:
    """The ``__cursors`` partition a group's offset of (topic, partition) is kept on (CRC-32 of
    the cursor key, as the cursor store places keys; ``docs/format.md``)."""
    key = f"__group:{group},{topic},{partition}".encode()
    return zlib.crc32(key) % CURSOR_PARTITIONS


def group_partition(group: str) -> int:
    """The ``__cursors`` partition whose leader coordinates ``group``."""
    return zlib.crc32(f"__group:{group}".encode()) % CURSOR_PARTITIONS


def cursor_leaders(cluster: KafkaCluster) -> dict[int, str]:
    """``__cursors`` partition -> its leader, once every partition has one and a full ISR."""

    def settled() -> dict[int, str] | None:
        status = cluster.status("__cursors")
        parts = {p.partition: p for p in status.partitions}
        ready = len(parts) == CURSOR_PARTITIONS and all(
            p.leader and cluster.alive(p.leader) and len(p.isr) >= 2 for p in parts.values()
        )
        return {n: p.leader for n, p in parts.items()} if ready else None

    return wait_for(settled, SETTLE_S, "__cursors led")


def find_coordinator(port: int, group: str) -> int | None:
    """The coordinator's node id as the broker on ``port`` answers (None: none now)."""
    with contextlib.suppress(OSError, AssertionError), connect(port) as sock:
        answer = call(sock, FindCoordinatorRequest(key=group, key_type=0))
        return int(answer.node_id) if answer.error_code == ErrorCode.none else None
    return None


def committed(port: int, group: str) -> dict[int, int] | None:
    """Partition -> committed offset of ``group`` on :data:`TOPIC`, as OffsetFetch (every
    partition with a commit) answers on ``port``; None when it answers an error."""
    with contextlib.suppress(OSError, AssertionError), connect(port) as sock:
        answer = call(sock, OffsetFetchRequest(group_id=group, topics=None, require_stable=False))
        if answer.error_code != ErrorCode.none:
            return None
        found: dict[int, int] = {}
        for topic in answer.topics:
            for p in topic.partitions:
                if p.error_code != ErrorCode.none:
                    return None
                if topic.name == TOPIC:
                    found[p.partition_index] = p.committed_offset
        return found
    return None


def commit(port: int, group: str, offsets: dict[int, int]) -> dict[int, ErrorCode]:
    """Partition -> error of a commit of ``offsets`` on :data:`TOPIC` without a generation (a
    group with no members), sent to ``port``."""
    partitions = tuple(
        OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=""
        )
        for p, o in offsets.items()
    )
    body = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(OffsetCommitRequestTopic(name=TOPIC, partitions=partitions),),
    )
    with connect(port) as sock:
        answer = call(sock, body)
    return {p.partition_index: p.error_code for p in answer.topics[0].partitions}


def acked(group: list[Member]) -> dict[int, int]:
    """Partition -> the highest commit a member had acknowledged."""
    best: dict[int, int] = {}
    for member in group:
        for event in member.of("committed"):
            best[event["p"]] = max(best.get(event["p"], 0), event["o"])
    return best


def produce(bootstrap: str, values: range) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "retry.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 2_000,
        }
    )
    for n in values:
        producer.produce(TOPIC, value=str(n).encode(), partition=n % PARTITIONS)
    assert producer.flush(90) == 0


@contextlib.contextmanager
def members(bootstrap: str, group: str, count: int = 2) -> Iterator[list[Member]]:
    started = [Member("confluent", bootstrap, group, TOPIC, "range") for _ in range(count)]
    try:
        yield started
    finally:
        for member in started:
            member.kill()


def test_a_group_commits_resumes_and_outlives_its_coordinator(tmp_path: Any) -> None:
    env = {"TIDELOG_CURSOR_PARTITIONS": str(CURSOR_PARTITIONS)}
    with kafka_cluster(tmp_path, env) as cluster:
        with Client(cluster.servers["1"].address) as client:
            client.create_stream(TOPIC, partitions=PARTITIONS, replication_factor=3, min_isr=2)
        bootstrap = cluster.bootstrap()
        ports = {int(b): cluster.kafka_ports[b] for b in cluster.kafka_ports}
        # __cursors is made at the first group call; then pick a group whose offsets hash to
        # cursor partitions led by another broker than its coordinator's
        wait_for(lambda: find_coordinator(ports[1], "any") is not None, SETTLE_S, "a coordinator")
        leaders = cursor_leaders(cluster)
        group = next(
            g
            for g in (f"billing-{n}" for n in range(100))
            if {leaders[cursor_partition(g, TOPIC, p)] for p in range(PARTITIONS)}
            - {leaders[group_partition(g)]}
        )
        coordinator = leaders[group_partition(group)]
        elsewhere = {leaders[cursor_partition(group, TOPIC, p)] for p in range(PARTITIONS)}
        assert elsewhere - {coordinator}, "every offset would be on the coordinator's partition"

        # a commit of offset 0 (stored -1: nothing read yet) on another broker's partition is
        # told apart from no commit there
        zero_p = next(
            p
            for p in range(PARTITIONS)
            if leaders[cursor_partition(group, TOPIC, p)] != coordinator
        )
        at = ports[int(coordinator)]
        assert commit(at, group, {zero_p: 0}) == {zero_p: ErrorCode.none}
        assert committed(at, group) == {zero_p: 0}

        # 1. two members consume and commit everything
        produce(bootstrap, range(0, 300))
        with members(bootstrap, group) as first:
            until(shares(first, PARTITIONS), "the partitions shared", 60)
            until(lambda: len(consumed(first)) >= 300, "the first 300 consumed", 60)
            until(lambda: sum(acked(first).values()) == 300, "the first 300 committed", 60)
            check_delivery(first, range(0, 300))
            for member in first:
                member.stop()
        ends = acked(first)
        assert ends == {p: 50 for p in range(PARTITIONS)}, ends
        fetched = committed(ports[int(coordinator)], group)
        assert fetched == ends, f"OffsetFetch from the coordinator: {fetched}"
        with Client(cluster.servers[coordinator].address) as client:
            assert client.fetch_cursor(f"__group:{group}", TOPIC, 0) == 49  # the last processed

        # 2. restarted, they resume from the commits; 3. the coordinator dies mid-run
        produce(bootstrap, range(300, 900))
        with members(bootstrap, group) as second:
            until(shares(second, PARTITIONS), "the partitions shared again", 60)
            until(lambda: len(consumed(second)) >= 100, "100 more consumed", 60)
            at_kill = acked(second)
            cluster.kill(coordinator)
            survivor = next(b for b in ports if str(b) != coordinator)

            def moved() -> int | None:
                found = find_coordinator(ports[survivor], group)
                return found if found is not None and str(found) != coordinator else None

            new = wait_for(moved, SETTLE_S, "a new coordinator")
            # no acknowledged commit lost: the new coordinator has each, or a later one
            after = wait_for(lambda: committed(ports[new], group), SETTLE_S, "OffsetFetch")
            for partition, offset in at_kill.items():
                assert after.get(partition, -1) >= offset, (partition, offset, after)
            produce(bootstrap, range(900, 1200))
            until(
                lambda: {str(n) for n in range(300, 1200)} <= set(consumed(second)),
                "every message consumed after the coordinator's death",
                90,
            )
            until(lambda: sum(acked(second).values()) == 1200, "every message committed", 60)
            for member in second:
                member.stop()
        # resumed from the commits: nothing below them read again
        reread = [e for m in second for e in m.of("got") if e["o"] < ends[e["p"]]]
        assert not reread, reread[:5]
        failed = sum(len(m.of("commit-failed")) for m in second)
        repeated = sum(n - 1 for n in consumed(second).values() if n > 1)
        print(
            f"group {group}: coordinator {coordinator} (killed), then {new}; offsets on the "
            f"partitions of {sorted(elsewhere)}; after the kill {failed} commits failed, "
            f"{repeated} messages read again"
        )
        check_delivery(second, range(300, 1200))
        final = acked(second)
        assert final == {p: 200 for p in range(PARTITIONS)}, final
        assert committed(ports[new], group) == final
