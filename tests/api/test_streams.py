"""Stream administration and metadata over ``proto.API`` against a real server: create, delete,
pause, read-only, FetchMetadata, FetchPartitionMetadata, cursors, the RPCs tidelog does not
offer, and the health service (docs/api.md, "Errors" and "Differences from Liftbridge")."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.support.server import ServerProcess, served

import tidelog
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import AlreadyExists, InvalidArgument, NotFound
from tidelog.wire import CURSOR_UNSET_KEY

_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("streams")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as c:
        yield c


@pytest.fixture(scope="module")
def api(channel: grpc.Channel) -> pb_grpc.APIStub:
    return pb_grpc.APIStub(channel)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[tidelog.Client]:
    with tidelog.Client(server.address) as c:
        yield c


def fresh() -> str:
    return f"st{next(_names)}"


def status(call: object, request: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call(request)  # type: ignore[operator]
    return raised.value.code()  # type: ignore[no-any-return]


def partition_metadata(api: pb_grpc.APIStub, stream: str, partition: int) -> pb.PartitionMetadata:
    request = pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    return api.FetchPartitionMetadata(request).metadata


# -- create / delete -------------------------------------------------------------------------------


def test_create_and_its_refusals(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, subject="subj", partitions=2))
    assert status(api.CreateStream, pb.CreateStreamRequest(name=name)) is (
        grpc.StatusCode.ALREADY_EXISTS
    )
    with pytest.raises(AlreadyExists):
        client.create_stream(name)
    invalid = [
        pb.CreateStreamRequest(name=""),
        pb.CreateStreamRequest(name="_x"),
        pb.CreateStreamRequest(name="__mine"),
        pb.CreateStreamRequest(name="a/b"),
        pb.CreateStreamRequest(name="x" * 250),
        pb.CreateStreamRequest(name=fresh(), replicationFactor=3),
        pb.CreateStreamRequest(name=fresh(), partitions=-1),
    ]
    encrypted = pb.CreateStreamRequest(name=fresh())
    encrypted.encryption.value = True
    for request in [*invalid, encrypted]:
        assert status(api.CreateStream, request) is grpc.StatusCode.INVALID_ARGUMENT, request
    compacted = pb.CreateStreamRequest(name=fresh())  # compaction is available
    compacted.compactEnabled.value = True
    api.CreateStream(compacted)
    assert compacted.name in {s.name for s in client.list_streams()}
    with pytest.raises(InvalidArgument):
        client.create_stream("bad name")
    for factor in (-1, 0, 1):
        api.CreateStream(pb.CreateStreamRequest(name=fresh(), replicationFactor=factor))
    names = {s.name for s in client.list_streams()}
    assert name in names
    assert not any(n.startswith("_x") or n == "__mine" for n in names)


def test_delete(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    name = fresh()
    client.create_stream(name, partitions=2)
    client.publish(name, b"x")
    api.DeleteStream(pb.DeleteStreamRequest(name=name))
    assert name not in {s.name for s in client.list_streams()}
    assert status(api.DeleteStream, pb.DeleteStreamRequest(name=name)) is grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound):
        client.delete_stream(name)
    assert status(api.Publish, pb.PublishRequest(stream=name, value=b"x")) is (
        grpc.StatusCode.NOT_FOUND
    )
    # The name can be used again, from scratch.
    client.create_stream(name)
    assert partition_metadata(api, name, 0).highWatermark == -1


def test_delete_ends_a_live_subscription_with_not_found(api: pb_grpc.APIStub) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name))
    api.Publish(pb.PublishRequest(stream=name, value=b"x"))
    call = api.Subscribe(pb.SubscribeRequest(stream=name, startPosition=pb.EARLIEST), timeout=15)
    assert next(call) == pb.Message()
    assert next(call).value == b"x"
    api.DeleteStream(pb.DeleteStreamRequest(name=name))
    with pytest.raises(grpc.RpcError) as raised:
        next(call)
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND


# -- pause / read-only -----------------------------------------------------------------------------


def test_pause_keeps_offsets_and_wakes_on_resume(api: pb_grpc.APIStub) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, partitions=2))
    for _ in range(3):
        api.Publish(pb.PublishRequest(stream=name, partition=1, value=b"x"))
    call = api.Subscribe(pb.SubscribeRequest(stream=name, partition=1), timeout=15)
    assert next(call) == pb.Message()
    api.PauseStream(pb.PauseStreamRequest(name=name, partitions=[1]))
    with pytest.raises(grpc.RpcError) as raised:
        next(call)
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # paused under it
    meta = partition_metadata(api, name, 1)  # Liftbridge refuses this; tidelog answers
    assert (meta.paused, meta.highWatermark, meta.newestOffset) == (True, 2, 2)
    assert meta.pauseTimestamps.firstTimestamp > 0
    assert not partition_metadata(api, name, 0).paused
    assert status(api.PauseStream, pb.PauseStreamRequest(name="nope")) is grpc.StatusCode.NOT_FOUND
    assert status(api.PauseStream, pb.PauseStreamRequest(name=name, partitions=[5])) is (
        grpc.StatusCode.NOT_FOUND
    )
    resumed = api.Subscribe(
        pb.SubscribeRequest(stream=name, partition=1, startPosition=pb.EARLIEST, resume=True),
        timeout=15,
    )
    assert next(resumed) == pb.Message()
    assert next(resumed).offset == 0
    resumed.cancel()
    assert not partition_metadata(api, name, 1).paused


def test_readonly_flag(api: pb_grpc.APIStub) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, partitions=2))
    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=name, readonly=True))
    for partition in (0, 1):
        meta = partition_metadata(api, name, partition)
        assert meta.readonly and meta.readonlyTimestamps.latestTimestamp > 0
        request = pb.PublishRequest(stream=name, partition=partition, value=b"x")
        assert status(api.Publish, request) is grpc.StatusCode.FAILED_PRECONDITION
    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=name, partitions=[1], readonly=False))
    assert partition_metadata(api, name, 0).readonly
    assert not partition_metadata(api, name, 1).readonly
    assert api.Publish(pb.PublishRequest(stream=name, partition=1, value=b"x")).ack.offset == 0
    assert status(
        api.SetStreamReadonly, pb.SetStreamReadonlyRequest(name="nope", readonly=True)
    ) is (grpc.StatusCode.NOT_FOUND)


# -- metadata --------------------------------------------------------------------------------------


def test_fetch_metadata(server: ServerProcess, api: pb_grpc.APIStub) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, subject="meta.subj", partitions=3))
    everything = api.FetchMetadata(pb.FetchMetadataRequest())
    assert len(everything.brokers) == 1
    broker = everything.brokers[0]
    assert (broker.host, broker.port) == ("127.0.0.1", server.port)
    listed = {m.name: m for m in everything.streamMetadata}
    assert "__cursors" in listed and name in listed
    assert sum(len(m.partitions) for m in listed.values()) == broker.partitionCount
    meta = listed[name]
    assert (meta.subject, meta.error) == ("meta.subj", pb.StreamMetadata.OK)
    assert meta.creationTimestamp > 0
    assert sorted(meta.partitions) == [0, 1, 2]
    for number, p in meta.partitions.items():
        assert (p.id, p.leader, list(p.replicas), list(p.isr)) == (
            number,
            broker.id,
            [broker.id],
            [broker.id],
        )
    some = api.FetchMetadata(pb.FetchMetadataRequest(streams=[name, "no-such"], groups=["g"]))
    assert [(m.name, m.error) for m in some.streamMetadata] == [
        (name, pb.StreamMetadata.OK),
        ("no-such", pb.StreamMetadata.UNKNOWN_STREAM),
    ]
    assert [(g.groupId, g.error) for g in some.groupMetadata] == [
        ("g", pb.ConsumerGroupMetadata.UNKNOWN_GROUP)
    ]


def test_fetch_partition_metadata(api: pb_grpc.APIStub) -> None:
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, partitions=2))
    empty = partition_metadata(api, name, 1)
    assert (empty.id, empty.highWatermark, empty.newestOffset) == (1, -1, -1)
    assert (empty.paused, empty.readonly) == (False, False)
    assert empty.messagesReceivedTimestamps.firstTimestamp == 0
    for _ in range(3):
        api.Publish(pb.PublishRequest(stream=name, partition=1, value=b"x"))
    full = partition_metadata(api, name, 1)
    assert (full.highWatermark, full.newestOffset) == (2, 2)
    received = full.messagesReceivedTimestamps
    assert 0 < received.firstTimestamp <= received.latestTimestamp
    assert partition_metadata(api, name, 0).highWatermark == -1
    for stream, partition in ((name, 2), (name, -1), ("nope", 0)):
        request = pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)
        assert status(api.FetchPartitionMetadata, request) is grpc.StatusCode.NOT_FOUND


def test_client_stream_info(client: tidelog.Client) -> None:
    name = fresh()
    client.create_stream(name, partitions=2, subject="info.subj")
    client.publish(name, b"x", partition=1)
    info = client.stream_info(name)
    assert (info.name, info.subject) == (name, "info.subj")
    assert [(p.partition, p.high_watermark, p.newest_offset) for p in info.partitions] == [
        (0, -1, -1),
        (1, 0, 0),
    ]
    assert "__cursors" in {s.name for s in client.list_streams()}
    with pytest.raises(NotFound):
        client.stream_info("no-such")


# -- cursors ---------------------------------------------------------------------------------------


def test_cursors(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    name = fresh()
    client.create_stream(name, partitions=2)
    assert client.fetch_cursor("c", name, 0) == -1
    client.set_cursor("c", name, 0, 10)
    client.set_cursor("c", name, 1, 20)
    client.set_cursor("c", name, 0, 11)
    assert [client.fetch_cursor("c", name, p) for p in (0, 1)] == [11, 20]
    assert client.fetch_cursor("other", name, 0) == -1
    request = pb.FetchCursorRequest(cursorId="c", stream=name, partition=1)
    assert api.FetchCursor(request).offset == 20
    assert status(api.SetCursor, pb.SetCursorRequest(stream=name, offset=1)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_a_cursor_never_set_is_told_apart_from_one_set_to_minus_one(api: pb_grpc.APIStub) -> None:
    # both answer -1 (Liftbridge's); the trailing metadata says which, for another broker that
    # reads a cursor on its partition's leader (a Kafka group that committed 0 stores -1)
    name = fresh()
    api.CreateStream(pb.CreateStreamRequest(name=name, subject=name))
    api.SetCursor(pb.SetCursorRequest(stream=name, partition=0, cursorId="set", offset=-1))

    def fetched(cursor: str) -> tuple[int, bool]:
        request = pb.FetchCursorRequest(stream=name, partition=0, cursorId=cursor)
        answer, call = api.FetchCursor.with_call(request)
        unset = any(key == CURSOR_UNSET_KEY for key, _ in call.trailing_metadata() or ())
        return answer.offset, unset

    assert fetched("set") == (-1, False)
    assert fetched("never") == (-1, True)


# -- health ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["proto.API", "", "tidelog.v1.Tidelog"])
def test_health_reports_serving(channel: grpc.Channel, service: str) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_health_of_an_unknown_service_is_not_found(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as raised:
        health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5)
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
