"""DescribeStream and ListGroups over a real server: what the console shows of a stream (offsets
held, bytes, effective settings, paused and read-only) and of consumer groups (members and
assignments); an unknown stream is NOT_FOUND."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tests.support.server import served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import Client, NotFound

pytestmark = pytest.mark.slow


def test_a_stream_is_described_with_its_effective_settings(tmp_path: Path) -> None:
    with served(tmp_path / "data") as process, Client(process.address) as client:
        client.create_stream(
            "orders", partitions=3, retention_messages=1000, retention_age_s=3600, compact=True
        )
        for n in range(7):
            client.publish("orders", b"v%d" % n, key=b"k", partition=n % 2)
        client.pause_stream("orders", [2])
        client.set_stream_readonly("orders", True, [1])
        details = client.describe_stream("orders")
        defaults = client.describe_stream("__cursors").settings
        with pytest.raises(NotFound, match="nope"):
            client.describe_stream("nope")
    assert details.stream == "orders"
    p0, p1, p2 = details.partitions
    assert (p0.oldest_offset, p0.newest_offset, p0.messages, p0.messages_in) == (0, 3, 4, 4)
    assert (p1.oldest_offset, p1.newest_offset, p1.messages) == (0, 2, 3)
    assert p0.size_bytes > 0 and p0.bytes_in == 8  # four 2-byte values
    assert p1.readonly and not p1.paused and not p0.readonly
    assert p2.paused and p2.size_bytes == -1 and p2.messages == 0
    settings = details.settings
    assert settings.retention_messages == 1000 and settings.retention_age_s == 3600
    assert settings.compact and settings.retention_bytes is None
    assert settings.max_message_bytes == defaults.max_message_bytes > 0  # the server's default


def test_groups_are_listed_with_members_and_assignments(tmp_path: Path) -> None:
    with served(tmp_path / "data") as process, Client(process.address) as client:
        assert client.list_groups() == []
        client.create_stream("orders", partitions=4)
        with grpc.insecure_channel(process.address) as channel:
            api = pb_grpc.APIStub(channel)
            for consumer in ("c1", "c2"):
                api.JoinConsumerGroup(
                    pb.JoinConsumerGroupRequest(
                        groupId="billing", consumerId=consumer, streams=["orders"]
                    )
                )
        (group,) = client.list_groups()
    assert group.group_id == "billing" and group.epoch >= 1
    assert [m.consumer_id for m in group.members] == ["c1", "c2"]
    assert all(m.streams == ("orders",) and 0 <= m.idle_s < 30 for m in group.members)
    assigned = sorted(p for by_stream in group.assignments.values() for p in by_stream["orders"])
    assert assigned == [0, 1, 2, 3]
    assert set(group.assignments) == {"c1", "c2"}
