"""A consumer group across a crash of a real server (``kill -9``), through the Liftbridge stubs.

Two members of one group share a three-partition stream and commit their positions as cursors
(``__group:<group>``, as Liftbridge's clients do). After the crash and a restart on the same data
directory they carry on without joining again: their old epoch still fetches the same
assignments and still subscribes, they resume at their cursor + 1, and in the end every
published message was processed, the only repeats being those processed after the last commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc

STREAM = "orders"
GROUP = "billing"
CURSOR = f"__group:{GROUP}"
PARTITIONS = 3
TIMEOUT_S = 20.0
"""Upper bound of every call (a subscription ends by itself at its stop)."""


@dataclass
class Member:
    consumer_id: str
    epoch: int = 0
    partitions: list[int] = field(default_factory=list)
    processed: dict[int, list[bytes]] = field(default_factory=dict)
    """Per partition, every value handed to the application, repeats included."""
    committed: dict[int, int] = field(default_factory=dict)
    """Per partition, the offset last stored in the group's cursor."""

    def consumer(self) -> pb.Consumer:
        return pb.Consumer(groupId=GROUP, groupEpoch=self.epoch, consumerId=self.consumer_id)

    def fetch_assignments(self, api: pb_grpc.APIStub) -> list[int]:
        response = api.FetchConsumerGroupAssignments(
            pb.FetchConsumerGroupAssignmentsRequest(
                groupId=GROUP, consumerId=self.consumer_id, epoch=self.epoch
            ),
            timeout=TIMEOUT_S,
        )
        assert response.epoch == self.epoch
        assert [a.stream for a in response.assignments] == [STREAM]
        return list(response.assignments[0].partitions)

    def consume(self, api: pb_grpc.APIStub, partition: int, *, commit: bool) -> None:
        """Process the partition from the group's cursor + 1 up to its newest message (as it is
        when the subscription starts); with ``commit``, store each processed offset."""
        cursor = api.FetchCursor(
            pb.FetchCursorRequest(cursorId=CURSOR, stream=STREAM, partition=partition),
            timeout=TIMEOUT_S,
        ).offset
        request = pb.SubscribeRequest(
            stream=STREAM,
            partition=partition,
            startPosition=pb.OFFSET,
            startOffset=cursor + 1,  # -1 for a cursor never set: from offset 0
            stopPosition=pb.STOP_LATEST,
            consumer=self.consumer(),
        )
        messages = api.Subscribe(request, timeout=TIMEOUT_S)
        assert next(messages).value == b""  # the handshake: the group admitted the subscriber
        with pytest.raises(grpc.RpcError) as ended:  # Liftbridge ends at the stop with this
            for message in messages:
                self.processed.setdefault(partition, []).append(message.value)
                if commit:
                    api.SetCursor(
                        pb.SetCursorRequest(
                            cursorId=CURSOR,
                            stream=STREAM,
                            partition=partition,
                            offset=message.offset,
                        ),
                        timeout=TIMEOUT_S,
                    )
                    self.committed[partition] = message.offset
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value.details()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data")
    try:
        yield process.start()
    finally:
        process.kill()  # by PID; tmp_path is pytest's to remove


def publish(api: pb_grpc.APIStub, published: dict[int, list[bytes]], per_partition: int) -> None:
    for partition in range(PARTITIONS):
        values = published.setdefault(partition, [])
        for _ in range(per_partition):
            value = b"%d-%d" % (partition, len(values))
            ack = api.Publish(
                pb.PublishRequest(
                    stream=STREAM, partition=partition, value=value, ackPolicy=pb.ALL
                ),
                timeout=TIMEOUT_S,
            ).ack
            assert ack.offset == len(values)
            values.append(value)


def group_epoch(api: pb_grpc.APIStub) -> int:
    (metadata,) = api.FetchMetadata(
        pb.FetchMetadataRequest(groups=[GROUP]), timeout=TIMEOUT_S
    ).groupMetadata
    assert metadata.error == pb.ConsumerGroupMetadata.OK, metadata
    return int(metadata.epoch)


def test_a_group_carries_on_after_kill_9_without_joining_again(server: ServerProcess) -> None:
    members = [Member("m1"), Member("m2")]
    published: dict[int, list[bytes]] = {}
    with grpc.insecure_channel(server.address) as channel:
        api = pb_grpc.APIStub(channel)
        api.CreateStream(
            pb.CreateStreamRequest(subject=STREAM, name=STREAM, partitions=PARTITIONS),
            timeout=TIMEOUT_S,
        )
        publish(api, published, 6)
        for member in members:
            joined = api.JoinConsumerGroup(
                pb.JoinConsumerGroupRequest(
                    groupId=GROUP, consumerId=member.consumer_id, streams=[STREAM]
                ),
                timeout=TIMEOUT_S,
            )
            member.epoch = joined.epoch
        members[0].epoch = members[1].epoch  # the first member learns of the second's join
        epoch = members[0].epoch
        for member in members:
            member.partitions = member.fetch_assignments(api)
        assert sorted(members[0].partitions + members[1].partitions) == list(range(PARTITIONS))
        assert members[0].partitions and members[1].partitions
        for member in members:
            for partition in member.partitions:
                member.consume(api, partition, commit=True)
        # Processed but not committed when the server dies: these may come again, nothing else.
        publish(api, published, 2)
        for member in members:
            for partition in member.partitions:
                member.consume(api, partition, commit=False)

    server.kill()  # SIGKILL: no shutdown work at all
    server.start()  # same data directory, a new port

    with grpc.insecure_channel(server.address) as channel:
        api = pb_grpc.APIStub(channel)
        assert group_epoch(api) == epoch
        for member in members:
            assert member.fetch_assignments(api) == member.partitions  # old epoch, same answer
        publish(api, published, 5)
        for member in members:
            for partition in member.partitions:
                member.consume(api, partition, commit=True)

        processed = {p: v for m in members for p, v in m.processed.items()}
        for partition, values in published.items():
            got = processed[partition]
            assert set(got) == set(values), f"partition {partition}: messages lost"
            repeats = [v for i, v in enumerate(got) if v in got[:i]]
            assert repeats == values[6:8], f"partition {partition}: repeated {repeats}"
        assert {p: o for m in members for p, o in m.committed.items()} == {
            p: len(v) - 1 for p, v in published.items()
        }

        # Membership changes go on from the restored state.
        leaving, staying = members
        api.LeaveConsumerGroup(
            pb.LeaveConsumerGroupRequest(groupId=GROUP, consumerId=leaving.consumer_id),
            timeout=TIMEOUT_S,
        )
        assert group_epoch(api) == epoch + 1
        with pytest.raises(grpc.RpcError) as stale:
            staying.fetch_assignments(api)
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        staying.epoch = epoch + 1
        assert staying.fetch_assignments(api) == list(range(PARTITIONS))
