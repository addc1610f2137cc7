"""Typed client errors, raised from what a real server answers (``tidelog.client.errors``)."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from tests.support.server import ServerProcess

from tidelog import errors as core_errors
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import (
    AlreadyExists,
    AsyncClient,
    Client,
    ClientError,
    ClientSettings,
    FailedPrecondition,
    IncorrectOffset,
    InvalidArgument,
    Message,
    MessageTooLarge,
    NotFound,
    PartitionPaused,
    PartitionReadonly,
    Unavailable,
)
from tidelog.client import errors as client_errors
from tidelog.client.errors import from_rpc_error


def _nobody_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_not_found_and_already_exists(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        with pytest.raises(AlreadyExists, match="already exists") as exists:
            client.create_stream(stream)
        assert exists.value.code == grpc.StatusCode.ALREADY_EXISTS
        for call in (
            lambda: client.stream_info("nope"),
            lambda: client.delete_stream("nope"),
            lambda: client.publish("nope", b"v"),
            lambda: client.publish(stream, b"v", partition=1),
            lambda: client.publish_batch("nope", [b"a", b"b"]),
            lambda: next(client.subscribe("nope", start="earliest")),
            lambda: next(client.subscribe(stream, partition=3, start="earliest")),
        ):
            with pytest.raises(NotFound, match="no such") as missing:
                call()
            assert missing.value.code == grpc.StatusCode.NOT_FOUND
            assert isinstance(missing.value, ClientError)


def test_invalid_arguments(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        client.publish_batch(stream, [b"a", b"b", b"c"])
        for call in (
            lambda: client.create_stream("bad/name"),
            lambda: client.create_stream("__reserved"),
            lambda: client.create_stream(f"{stream}-x", partitions=-1),
            lambda: next(client.subscribe(stream, start=2, stop=1)),
            lambda: next(client.subscribe(stream, start=-1)),
        ):
            with pytest.raises(InvalidArgument) as invalid:
                call()
            assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
        # Refused by the client itself, before any call.
        with pytest.raises(InvalidArgument, match="start must be"):
            next(client.subscribe(stream, start="bogus"))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="stop must be"):
            next(client.subscribe(stream, start="earliest", stop="soon"))  # type: ignore[arg-type]
        assert client.stream_info(stream).partitions[0].newest_offset == 2


def test_zero_partitions_is_refused_or_means_one(server: ServerProcess, stream: str) -> None:
    """``partitions=0`` is either refused (InvalidArgument) or, as on the Liftbridge wire, a
    stream of one partition; then keyed publishes from the same client land on partition 0."""
    with Client(server.address) as client:
        try:
            client.create_stream(stream, partitions=0)
        except InvalidArgument:
            return
        assert len(client.stream_info(stream).partitions) == 1
    with Client(server.address) as client:
        client.create_stream(f"{stream}-b", partitions=0)
        assert client.publish(f"{stream}-b", b"v", key=b"k").partition == 0
        acks = client.publish_batch(f"{stream}-b", [Message(b"w", key=b"k2")])
        assert [(a.partition, a.offset) for a in acks] == [(0, 1)]


def test_message_too_large_writes_nothing(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        big = b"x" * (300 * 1024)
        with pytest.raises(MessageTooLarge, match="bytes") as too_large:
            client.publish(stream, big)
        assert too_large.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(MessageTooLarge):
            client.publish_batch(stream, [b"small", big, b"small"])
        assert client.stream_info(stream).partitions[0].newest_offset == -1


def test_readonly_and_paused_partitions(
    server: ServerProcess, stream: str, api: pb_grpc.APIStub
) -> None:
    with Client(server.address) as client:
        client.create_stream(stream, partitions=2)
        client.publish(stream, b"before", partition=0)
        api.SetStreamReadonly(
            pb.SetStreamReadonlyRequest(name=stream, partitions=[1], readonly=True), timeout=10
        )
        with pytest.raises(PartitionReadonly, match="readonly") as readonly:
            client.publish(stream, b"x", partition=1)
        assert readonly.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert isinstance(readonly.value, FailedPrecondition)
        client.publish(stream, b"fine", partition=0)  # the other partition takes publishes

        api.PauseStream(pb.PauseStreamRequest(name=stream, partitions=[0]), timeout=10)
        with pytest.raises(PartitionPaused, match="paused") as paused:
            next(client.subscribe(stream, start="earliest"))
        assert paused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        resumed = client.subscribe(stream, start="earliest", stop="latest", resume=True)
        assert [m.value for m in resumed] == [b"before", b"fine"]


def test_incorrect_expected_offset(server: ServerProcess, stream: str) -> None:
    """The client has no expected-offset parameter; the server's answers to raw calls map to
    IncorrectOffset (the client recognises the server's own message)."""
    with Client(server.address) as client:
        client.create_stream(stream, optimistic_concurrency=True)
        client.publish(stream, b"first")
    with grpc.insecure_channel(server.address) as channel:
        batch = v1.PublishBatchRequest(
            stream=stream,
            messages=v1.Messages(values=b"x", value_sizes=b"\x01\x00\x00\x00"),
            expected_offset=5,
        )
        for call in (
            lambda: v1_grpc.TidelogStub(channel).PublishBatch(batch, timeout=10),
            lambda: pb_grpc.APIStub(channel).Publish(
                pb.PublishRequest(stream=stream, value=b"x", expectedOffset=0), timeout=10
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            error = from_rpc_error(refused.value)
            assert isinstance(error, IncorrectOffset), error
            assert error.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "expected offset" in str(error)


def test_unavailable_when_nothing_listens() -> None:
    """Retried calls give up after the retry budget (short here), a plain publish at once."""
    address = _nobody_listens()
    settings = ClientSettings(retry_budget_s=0.3)
    with Client(address, settings=settings) as client:
        with pytest.raises(Unavailable, match="cannot reach the tidelog server") as down:
            client.list_streams()
        assert down.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(Unavailable):
            client.publish("s", b"v", partition=0)
        with pytest.raises(Unavailable):
            next(client.subscribe("s", start="earliest"))

    async def asynchronous() -> None:
        async with AsyncClient(address, settings=settings) as client:
            with pytest.raises(Unavailable, match="cannot reach"):
                await client.create_stream("s")
            with pytest.raises(Unavailable):
                await client.fetch_cursor("c", "s")

    asyncio.run(asyncio.wait_for(asynchronous(), 30))


@pytest.mark.parametrize(
    ("code", "detail", "core"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "bad", "InvalidArgument"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream is empty: no latest", "StreamEmpty"),
        (grpc.StatusCode.FAILED_PRECONDITION, "readonly partition", "PartitionReadonly"),
        (grpc.StatusCode.FAILED_PRECONDITION, "s/0 is paused", "PartitionPaused"),
        (grpc.StatusCode.FAILED_PRECONDITION, "incorrect expected offset", "IncorrectOffset"),
    ],
)
def test_a_client_error_is_the_core_error_of_its_concept(
    code: grpc.StatusCode, detail: str, core: str
) -> None:
    """One hierarchy: what the server reports over the wire is caught as the same core type."""
    error = client_errors.error_for(code, detail)
    assert isinstance(error, getattr(core_errors, core))
    assert isinstance(error, client_errors.ClientError)
    assert str(error) == detail and error.code == code


def test_a_refusal_for_bytes_in_flight_is_a_limit_reached_not_a_message_too_large() -> None:
    """The server's LimitReached (``tidelog.errors``) names its setting: the client says so, so
    that a caller can tell "publish again later" from "this message can never be stored"."""
    detail = str(core_errors.LimitReached("max_inflight_bytes_per_principal", "publish refused"))
    error = client_errors.error_for(grpc.StatusCode.RESOURCE_EXHAUSTED, detail)
    assert isinstance(error, client_errors.LimitReached)
    assert isinstance(error, core_errors.LimitReached)
    assert not isinstance(error, client_errors.MessageTooLarge)
    assert error.setting == "max_inflight_bytes_per_principal"
    assert str(error) == detail and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    too_large = client_errors.error_for(grpc.StatusCode.RESOURCE_EXHAUSTED, "message of 9 bytes")
    assert type(too_large) is client_errors.MessageTooLarge
