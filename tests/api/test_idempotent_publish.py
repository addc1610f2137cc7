"""Idempotent, atomic batch publishing over ``tidelog.v1`` against a real server (docs/api.md,
"Idempotent publishing"): the duplicate flag, validation, the reserved header on both services,
and exactly one copy of a batch retried across a kill -9."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess

import tidelog
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import ClientError, InvalidArgument, Message
from tidelog.client.models import Acks
from tidelog.wire import columns

PRODUCER_HEADER = "__producer"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[tidelog.Client]:
    with tidelog.Client(server.address) as connected:
        yield connected


def values_of(client: tidelog.Client, stream: str, partition: int = 0) -> list[bytes]:
    if client.stream_info(stream).partitions[partition].high_watermark < 0:
        return []
    return [m.value for m in client.subscribe(stream, partition, start="earliest", stop="latest")]


def test_the_duplicate_flag_and_the_stored_offsets(client: tidelog.Client) -> None:
    client.create_stream("s")
    client.publish("s", b"plain")
    first = client.publish_batch("s", [b"a", b"b"], producer_id="p", producer_sequence=3)
    assert isinstance(first, Acks) and not first.duplicate
    assert [a.offset for a in first] == [1, 2]
    again = client.publish_batch("s", [b"a", b"b"], producer_id="p", producer_sequence=3)
    assert again.duplicate and [a.offset for a in again] == [1, 2]
    older = client.publish_batch("s", [b"z"], producer_id="p", producer_sequence=2)
    assert older.duplicate and len(older) == 0
    later = client.publish_batch("s", [b"c"], producer_id="p", producer_sequence=10)
    assert not later.duplicate and [a.offset for a in later] == [3]
    assert values_of(client, "s") == [b"plain", b"a", b"b", b"c"]
    assert "duplicate=True" in repr(again)


def test_a_long_batch_with_a_producer_goes_in_one_request(client: tidelog.Client) -> None:
    client.create_stream("long")
    values = [b"%d" % i for i in range(2500)]  # the client chunks plain batches by 1,000
    acks = client.publish_batch("long", values, producer_id="p", producer_sequence=0)
    assert acks.offsets == range(2500)
    assert client.publish_batch("long", values, producer_id="p", producer_sequence=0).duplicate
    assert values_of(client, "long") == values


def test_keys_go_to_one_partition_or_the_batch_is_refused(client: tidelog.Client) -> None:
    client.create_stream("keyed", partitions=4)
    messages = [Message(b"v%d" % i, key=b"k%d" % i) for i in range(20)]
    with pytest.raises(InvalidArgument, match="one partition"):
        client.publish_batch("keyed", messages, producer_id="p", producer_sequence=0)
    same_key = [Message(b"v%d" % i, key=b"same") for i in range(3)]
    acks = client.publish_batch("keyed", same_key, producer_id="p", producer_sequence=0)
    assert len({a.partition for a in acks}) == 1
    assert client.publish_batch(
        "keyed", messages, partition=2, producer_id="p", producer_sequence=0
    )


def test_client_side_refusals(client: tidelog.Client) -> None:
    client.create_stream("c")
    with pytest.raises(InvalidArgument, match="both"):
        client.publish_batch("c", [b"a"], producer_id="p")  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match="both"):
        client.publish_batch("c", [b"a"], producer_sequence=1)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match="at least one message"):
        client.publish_batch("c", [], producer_id="p", producer_sequence=1)
    huge = [b"x" * (224 << 10)] * 300  # 67 MB: over one request
    with pytest.raises(InvalidArgument, match="one request"):
        client.publish_batch("c", huge, producer_id="p", producer_sequence=1)
    assert values_of(client, "c") == []


@pytest.mark.parametrize(
    ("producer_id", "sequence", "detail"),
    [
        ("p", -1, "producer_sequence must be >= 0"),
        ("x" * 256, 0, "producer_id is 256 bytes"),
        ("", 4, "producer_id must not be empty"),
    ],
)
def test_invalid_producer_fields_are_invalid_argument(
    server: ServerProcess, producer_id: str, sequence: int, detail: str
) -> None:
    with tidelog.Client(server.address) as client:
        client.create_stream("v")
    with grpc.insecure_channel(server.address) as channel:
        stub = v1_grpc.TidelogStub(channel)
        request = v1.PublishBatchRequest(
            stream="v",
            messages=columns.pack([b"a"]),
            expected_offset=-1,
            producer_id=producer_id,
            producer_sequence=sequence,
        )
        with pytest.raises(grpc.RpcError) as raised:
            stub.PublishBatch(request)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert detail in (raised.value.details() or "")
        # PublishStream answers the same in the batch's response and stays open.
        responses = list(stub.PublishStream(iter([request, request])))
        assert [r.error_code for r in responses] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]] * 2


def test_ack_policy_none_still_deduplicates(server: ServerProcess) -> None:
    with tidelog.Client(server.address) as client:
        client.create_stream("n")
        with grpc.insecure_channel(server.address) as channel:
            stub = v1_grpc.TidelogStub(channel)
            request = v1.PublishBatchRequest(
                stream="n",
                messages=columns.pack([b"a", b"b"]),
                expected_offset=-1,
                ack_policy=v1.ACK_POLICY_NONE,
                producer_id="p",
                producer_sequence=0,
            )
            assert stub.PublishBatch(request) == v1.PublishBatchResponse()
            assert stub.PublishBatch(request) == v1.PublishBatchResponse()
            request.ack_policy = v1.ACK_POLICY_ALL
            response = stub.PublishBatch(request)
            assert (response.duplicate, response.first_offset, response.count) == (True, 0, 2)
        assert values_of(client, "n") == [b"a", b"b"]


def test_the_reserved_header_is_refused_on_both_services(server: ServerProcess) -> None:
    with tidelog.Client(server.address) as client:
        client.create_stream("h")
        with pytest.raises(InvalidArgument, match="reserved"):
            client.publish("h", b"a", headers={PRODUCER_HEADER: b"forged"})
        with pytest.raises(InvalidArgument, match="reserved"):
            client.publish_batch(
                "h",
                [Message(b"a", headers={PRODUCER_HEADER: b""})],
                producer_id="p",
                producer_sequence=0,
            )
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                api.Publish(
                    pb.PublishRequest(stream="h", value=b"a", headers={PRODUCER_HEADER: b"x"})
                )
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert values_of(client, "h") == []
        # The header the broker adds is delivered like any other.
        client.publish_batch("h", [b"a", b"b"], producer_id="p", producer_sequence=0)
        delivered = list(client.subscribe("h", start="earliest", stop="latest"))
        assert [PRODUCER_HEADER in m.headers for m in delivered] == [False, True]


# -- kill -9 --------------------------------------------------------------------------------------


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()


def start(servers: list[ServerProcess], data: Path) -> ServerProcess:
    process = ServerProcess(data)
    servers.append(process)
    return process.start()


def batch_of(sequence: int) -> list[bytes]:
    return [b"seq-%d-%d" % (sequence, i) for i in range(1 + sequence % 7)]


@pytest.mark.slow
def test_a_retry_after_kill_9_leaves_exactly_one_copy(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """A producer publishing numbered batches when the server dies retries, after the restart,
    every batch it has no ack for: each batch is in the log exactly once, whole, in order."""
    data = tmp_path / "data"
    first = start(servers, data)
    with tidelog.Client(first.address) as client:
        client.create_stream("x")
    acked: list[int] = []
    enough = threading.Event()

    def produce() -> None:
        with tidelog.Client(first.address) as client:
            for sequence in range(100_000):  # bounded; ends at the crash
                try:
                    client.publish_batch(
                        "x", batch_of(sequence), producer_id="spark-1", producer_sequence=sequence
                    )
                except ClientError:
                    return
                acked.append(sequence)
                if sequence == 200:
                    enough.set()
        enough.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    assert enough.wait(60)
    first.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert acked == list(range(len(acked))) and len(acked) > 200

    second = start(servers, data)
    with tidelog.Client(second.address) as client:
        # The last acked batch and the one in flight (and one more) again.
        retried = [len(acked) - 1, len(acked), len(acked) + 1]
        answers = [
            client.publish_batch("x", batch_of(s), producer_id="spark-1", producer_sequence=s)
            for s in retried
        ]
        assert answers[0].duplicate
        assert not answers[2].duplicate
        stored = values_of(client, "x")
    expected = [v for s in range(len(acked) + 2) for v in batch_of(s)]
    assert stored == expected
