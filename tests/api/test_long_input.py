"""A 10 KB name in a request: the error echoes its start and its size, never all of it, so the
status detail stays under gRPC's 8 KiB metadata limit and the client sees the real error
(docs/api.md, "Errors")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc

LONG = "s" * 10_000

DETAIL_BYTES = 1024
"""The server's cap on a status detail (``tidelog.api.status.DETAIL_BYTES``), plus its note."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("long-input")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def _calls(channel: grpc.Channel) -> dict[str, tuple[Callable[[], object], grpc.StatusCode]]:
    api = pb_grpc.APIStub(channel)
    tidelog = v1_grpc.TidelogStub(channel)
    not_found = grpc.StatusCode.NOT_FOUND
    return {
        "CreateStream": (
            lambda: api.CreateStream(pb.CreateStreamRequest(name=LONG, subject="x")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "DeleteStream": (lambda: api.DeleteStream(pb.DeleteStreamRequest(name=LONG)), not_found),
        "Publish": (lambda: api.Publish(pb.PublishRequest(stream=LONG, value=b"v")), not_found),
        "Subscribe": (
            lambda: list(api.Subscribe(pb.SubscribeRequest(stream=LONG))),
            not_found,
        ),
        "FetchPartitionMetadata": (
            lambda: api.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=LONG)),
            not_found,
        ),
        "PublishBatch": (
            lambda: tidelog.PublishBatch(v1.PublishBatchRequest(stream=LONG)),
            not_found,
        ),
        "SubscribeBatches": (
            lambda: list(tidelog.SubscribeBatches(v1.SubscribeBatchesRequest(stream=LONG))),
            not_found,
        ),
        "ListViews": (lambda: tidelog.ListViews(v1.ListViewsRequest(stream=LONG)), not_found),
    }


METHODS = [
    "CreateStream",
    "DeleteStream",
    "Publish",
    "Subscribe",
    "FetchPartitionMetadata",
    "PublishBatch",
    "SubscribeBatches",
    "ListViews",
]


@pytest.mark.parametrize("method", METHODS)
def test_a_10kb_stream_name_is_echoed_short(channel: grpc.Channel, method: str) -> None:
    call, expected = _calls(channel)[method]
    with pytest.raises(grpc.RpcError) as raised:
        call()
    error = raised.value
    assert error.code() == expected, (error.code(), error.details()[:300])
    detail = error.details()
    assert len(detail.encode()) <= DETAIL_BYTES + 40
    assert "(10000 bytes)" in detail, detail
    assert "s" * 200 in detail and "s" * 201 not in detail


def test_publish_async_errors_echo_short(channel: grpc.Channel) -> None:
    """PublishAsync answers per request (Liftbridge's asyncError), with the same short echo."""
    api = pb_grpc.APIStub(channel)
    request = pb.PublishRequest(stream=LONG, value=b"v", correlationId="c")
    (response,) = api.PublishAsync(iter([request]))
    assert response.asyncError.code == pb.PublishAsyncError.NOT_FOUND
    assert "(10000 bytes)" in response.asyncError.message
    assert len(response.asyncError.message.encode()) <= DETAIL_BYTES + 40


def test_a_cursor_on_a_long_stream_name_is_refused_with_its_echo_capped(
    channel: grpc.Channel,
) -> None:
    """A cursor names a stream that exists (docs/security.md, "Limits"): a 10 KB name cannot,
    so SetCursor answers NOT_FOUND, echoing the name's start and size only. FetchCursor, which
    stores nothing, still answers -1."""
    api = pb_grpc.APIStub(channel)
    with pytest.raises(grpc.RpcError) as raised:
        api.SetCursor(pb.SetCursorRequest(cursorId="c", stream=LONG, offset=7))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert len((raised.value.details() or "").encode()) <= DETAIL_BYTES + 40
    assert api.FetchCursor(pb.FetchCursorRequest(cursorId="c", stream=LONG)).offset == -1


def test_every_status_detail_is_capped(channel: grpc.Channel) -> None:
    """The safety net: an error that repeats its input in full (here a 10 KB group id) is cut to
    ~1 KiB, so the client still gets the real status."""
    api = pb_grpc.APIStub(channel)
    with pytest.raises(grpc.RpcError) as raised:
        api.FetchConsumerGroupAssignments(
            pb.FetchConsumerGroupAssignmentsRequest(groupId=LONG, consumerId="c")
        )
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    detail = raised.value.details()
    assert detail.startswith("no such consumer group: 'sss")
    assert len(detail.encode()) <= DETAIL_BYTES + 40
