"""The Liftbridge-compatible wire contract (proto/liftbridge/api.proto) and its generated code.

Two kinds of checks:

* the committed code under src/tidelog/_proto is exactly what `make proto` produces now;
* the contract matches Liftbridge's published API (liftbridge-api v1.9.x) on the wire: field
  numbers and types, enum values, byte-level encodings worked out by hand here, and method
  paths `/proto.API/<Rpc>`, including over a real gRPC channel on the loopback interface.

The expected numbers below were read off the upstream api.proto, not off our own file.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from tidelog._proto.liftbridge import api_pb2 as api
from tidelog._proto.liftbridge import api_pb2_grpc as api_grpc

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "src" / "tidelog" / "_proto"
GENERATOR = ROOT / "scripts" / "gen_proto.py"


# --------------------------------------------------------------------------- generated code


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts
    }


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"scripts/gen_proto.py failed:\n{result.stdout}{result.stderr}"
    fresh, committed = _tree(out), _tree(GENERATED)
    problems = sorted(
        [f"missing from src/tidelog/_proto: {name}" for name in fresh.keys() - committed.keys()]
        + [f"no longer generated: {name}" for name in committed.keys() - fresh.keys()]
        + [
            f"differs: {name}"
            for name in fresh.keys() & committed.keys()
            if fresh[name] != committed[name]
        ]
    )
    assert not problems, (
        "src/tidelog/_proto is stale: it does not match what proto/ generates. "
        "Run `make proto` and commit the result.\n  " + "\n  ".join(problems)
    )


def test_generated_modules_import_by_package_path() -> None:
    # The gRPC module must use its sibling from inside tidelog._proto, not a top-level
    # `liftbridge` package (which does not exist once installed).
    assert api_grpc.liftbridge_dot_api__pb2 is api
    assert api.Message.__module__ == "tidelog._proto.liftbridge.api_pb2"
    assert api.DESCRIPTOR.package == "proto"


# --------------------------------------------------------------------------- field numbers

T = FieldDescriptor
# (message, field, number, type) from upstream api.proto; nested messages written "Outer.Inner".
FIELDS = [
    ("CreateStreamRequest", "subject", 1, T.TYPE_STRING),
    ("CreateStreamRequest", "name", 2, T.TYPE_STRING),
    ("CreateStreamRequest", "group", 3, T.TYPE_STRING),
    ("CreateStreamRequest", "replicationFactor", 4, T.TYPE_INT32),
    ("CreateStreamRequest", "partitions", 5, T.TYPE_INT32),
    ("CreateStreamRequest", "retentionMaxBytes", 6, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "retentionMaxAge", 8, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "segmentMaxBytes", 10, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "compactEnabled", 13, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "autoPauseTime", 14, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "minIsr", 16, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "optimisticConcurrencyControl", 17, T.TYPE_MESSAGE),
    ("CreateStreamRequest", "encryption", 18, T.TYPE_MESSAGE),
    ("NullableInt64", "value", 1, T.TYPE_INT64),
    ("NullableInt32", "value", 1, T.TYPE_INT32),
    ("NullableBool", "value", 1, T.TYPE_BOOL),
    ("DeleteStreamRequest", "name", 1, T.TYPE_STRING),
    ("PauseStreamRequest", "partitions", 2, T.TYPE_INT32),
    ("PauseStreamRequest", "resumeAll", 3, T.TYPE_BOOL),
    ("SetStreamReadonlyRequest", "readonly", 3, T.TYPE_BOOL),
    ("SubscribeRequest", "stream", 1, T.TYPE_STRING),
    ("SubscribeRequest", "partition", 2, T.TYPE_INT32),
    ("SubscribeRequest", "startPosition", 3, T.TYPE_ENUM),
    ("SubscribeRequest", "startOffset", 4, T.TYPE_INT64),
    ("SubscribeRequest", "startTimestamp", 5, T.TYPE_INT64),
    ("SubscribeRequest", "readISRReplica", 6, T.TYPE_BOOL),
    ("SubscribeRequest", "resume", 7, T.TYPE_BOOL),
    ("SubscribeRequest", "stopPosition", 8, T.TYPE_ENUM),
    ("SubscribeRequest", "stopOffset", 9, T.TYPE_INT64),
    ("SubscribeRequest", "stopTimestamp", 10, T.TYPE_INT64),
    ("SubscribeRequest", "consumer", 11, T.TYPE_MESSAGE),
    ("Consumer", "groupId", 1, T.TYPE_STRING),
    ("Consumer", "groupEpoch", 2, T.TYPE_UINT64),
    ("Consumer", "consumerId", 3, T.TYPE_STRING),
    ("FetchMetadataRequest", "streams", 1, T.TYPE_STRING),
    ("FetchMetadataRequest", "groups", 2, T.TYPE_STRING),
    ("FetchMetadataResponse", "brokers", 1, T.TYPE_MESSAGE),
    ("FetchMetadataResponse", "streamMetadata", 2, T.TYPE_MESSAGE),
    ("FetchMetadataResponse", "groupMetadata", 3, T.TYPE_MESSAGE),
    ("FetchPartitionMetadataRequest", "stream", 1, T.TYPE_STRING),
    ("FetchPartitionMetadataRequest", "partition", 2, T.TYPE_INT32),
    ("FetchPartitionMetadataResponse", "metadata", 1, T.TYPE_MESSAGE),
    ("PublishRequest", "key", 1, T.TYPE_BYTES),
    ("PublishRequest", "value", 2, T.TYPE_BYTES),
    ("PublishRequest", "stream", 3, T.TYPE_STRING),
    ("PublishRequest", "partition", 4, T.TYPE_INT32),
    ("PublishRequest", "headers", 5, T.TYPE_MESSAGE),
    ("PublishRequest", "ackInbox", 6, T.TYPE_STRING),
    ("PublishRequest", "correlationId", 7, T.TYPE_STRING),
    ("PublishRequest", "ackPolicy", 8, T.TYPE_ENUM),
    ("PublishRequest", "expectedOffset", 9, T.TYPE_INT64),
    ("PublishResponse", "ack", 1, T.TYPE_MESSAGE),
    ("PublishResponse", "asyncError", 2, T.TYPE_MESSAGE),
    ("PublishResponse", "correlationId", 3, T.TYPE_STRING),
    ("PublishAsyncError", "code", 1, T.TYPE_ENUM),
    ("PublishAsyncError", "message", 2, T.TYPE_STRING),
    ("PublishToSubjectRequest", "subject", 3, T.TYPE_STRING),
    ("PublishToSubjectRequest", "headers", 4, T.TYPE_MESSAGE),
    ("PublishToSubjectRequest", "ackPolicy", 7, T.TYPE_ENUM),
    ("PublishToSubjectResponse", "ack", 1, T.TYPE_MESSAGE),
    ("Ack", "stream", 1, T.TYPE_STRING),
    ("Ack", "partitionSubject", 2, T.TYPE_STRING),
    ("Ack", "msgSubject", 3, T.TYPE_STRING),
    ("Ack", "offset", 4, T.TYPE_INT64),
    ("Ack", "ackInbox", 5, T.TYPE_STRING),
    ("Ack", "correlationId", 6, T.TYPE_STRING),
    ("Ack", "ackPolicy", 7, T.TYPE_ENUM),
    ("Ack", "receptionTimestamp", 8, T.TYPE_INT64),
    ("Ack", "commitTimestamp", 9, T.TYPE_INT64),
    ("Ack", "ackError", 10, T.TYPE_ENUM),
    ("Message", "offset", 1, T.TYPE_INT64),
    ("Message", "key", 2, T.TYPE_BYTES),
    ("Message", "value", 3, T.TYPE_BYTES),
    ("Message", "timestamp", 4, T.TYPE_INT64),
    ("Message", "stream", 5, T.TYPE_STRING),
    ("Message", "partition", 6, T.TYPE_INT32),
    ("Message", "subject", 7, T.TYPE_STRING),
    ("Message", "replySubject", 8, T.TYPE_STRING),
    ("Message", "headers", 9, T.TYPE_MESSAGE),
    ("Message", "ackInbox", 10, T.TYPE_STRING),
    ("Message", "correlationId", 11, T.TYPE_STRING),
    ("Message", "ackPolicy", 12, T.TYPE_ENUM),
    ("Broker", "id", 1, T.TYPE_STRING),
    ("Broker", "host", 2, T.TYPE_STRING),
    ("Broker", "port", 3, T.TYPE_INT32),
    ("Broker", "partitionCount", 4, T.TYPE_INT32),
    ("Broker", "leaderCount", 5, T.TYPE_INT32),
    ("StreamMetadata", "name", 1, T.TYPE_STRING),
    ("StreamMetadata", "subject", 2, T.TYPE_STRING),
    ("StreamMetadata", "error", 3, T.TYPE_ENUM),
    ("StreamMetadata", "partitions", 4, T.TYPE_MESSAGE),
    ("StreamMetadata", "creationTimestamp", 5, T.TYPE_INT64),
    ("StreamMetadata.PartitionsEntry", "key", 1, T.TYPE_INT32),
    ("StreamMetadata.PartitionsEntry", "value", 2, T.TYPE_MESSAGE),
    ("ConsumerGroupMetadata", "groupId", 1, T.TYPE_STRING),
    ("ConsumerGroupMetadata", "error", 2, T.TYPE_ENUM),
    ("ConsumerGroupMetadata", "coordinator", 3, T.TYPE_STRING),
    ("ConsumerGroupMetadata", "epoch", 4, T.TYPE_UINT64),
    ("PartitionMetadata", "id", 1, T.TYPE_INT32),
    ("PartitionMetadata", "leader", 2, T.TYPE_STRING),
    ("PartitionMetadata", "replicas", 3, T.TYPE_STRING),
    ("PartitionMetadata", "isr", 4, T.TYPE_STRING),
    ("PartitionMetadata", "highWatermark", 5, T.TYPE_INT64),
    ("PartitionMetadata", "newestOffset", 6, T.TYPE_INT64),
    ("PartitionMetadata", "paused", 7, T.TYPE_BOOL),
    ("PartitionMetadata", "readonly", 8, T.TYPE_BOOL),
    ("PartitionMetadata", "messagesReceivedTimestamps", 9, T.TYPE_MESSAGE),
    ("PartitionMetadata", "pauseTimestamps", 10, T.TYPE_MESSAGE),
    ("PartitionMetadata", "readonlyTimestamps", 11, T.TYPE_MESSAGE),
    ("PartitionEventTimestamps", "firstTimestamp", 1, T.TYPE_INT64),
    ("PartitionEventTimestamps", "latestTimestamp", 2, T.TYPE_INT64),
    ("SetCursorRequest", "stream", 1, T.TYPE_STRING),
    ("SetCursorRequest", "partition", 2, T.TYPE_INT32),
    ("SetCursorRequest", "cursorId", 3, T.TYPE_STRING),
    ("SetCursorRequest", "offset", 4, T.TYPE_INT64),
    ("FetchCursorRequest", "stream", 1, T.TYPE_STRING),
    ("FetchCursorRequest", "partition", 2, T.TYPE_INT32),
    ("FetchCursorRequest", "cursorId", 3, T.TYPE_STRING),
    ("FetchCursorResponse", "offset", 1, T.TYPE_INT64),
    ("JoinConsumerGroupRequest", "streams", 3, T.TYPE_STRING),
    ("JoinConsumerGroupResponse", "coordinator", 1, T.TYPE_STRING),
    ("JoinConsumerGroupResponse", "epoch", 2, T.TYPE_UINT64),
    ("JoinConsumerGroupResponse", "consumerTimeout", 3, T.TYPE_INT64),
    ("JoinConsumerGroupResponse", "coordinatorTimeout", 4, T.TYPE_INT64),
    ("LeaveConsumerGroupRequest", "consumerId", 2, T.TYPE_STRING),
    ("FetchConsumerGroupAssignmentsRequest", "epoch", 3, T.TYPE_UINT64),
    ("FetchConsumerGroupAssignmentsResponse", "epoch", 1, T.TYPE_UINT64),
    ("FetchConsumerGroupAssignmentsResponse", "assignments", 2, T.TYPE_MESSAGE),
    ("PartitionAssignment", "partitions", 2, T.TYPE_INT32),
    ("ReportConsumerGroupCoordinatorRequest", "coordinator", 3, T.TYPE_STRING),
    ("ReportConsumerGroupCoordinatorRequest", "epoch", 4, T.TYPE_UINT64),
    ("ActivityStreamEvent", "id", 1, T.TYPE_UINT64),
    ("ActivityStreamEvent", "op", 2, T.TYPE_ENUM),
    ("ActivityStreamEvent", "leaveConsumerGroupOp", 9, T.TYPE_MESSAGE),
    ("LeaveConsumerGroupOp", "expired", 3, T.TYPE_BOOL),
]

# Fields tidelog adds to Liftbridge messages. They must be numbered 100 or more.
TIDELOG_FIELDS = {
    ("SubscribeRequest", "reverse"): (100, T.TYPE_BOOL),
    ("CreateStreamRequest", "logAppendTime"): (100, T.TYPE_BOOL),
}


def _message(name: str) -> Descriptor:
    descriptor = api.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
    for part in name.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


@pytest.mark.parametrize(("message", "field", "number", "type_"), FIELDS)
def test_field_number_and_type_match_liftbridge(message, field, number, type_) -> None:
    descriptor = _message(message).fields_by_name[field]
    assert (descriptor.number, descriptor.type) == (number, type_), f"{message}.{field}"


def test_repeated_and_map_fields_match_liftbridge() -> None:
    repeated = {
        ("PauseStreamRequest", "partitions"),
        ("SetStreamReadonlyRequest", "partitions"),
        ("FetchMetadataRequest", "streams"),
        ("FetchMetadataRequest", "groups"),
        ("FetchMetadataResponse", "brokers"),
        ("FetchMetadataResponse", "streamMetadata"),
        ("PartitionMetadata", "replicas"),
        ("PartitionMetadata", "isr"),
        ("JoinConsumerGroupRequest", "streams"),
    }
    for message, field in repeated:
        assert _message(message).fields_by_name[field].is_repeated, (message, field)
    maps = {
        ("PublishRequest", "headers"): (T.TYPE_STRING, T.TYPE_BYTES),
        ("PublishToSubjectRequest", "headers"): (T.TYPE_STRING, T.TYPE_BYTES),
        ("Message", "headers"): (T.TYPE_STRING, T.TYPE_BYTES),
        ("StreamMetadata", "partitions"): (T.TYPE_INT32, T.TYPE_MESSAGE),
    }
    for (message, field), (key_type, value_type) in maps.items():
        entry = _message(message).fields_by_name[field].message_type
        assert entry.GetOptions().map_entry, (message, field)
        assert entry.fields_by_name["key"].type == key_type
        assert entry.fields_by_name["value"].type == value_type


def test_every_liftbridge_message_is_defined() -> None:
    expected = {
        "NullableInt64", "NullableInt32", "NullableBool",
        "CreateStreamRequest", "CreateStreamResponse", "DeleteStreamRequest",
        "DeleteStreamResponse", "PauseStreamRequest", "PauseStreamResponse",
        "SetStreamReadonlyRequest", "SetStreamReadonlyResponse", "Consumer", "SubscribeRequest",
        "FetchMetadataRequest", "FetchMetadataResponse", "FetchPartitionMetadataRequest",
        "FetchPartitionMetadataResponse", "PublishRequest", "PublishAsyncError", "PublishResponse",
        "PublishToSubjectRequest", "PublishToSubjectResponse", "SetCursorRequest",
        "SetCursorResponse", "FetchCursorRequest", "FetchCursorResponse",
        "JoinConsumerGroupRequest", "JoinConsumerGroupResponse", "LeaveConsumerGroupRequest",
        "LeaveConsumerGroupResponse", "FetchConsumerGroupAssignmentsRequest",
        "PartitionAssignment", "FetchConsumerGroupAssignmentsResponse",
        "ReportConsumerGroupCoordinatorRequest", "ReportConsumerGroupCoordinatorResponse",
        "Broker", "StreamMetadata", "ConsumerGroupMetadata", "PartitionEventTimestamps",
        "PartitionMetadata", "Message", "Ack", "CreateStreamOp", "DeleteStreamOp",
        "PauseStreamOp", "ResumeStreamOp", "SetStreamReadonlyOp", "JoinConsumerGroupOp",
        "LeaveConsumerGroupOp", "ActivityStreamEvent",
    }  # fmt: skip
    assert set(api.DESCRIPTOR.message_types_by_name) == expected


def test_tidelog_additions_are_numbered_from_100() -> None:
    found = {}
    for message in api.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            if field.number >= 100:
                found[(message.name, field.name)] = (field.number, field.type)
            else:
                assert (message.name, field.name) not in TIDELOG_FIELDS
    assert found == TIDELOG_FIELDS


# --------------------------------------------------------------------------- enums

ENUMS = {
    "StartPosition": {"NEW_ONLY": 0, "OFFSET": 1, "EARLIEST": 2, "LATEST": 3, "TIMESTAMP": 4},
    "StopPosition": {"STOP_ON_CANCEL": 0, "STOP_OFFSET": 1, "STOP_LATEST": 2, "STOP_TIMESTAMP": 3},
    "AckPolicy": {"LEADER": 0, "ALL": 1, "NONE": 2},
    "ActivityStreamOp": {
        "CREATE_STREAM": 0,
        "DELETE_STREAM": 1,
        "PAUSE_STREAM": 2,
        "RESUME_STREAM": 3,
        "SET_STREAM_READONLY": 4,
        "JOIN_CONSUMER_GROUP": 5,
        "LEAVE_CONSUMER_GROUP": 6,
    },
}
NESTED_ENUMS = {
    ("StreamMetadata", "Error"): {"OK": 0, "UNKNOWN_STREAM": 1},
    ("ConsumerGroupMetadata", "Error"): {"OK": 0, "UNKNOWN_GROUP": 1},
    ("Ack", "Error"): {
        "OK": 0,
        "UNKNOWN": 1,
        "INCORRECT_OFFSET": 2,
        "TOO_LARGE": 3,
        "ENCRYPTION": 4,
    },
    ("PublishAsyncError", "Code"): {
        "UNKNOWN": 0,
        "BAD_REQUEST": 1,
        "NOT_FOUND": 2,
        "INTERNAL": 3,
        "READONLY": 4,
        "INCORRECT_OFFSET": 5,
        "ENCRYPTION_FAILED": 6,
        "PERMISSION_DENIED": 7,
    },
}


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_enum_values_match_liftbridge(name: str) -> None:
    enum = api.DESCRIPTOR.enum_types_by_name[name]
    assert {v.name: v.number for v in enum.values} == ENUMS[name]


@pytest.mark.parametrize(("message", "name"), sorted(NESTED_ENUMS))
def test_nested_enum_values_match_liftbridge(message: str, name: str) -> None:
    enum = api.DESCRIPTOR.message_types_by_name[message].enum_types_by_name[name]
    assert {v.name: v.number for v in enum.values} == NESTED_ENUMS[(message, name)]


# --------------------------------------------------------------------------- bytes on the wire
# A minimal protobuf encoder, independent of the library, to spell out the expected bytes.


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are sent as 64-bit two's complement
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _vi(number: int, value: int) -> bytes:
    return _varint(number << 3 | 0) + _varint(value)


def _ld(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def test_publish_request_bytes() -> None:
    request = api.PublishRequest(
        key=b"k",
        value=b"hello",
        stream="orders",
        partition=3,
        headers={"h": b"v"},
        ackInbox="inbox",
        correlationId="c-1",
        ackPolicy=api.ALL,
        expectedOffset=-1,
    )
    expected = (
        _ld(1, b"k")
        + _ld(2, b"hello")
        + _ld(3, "orders")
        + _vi(4, 3)
        + _ld(5, _ld(1, "h") + _ld(2, b"v"))
        + _ld(6, "inbox")
        + _ld(7, "c-1")
        + _vi(8, 1)
        + _vi(9, -1)
    )
    assert expected.endswith(b"\x48" + b"\xff" * 9 + b"\x01")  # the encoder itself: -1 as int64
    assert request.SerializeToString(deterministic=True) == expected
    assert api.PublishRequest.FromString(expected) == request


def test_subscribe_request_bytes() -> None:
    request = api.SubscribeRequest(
        stream="orders",
        partition=2,
        startPosition=api.OFFSET,
        startOffset=42,
        startTimestamp=7,
        readISRReplica=True,
        resume=True,
        stopPosition=api.STOP_OFFSET,
        stopOffset=300,
        stopTimestamp=9,
        consumer=api.Consumer(groupId="g", groupEpoch=5, consumerId="c"),
        reverse=True,
    )
    expected = (
        _ld(1, "orders")
        + _vi(2, 2)
        + _vi(3, 1)
        + _vi(4, 42)
        + _vi(5, 7)
        + _vi(6, 1)
        + _vi(7, 1)
        + _vi(8, 1)
        + _vi(9, 300)
        + _vi(10, 9)
        + _ld(11, _ld(1, "g") + _vi(2, 5) + _ld(3, "c"))
        + b"\xa0\x06\x01"  # field 100, varint: tidelog's reverse flag
    )
    assert request.SerializeToString(deterministic=True) == expected
    assert api.SubscribeRequest.FromString(expected) == request


def test_subscribe_request_from_a_plain_liftbridge_client_is_forward() -> None:
    # What a Liftbridge client that knows nothing of `reverse` sends for EARLIEST.
    decoded = api.SubscribeRequest.FromString(_ld(1, "orders") + _vi(3, 2))
    assert (decoded.stream, decoded.startPosition, decoded.reverse) == (
        "orders",
        api.EARLIEST,
        False,
    )


def test_message_bytes() -> None:
    message = api.Message(
        offset=7,
        key=b"k",
        value=b"v",
        timestamp=1_700_000_000_000_000_000,
        stream="orders",
        partition=1,
        subject="orders.1",
        replySubject="",
        headers={"subject": b"orders.1"},
        ackPolicy=api.NONE,
    )
    expected = (
        _vi(1, 7)
        + _ld(2, b"k")
        + _ld(3, b"v")
        + _vi(4, 1_700_000_000_000_000_000)
        + _ld(5, "orders")
        + _vi(6, 1)
        + _ld(7, "orders.1")
        + _ld(9, _ld(1, "subject") + _ld(2, b"orders.1"))
        + _vi(12, 2)
    )
    assert message.SerializeToString(deterministic=True) == expected
    assert api.Message.FromString(expected) == message
    # The subscription handshake is an empty Message: zero bytes on the wire.
    assert api.Message().SerializeToString() == b""


def test_publish_response_and_metadata_bytes() -> None:
    response = api.PublishResponse(
        ack=api.Ack(stream="orders", offset=12, commitTimestamp=5, ackError=api.Ack.TOO_LARGE),
        correlationId="c-1",
    )
    ack = _ld(1, "orders") + _vi(4, 12) + _vi(9, 5) + _vi(10, 3)
    assert response.SerializeToString(deterministic=True) == _ld(1, ack) + _ld(3, "c-1")

    metadata = api.FetchMetadataResponse(
        brokers=[api.Broker(id="b1", host="127.0.0.1", port=9292)],
        streamMetadata=[
            api.StreamMetadata(
                name="orders",
                partitions={1: api.PartitionMetadata(id=1, leader="b1", highWatermark=-1)},
            )
        ],
    )
    # Keys and ids are non-zero on purpose: proto3 leaves zero values out, and whether a map
    # entry's zero key is written differs between implementations (both decode the same).
    partition = _vi(1, 1) + _ld(2, "b1") + _vi(5, -1)
    expected = _ld(1, _ld(1, "b1") + _ld(2, "127.0.0.1") + _vi(3, 9292)) + _ld(
        2, _ld(1, "orders") + _ld(4, _vi(1, 1) + _ld(2, partition))
    )
    assert metadata.SerializeToString(deterministic=True) == expected

    cursor = api.SetCursorRequest(stream="orders", partition=1, cursorId="c", offset=10)
    assert cursor.SerializeToString() == _ld(1, "orders") + _vi(2, 1) + _ld(3, "c") + _vi(4, 10)
    assert api.FetchCursorResponse(offset=-1).SerializeToString() == _vi(1, -1)


# --------------------------------------------------------------------------- the service

# rpc -> (request, response, client streaming, server streaming)
RPCS = {
    "CreateStream": ("CreateStreamRequest", "CreateStreamResponse", False, False),
    "DeleteStream": ("DeleteStreamRequest", "DeleteStreamResponse", False, False),
    "PauseStream": ("PauseStreamRequest", "PauseStreamResponse", False, False),
    "SetStreamReadonly": ("SetStreamReadonlyRequest", "SetStreamReadonlyResponse", False, False),
    "Subscribe": ("SubscribeRequest", "Message", False, True),
    "FetchMetadata": ("FetchMetadataRequest", "FetchMetadataResponse", False, False),
    "FetchPartitionMetadata": (
        "FetchPartitionMetadataRequest",
        "FetchPartitionMetadataResponse",
        False,
        False,
    ),
    "Publish": ("PublishRequest", "PublishResponse", False, False),
    "PublishAsync": ("PublishRequest", "PublishResponse", True, True),
    "PublishToSubject": ("PublishToSubjectRequest", "PublishToSubjectResponse", False, False),
    "SetCursor": ("SetCursorRequest", "SetCursorResponse", False, False),
    "FetchCursor": ("FetchCursorRequest", "FetchCursorResponse", False, False),
    "JoinConsumerGroup": ("JoinConsumerGroupRequest", "JoinConsumerGroupResponse", False, False),
    "LeaveConsumerGroup": ("LeaveConsumerGroupRequest", "LeaveConsumerGroupResponse", False, False),
    "FetchConsumerGroupAssignments": (
        "FetchConsumerGroupAssignmentsRequest",
        "FetchConsumerGroupAssignmentsResponse",
        False,
        False,
    ),
    "ReportConsumerGroupCoordinator": (
        "ReportConsumerGroupCoordinatorRequest",
        "ReportConsumerGroupCoordinatorResponse",
        False,
        False,
    ),
}
KINDS = {
    (False, False): "unary_unary",
    (False, True): "unary_stream",
    (True, False): "stream_unary",
    (True, True): "stream_stream",
}


def test_service_methods_match_liftbridge() -> None:
    service = api.DESCRIPTOR.services_by_name["API"]
    assert service.full_name == "proto.API"
    assert [m.name for m in service.methods] == list(RPCS)
    for method in service.methods:
        request, response, client_streaming, server_streaming = RPCS[method.name]
        assert f"/{service.full_name}/{method.name}" == f"/proto.API/{method.name}"
        assert method.input_type.full_name == f"proto.{request}"
        assert method.output_type.full_name == f"proto.{response}"
        assert (method.client_streaming, method.server_streaming) == (
            client_streaming,
            server_streaming,
        )


class _RecordingChannel:
    """Stands in for grpc.Channel and records what the generated stub asks it for."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def __getattr__(self, kind: str):
        if kind not in KINDS.values():
            raise AttributeError(kind)

        def register(path: str, **_: object) -> str:
            self.calls[path] = kind
            return path

        return register


def test_generated_stub_uses_liftbridge_method_paths() -> None:
    channel = _RecordingChannel()
    stub = api_grpc.APIStub(channel)
    expected = {f"/proto.API/{name}": KINDS[spec[2], spec[3]] for name, spec in RPCS.items()}
    assert channel.calls == expected
    assert stub.Publish == "/proto.API/Publish"


class _EchoPublisher(api_grpc.APIServicer):
    def Publish(self, request, context):
        return api.PublishResponse(
            ack=api.Ack(stream=request.stream, offset=41, correlationId=request.correlationId),
            correlationId=request.correlationId,
        )


@pytest.fixture
def echo_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_grpc.add_APIServicer_to_server(_EchoPublisher(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        server.stop(grace=None)


def test_raw_bytes_reach_the_servicer_at_the_liftbridge_path(echo_server) -> None:
    # A client that knows only the path and the bytes, as any Liftbridge client does.
    publish = echo_server.unary_unary("/proto.API/Publish")
    request = _ld(3, "orders") + _ld(7, "c-9")
    reply = publish(request, timeout=10)
    assert reply == _ld(1, _ld(1, "orders") + _vi(4, 41) + _ld(6, "c-9")) + _ld(3, "c-9")

    with pytest.raises(grpc.RpcError) as failure:
        echo_server.unary_unary("/proto.API/PublishToSubject")(b"", timeout=10)
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
