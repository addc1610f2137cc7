"""Request bytes that do not decode: every method of both services (and health) answers
INVALID_ARGUMENT naming the message type, and the server logs one rate-limited warning line per
method, never a traceback (docs/api.md, "Errors")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1

GARBAGE = b"\xff" * 12
"""Not a protobuf message: a varint that never ends."""

BAD_UTF8 = b"\x0a\x02\xff\xfe"
"""Field 1 (a string in every request that has one) holding bytes that are not UTF-8."""

METHODS = [
    (f"/{service.full_name}/{method.name}", method)
    for module in (pb, v1, health_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("undecodable")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def call_raw(channel: grpc.Channel, path: str, method: object, frames: list[bytes]) -> list[bytes]:
    """Send ``frames`` (raw bytes) to ``path``; the raw responses (raises the call's error)."""
    streaming_in = method.client_streaming  # type: ignore[attr-defined]
    streaming_out = method.server_streaming  # type: ignore[attr-defined]
    if streaming_in:
        call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
        return list(call(iter(frames), timeout=20))
    (frame,) = frames
    if streaming_out:
        stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return list(stream(frame, timeout=20))
    unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    return [unary(frame, timeout=20)]


def _string_field_1(method: object) -> bool:
    field = method.input_type.fields_by_number.get(1)  # type: ignore[attr-defined]
    return field is not None and field.type == field.TYPE_STRING


CASES = [(path, method, GARBAGE) for path, method in METHODS] + [
    (path, method, BAD_UTF8) for path, method in METHODS if _string_field_1(method)
]


@pytest.mark.parametrize(
    ("path", "method", "garbage"),
    CASES,
    ids=[f"{p}-{'utf8' if g == BAD_UTF8 else 'garbage'}" for p, _, g in CASES],
)
def test_undecodable_request_is_invalid_argument(
    channel: grpc.Channel, path: str, method: object, garbage: bytes
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call_raw(channel, path, method, [garbage])
    error = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    type_name = method.input_type.full_name  # type: ignore[attr-defined]
    assert f"could not be decoded as {type_name}" in error.details()


def test_a_bad_frame_after_good_ones_ends_the_stream(channel: grpc.Channel) -> None:
    """PublishAsync: the request before the bad frame is acknowledged, then INVALID_ARGUMENT."""
    stub = channel.unary_unary("/proto.API/CreateStream")
    stub(pb.CreateStreamRequest(name="frames", subject="frames").SerializeToString())
    good = pb.PublishRequest(stream="frames", value=b"v", correlationId="c1").SerializeToString()
    call = channel.stream_stream(
        "/proto.API/PublishAsync", request_serializer=None, response_deserializer=None
    )
    responses = call(iter([good, GARBAGE]), timeout=20)
    first = pb.PublishResponse.FromString(next(responses))
    assert first.correlationId == "c1" and first.ack.offset == 0
    with pytest.raises(grpc.RpcError) as raised:
        next(responses)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be decoded as proto.PublishRequest" in raised.value.details()


def test_a_flood_of_garbage_logs_one_line_per_method(
    channel: grpc.Channel, server: ServerProcess
) -> None:
    path = "/proto.API/FetchMetadata"
    before = len(server.stderr_lines)
    unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    for _ in range(200):
        with pytest.raises(grpc.RpcError):
            unary(GARBAGE, timeout=20)
    # The server is still answering, and the flood cost at most one line.
    assert unary(b"", timeout=20) is not None
    flood = server.stderr_lines[before:]
    assert len(flood) <= 1, "".join(flood)
    log = "".join(server.stderr_lines)
    assert "Traceback" not in log
    assert " ERROR " not in log
    warnings = [line for line in server.stderr_lines if "could not be decoded" in line]
    # One per method at most (the parametrized test above ran first), each a single line.
    assert 0 < len(warnings) <= len(METHODS), log
    assert all(" WARNING " in line for line in warnings)
