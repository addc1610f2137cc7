"""Headers beyond what the record format can hold (a name over 65,535 UTF-8 bytes, more than
65,535 headers on one message: both are u16 in the record, docs/format.md) are refused with
INVALID_ARGUMENT naming the limit, on every publish path, and nothing of the batch is stored."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.wire import columns

LONG_NAME = {"h" * 65_536: b"v"}
"""One header whose name is one byte over the limit (the message is far below 4 MiB)."""

LONG_UTF8_NAME = {"é" * 32_768: b"v"}
"""32,768 characters, 65,536 UTF-8 bytes: the limit counts bytes."""

MANY = {f"h{i}": b"" for i in range(65_536)}
"""One header too many."""

CASES = {"long-name": LONG_NAME, "long-utf8-name": LONG_UTF8_NAME, "many": MANY}

_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Messages up to 4 MiB, so 65,536 headers are refused for their count, not their size.
    with served(
        Path(tmp_path_factory.mktemp("headers")) / "data",
        env={"TIDELOG_MAX_MESSAGE_BYTES": str(4 << 20)},
    ) as process:
        yield process


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def new_stream(channel: grpc.Channel) -> str:
    name = f"h{next(_names)}"
    pb_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(name=name, subject=name))
    return name


def newest_offset(channel: grpc.Channel, stream: str) -> int:
    api = pb_grpc.APIStub(channel)
    found = api.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream))
    return int(found.metadata.newestOffset)


def assert_names_the_limit(message: str, headers: Mapping[str, bytes]) -> None:
    assert "65535" in message.replace(",", ""), message
    assert ("header name" in message) if len(headers) == 1 else ("headers" in message), message


@pytest.mark.parametrize("case", CASES)
def test_publish(channel: grpc.Channel, case: str) -> None:
    stream = new_stream(channel)
    api = pb_grpc.APIStub(channel)
    with pytest.raises(grpc.RpcError) as raised:
        api.Publish(pb.PublishRequest(stream=stream, value=b"v", headers=CASES[case]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert_names_the_limit(raised.value.details(), CASES[case])
    assert newest_offset(channel, stream) == -1


@pytest.mark.parametrize("case", CASES)
def test_publish_async(channel: grpc.Channel, case: str) -> None:
    stream = new_stream(channel)
    api = pb_grpc.APIStub(channel)
    good = pb.PublishRequest(stream=stream, value=b"ok", correlationId="good")
    bad = pb.PublishRequest(stream=stream, value=b"v", headers=CASES[case], correlationId="bad")
    responses = {r.correlationId: r for r in api.PublishAsync(iter([good, bad, good]))}
    failure = responses["bad"].asyncError
    assert failure.code == pb.PublishAsyncError.BAD_REQUEST, failure
    assert_names_the_limit(failure.message, CASES[case])
    assert newest_offset(channel, stream) == 1  # the two good ones only


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_publish_batch(channel: grpc.Channel, case: str, idempotent: bool) -> None:
    stream = new_stream(channel)
    tidelog = v1_grpc.TidelogStub(channel)
    request = v1.PublishBatchRequest(
        stream=stream, messages=columns.pack([b"a", b"b"], headers=[{}, CASES[case]])
    )
    if idempotent:
        request.producer_id, request.producer_sequence = "p", 1
    with pytest.raises(grpc.RpcError) as raised:
        tidelog.PublishBatch(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert_names_the_limit(raised.value.details(), CASES[case])
    assert newest_offset(channel, stream) == -1


def test_the_limits_themselves_are_accepted(channel: grpc.Channel) -> None:
    """65,535 headers, and a name of 65,535 bytes, are stored and read back; an idempotent batch
    leaves room on its last message for the broker's own ``__producer`` header."""
    stream = new_stream(channel)
    api = pb_grpc.APIStub(channel)
    most = {f"h{i}": b"" for i in range(65_535)}
    api.Publish(pb.PublishRequest(stream=stream, value=b"a", headers=most))
    api.Publish(pb.PublishRequest(stream=stream, value=b"b", headers={"n" * 65_535: b"v"}))
    subscription = api.Subscribe(
        pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    )
    received: list[pb.Message] = []
    with pytest.raises(grpc.RpcError) as ended:  # how Liftbridge ends a bounded subscription
        for message in subscription:
            if message.value:
                received.append(message)
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [len(m.headers) for m in received] == [65_535, 1]
    tidelog = v1_grpc.TidelogStub(channel)
    request = v1.PublishBatchRequest(
        stream=stream,
        messages=columns.pack([b"c"], headers=[most]),
        producer_id="p",
        producer_sequence=1,
    )
    with pytest.raises(grpc.RpcError) as raised:
        tidelog.PublishBatch(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "__producer" in raised.value.details()
