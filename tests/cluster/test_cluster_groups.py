"""Consumer groups across a cluster (``tidelog/cluster/groups.py``): etcd plus three brokers on
loopback, spoken to over the Liftbridge API as a Liftbridge client would. Members that join
through different brokers form one group; the group outlives its coordinator (by the members'
reports, and by the controller when nobody reports); silent members expire; a stale epoch is
fenced by the partition's leader whichever broker the join went to."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.cluster.clustertools import Cluster, running_cluster, wait_for

from tidelog._proto.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.slow

FAST_GROUPS = {"TIDELOG_GROUP_CONSUMER_TIMEOUT_S": "3", "TIDELOG_GROUP_COORDINATOR_TIMEOUT_S": "5"}


def join(cluster: Cluster, via: str, consumer: str) -> pb.JoinConsumerGroupResponse:
    return cluster.api(via).JoinConsumerGroup(
        pb.JoinConsumerGroupRequest(groupId="g", consumerId=consumer, streams=["s"]), timeout=10
    )


def group_metadata(cluster: Cluster, via: str) -> pb.ConsumerGroupMetadata:
    answer = cluster.api(via).FetchMetadata(pb.FetchMetadataRequest(groups=["g"]), timeout=5)
    return answer.groupMetadata[0]


def assignments(cluster: Cluster, via: str, consumer: str, epoch: int) -> list[int]:
    answer = cluster.api(via).FetchConsumerGroupAssignments(
        pb.FetchConsumerGroupAssignmentsRequest(groupId="g", consumerId=consumer, epoch=epoch),
        timeout=5,
    )
    assert answer.epoch == epoch
    return sorted(p for a in answer.assignments if a.stream == "s" for p in a.partitions)


def other_than(cluster: Cluster, *brokers: str) -> str:
    return next(b for b in sorted(cluster.live()) if b not in brokers)


def test_members_joining_through_different_brokers_form_one_group(tmp_path: Path) -> None:
    with running_cluster(tmp_path, env=FAST_GROUPS) as cluster:
        cluster.create_stream("s", partitions=4, replication_factor=2, min_isr=1)
        first = join(cluster, "b1", "c1")
        second = join(cluster, "b2", "c2")
        assert first.coordinator == second.coordinator
        assert second.epoch == first.epoch + 1
        for broker in ("b1", "b2", "b3"):  # every broker answers the same group
            meta = group_metadata(cluster, broker)
            assert (meta.coordinator, meta.epoch) == (second.coordinator, second.epoch)
        coordinator = second.coordinator
        mine = assignments(cluster, coordinator, "c1", second.epoch)
        theirs = assignments(cluster, coordinator, "c2", second.epoch)
        assert len(mine) == len(theirs) == 2 and sorted(mine + theirs) == [0, 1, 2, 3]

        with pytest.raises(grpc.RpcError) as elsewhere:
            assignments(cluster, other_than(cluster, coordinator), "c1", second.epoch)
        assert elsewhere.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"{coordinator} is" in (elsewhere.value.details() or "")
        with pytest.raises(grpc.RpcError) as stale:
            assignments(cluster, coordinator, "c1", first.epoch)
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        # Leaving through a third broker: the other member takes every partition.
        cluster.api("b3").LeaveConsumerGroup(
            pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c2"), timeout=5
        )
        meta = group_metadata(cluster, "b1")
        assert meta.epoch == second.epoch + 1
        assert assignments(cluster, coordinator, "c1", meta.epoch) == [0, 1, 2, 3]
        cluster.api("b2").LeaveConsumerGroup(
            pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c1"), timeout=5
        )
        assert group_metadata(cluster, "b3").error == pb.ConsumerGroupMetadata.UNKNOWN_GROUP


def test_the_members_reports_move_the_group_off_a_dead_coordinator(tmp_path: Path) -> None:
    """kill -9 of the coordinator; before its lease even expires, a majority of the members
    reporting it moves the group to a live broker, members and assignments intact."""
    with running_cluster(tmp_path, env=FAST_GROUPS) as cluster:
        cluster.create_stream("s", partitions=4, replication_factor=2, min_isr=1)
        join(cluster, "b1", "c1")
        joined = join(cluster, "b2", "c2")
        coordinator, epoch = joined.coordinator, joined.epoch
        before = {c: assignments(cluster, coordinator, c, epoch) for c in ("c1", "c2")}
        cluster.kill(coordinator)
        via = other_than(cluster, coordinator)
        report = pb.ReportConsumerGroupCoordinatorRequest(
            groupId="g", consumerId="c1", coordinator=coordinator, epoch=epoch
        )
        cluster.api(via).ReportConsumerGroupCoordinator(report, timeout=5)
        report.consumerId = "c2"
        cluster.api(via).ReportConsumerGroupCoordinator(report, timeout=5)
        meta = group_metadata(cluster, via)
        assert meta.coordinator != coordinator and meta.coordinator in cluster.live()
        assert meta.epoch == epoch + 1
        after = {c: assignments(cluster, meta.coordinator, c, meta.epoch) for c in ("c1", "c2")}
        assert after == before, "the members and their partitions outlive the coordinator"


def test_a_live_coordinator_needs_a_majority_of_reports(tmp_path: Path) -> None:
    """Reports sent through different brokers add up (the controller counts them)."""
    with running_cluster(tmp_path, env=FAST_GROUPS) as cluster:
        cluster.create_stream("s", partitions=2, replication_factor=1, min_isr=1)
        for n, broker in enumerate(("b1", "b2", "b3")):
            joined = join(cluster, broker, f"c{n}")
        coordinator, epoch = joined.coordinator, joined.epoch
        report = pb.ReportConsumerGroupCoordinatorRequest(
            groupId="g", consumerId="c0", coordinator=coordinator, epoch=epoch
        )
        cluster.api("b1").ReportConsumerGroupCoordinator(report, timeout=5)
        assert group_metadata(cluster, "b1").coordinator == coordinator, "1 of 3 is no majority"
        report.consumerId = "c1"
        cluster.api("b2").ReportConsumerGroupCoordinator(report, timeout=5)
        meta = group_metadata(cluster, "b3")
        assert (meta.coordinator != coordinator, meta.epoch) == (True, epoch + 1)


def test_the_controller_moves_the_group_of_a_dead_coordinator(tmp_path: Path) -> None:
    """Nobody reports: once the coordinator's lease is gone, the controller gives the group a
    live coordinator; the members, silent meanwhile, are not expired for the gap."""
    with running_cluster(tmp_path, env=FAST_GROUPS) as cluster:
        cluster.create_stream("s", partitions=2, replication_factor=1, min_isr=1)
        join(cluster, "b1", "c1")
        joined = join(cluster, "b2", "c2")
        cluster.kill(joined.coordinator)
        via = other_than(cluster, joined.coordinator)
        meta = wait_for(
            lambda: (m := group_metadata(cluster, via)).coordinator != joined.coordinator and m,
            20,
            "a new coordinator",
        )
        assert meta.epoch == joined.epoch + 1
        for consumer in ("c1", "c2"):
            assert len(assignments(cluster, meta.coordinator, consumer, meta.epoch)) == 1


def test_silent_members_expire_and_stale_epochs_are_fenced(tmp_path: Path) -> None:
    with running_cluster(tmp_path, env=FAST_GROUPS) as cluster:
        cluster.create_stream("s", partitions=2, replication_factor=2, min_isr=1)
        join(cluster, "b1", "c1")
        joined = join(cluster, "b2", "c2")
        leader = cluster.partition("s", 0).leader
        via = other_than(cluster, leader)
        owner = next(
            c
            for c in ("c1", "c2")
            if assignments(cluster, joined.coordinator, c, joined.epoch) == [0]
        )
        # The member assigned partition 0 subscribes at the leader with the epoch it got from
        # another broker; the other, assigned partition 1, is refused there (it would fence it).
        current = subscribe(cluster, leader, owner, joined.epoch)
        other = subscribe(cluster, leader, "c2" if owner == "c1" else "c1", joined.epoch)
        with pytest.raises(grpc.RpcError) as refused:
            next(other)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not assigned to consumer" in (refused.value.details() or "")
        stale = subscribe(cluster, leader, "c1", joined.epoch - 1)
        with pytest.raises(grpc.RpcError) as refused:
            next(stale)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert next(current) == pb.Message()  # the handshake: admitted
        current.cancel()

        # c2 falls silent; c1 keeps fetching its assignments, and ends up with both partitions.
        deadline = time.monotonic() + 20
        epoch = joined.epoch
        while time.monotonic() < deadline:
            meta = group_metadata(cluster, via)
            epoch = meta.epoch
            if assignments(cluster, meta.coordinator, "c1", epoch) == [0, 1]:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the silent member was never expired")
        assert epoch == joined.epoch + 1
        with pytest.raises(grpc.RpcError) as gone:
            assignments(cluster, meta.coordinator, "c2", epoch)
        assert "not a member" in (gone.value.details() or "")


def subscribe(cluster: Cluster, broker: str, consumer: str, epoch: int) -> Any:
    return cluster.api(broker).Subscribe(
        pb.SubscribeRequest(
            stream="s",
            partition=0,
            startPosition=pb.EARLIEST,
            consumer=pb.Consumer(groupId="g", consumerId=consumer, groupEpoch=epoch),
        ),
        timeout=10,
    )
