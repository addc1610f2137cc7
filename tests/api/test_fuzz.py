"""Random and malformed requests against a live ``tidelog serve`` (hypothesis).

One server runs for the whole module. The tests throw random field values at every
``proto.API`` request type and at ``tidelog.v1`` (columnar batches made inconsistent on purpose),
then raw bytes at every method path, so the server has to parse invalid protobuf. Properties:

- every call ends with a gRPC status; never INTERNAL (a bug by the server's own contract), and
  never UNKNOWN for a request that is valid protobuf (an exception escaped a servicer);
- a publish that succeeds reports the next dense offset of its partition;
- afterwards the server is alive and answers metadata, shuts down cleanly, and every partition
  directory holds exactly the messages the fuzzer saw acknowledged, all of them passing the CRC
  check of ``SegmentedLog.verify()``.

Every write the server acknowledged is counted in a ledger (stream -> partition -> messages), so
the final check can compare the logs with what clients were told. Retention is kept out of the
picture by a maintenance interval longer than the module runs; the largest message is 1 KiB.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.log import FlushPolicy, LogConfig, SegmentedLog

pytestmark = pytest.mark.slow

FIELD = pb_descriptor.FieldDescriptor
API = pb.DESCRIPTOR.services_by_name["API"]
TIDELOG = v1.DESCRIPTOR.services_by_name["Tidelog"]
METHODS = {f"/{s.full_name}/{m.name}": m for s in (API, TIDELOG) for m in s.methods}

CALL_TIMEOUT = 30.0
"""A unary call or a bounded stream that has not ended by then is a hang."""
SUBSCRIBE_WINDOW = 0.25
"""How long a subscription may run before the fuzzer cancels it (by deadline)."""
MAX_MESSAGE_BYTES = 1024
"""The fuzz server's max_message_bytes (small, so oversized examples stay readable)."""

NEVER_OK = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
"""Statuses a request that parsed may never get: INTERNAL is tidelog's "this is a bug", and
UNKNOWN is what grpc answers when an exception escapes a servicer."""

TARGETS = {"fz-plain": 3, "fz-occ": 1, "fz-small": 2}
POOL = ["fz-pool-0", "fz-pool-1"]
SPECIAL_NAMES = [
    "__cursors",
    "",
    "-dash",
    "a" * 249,
    "a" * 250,
    "b" * 5000,
    "ünïcödé",
    "数据流",
    "a/b",
    "..",
    "x y",
    "nul\x00",
]


# -- the ledger ----------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the server acknowledged: messages per (stream, partition), for live streams only."""

    streams: dict[str, list[int]] = field(default_factory=dict)

    def created(self, name: str, partitions: int) -> None:
        self.streams[name] = [0] * partitions

    def deleted(self, name: str) -> None:
        del self.streams[name]

    def next_offset(self, stream: str, partition: int) -> int:
        return self.streams[stream][partition]

    def appended(self, stream: str, partition: int, count: int) -> None:
        self.streams[stream][partition] += count


@dataclass
class Fuzz:
    server: ServerProcess
    channel: grpc.Channel
    ledger: Ledger

    def unary(self, path: str, request: bytes | ProtoMessage) -> tuple[grpc.StatusCode, Any]:
        method = METHODS[path]
        raw = isinstance(request, bytes)
        call = self.channel.unary_unary(
            path,
            request_serializer=None if raw else type(request).SerializeToString,
            response_deserializer=None if raw else GetMessageClass(method.output_type).FromString,
        )
        try:
            return grpc.StatusCode.OK, call(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            return error.code(), error.details()

    def server_stream(
        self, path: str, request: bytes | ProtoMessage
    ) -> tuple[grpc.StatusCode, list[Any]]:
        method = METHODS[path]
        raw = isinstance(request, bytes)
        call = self.channel.unary_stream(
            path,
            request_serializer=None if raw else type(request).SerializeToString,
            response_deserializer=None if raw else GetMessageClass(method.output_type).FromString,
        )
        frames: list[Any] = []
        try:
            for frame in call(request, timeout=SUBSCRIBE_WINDOW):
                frames.append(frame)
        except grpc.RpcError as error:
            return error.code(), frames
        return grpc.StatusCode.OK, frames

    def bidi(
        self, path: str, requests: list[bytes] | list[ProtoMessage]
    ) -> tuple[grpc.StatusCode, list[Any]]:
        raw = isinstance(requests[0], bytes)
        call = self.channel.stream_stream(
            path,
            request_serializer=None if raw else pb.PublishRequest.SerializeToString,
            response_deserializer=None if raw else pb.PublishResponse.FromString,
        )
        responses: list[Any] = []
        try:
            for response in call(iter(requests), timeout=CALL_TIMEOUT):
                responses.append(response)
        except grpc.RpcError as error:
            return error.code(), responses
        return grpc.StatusCode.OK, responses


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    env = {
        "TIDELOG_MAINTENANCE_INTERVAL_S": "100000",
        "TIDELOG_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
    }
    server = ServerProcess(data, env=env).start()
    channel = grpc.insecure_channel(server.address)
    try:
        state = Fuzz(server, channel, Ledger())
        state.ledger.created("__cursors", 1)
        for name, partitions in TARGETS.items():
            request = pb.CreateStreamRequest(name=name, subject=name, partitions=partitions)
            if name == "fz-occ":
                request.optimisticConcurrencyControl.value = True
            if name == "fz-small":
                request.segmentMaxBytes.value = 4096
            code, _ = state.unary("/proto.API/CreateStream", request)
            assert code == grpc.StatusCode.OK
            state.ledger.created(name, partitions)
        yield state
    finally:
        channel.close()
        server.kill()  # by PID; a no-op when the last test already stopped it


# -- strategies ----------------------------------------------------------------------------------


INT32 = st.one_of(
    st.integers(-3, 8), st.sampled_from([-(2**31), 2**31 - 1]), st.integers(-(2**31), 2**31 - 1)
)
INT64 = st.one_of(
    st.integers(-3, 40), st.sampled_from([-(2**63), 2**63 - 1]), st.integers(-(2**63), 2**63 - 1)
)
UINT32 = st.integers(0, 2**32 - 1)
UINT64 = st.integers(0, 2**64 - 1)
ENUM = st.one_of(st.integers(-2, 6), st.sampled_from([-(2**31), 2**31 - 1]))
"""Known and unknown numbers: proto3 enums are open, so any int32 travels."""
PARTITION = st.one_of(st.integers(0, 2), st.integers(-2, 3), st.sampled_from([-(2**31), 2**31 - 1]))
PARTITION_COUNT = st.one_of(st.integers(-2, 4), st.sampled_from([1025, 2**31 - 1, -(2**31)]))
BIG = b"\xa5" * (MAX_MESSAGE_BYTES + 100)
PAYLOAD = st.integers(0, 24).flatmap(lambda i: st.just(BIG) if i == 0 else st.binary(max_size=48))
NAME = st.one_of(
    st.sampled_from(list(TARGETS)),
    st.sampled_from(list(TARGETS)),
    st.sampled_from([*POOL, *SPECIAL_NAMES]),
    st.text(max_size=12),
)
"""Stream names for reads, publishes, pauses...: the targets, a pool that random creates and
deletes churn, reserved, invalid, oversized and unicode names, and random text."""
NAME_TO_CHANGE = st.one_of(st.sampled_from([*POOL, *SPECIAL_NAMES]), st.text(max_size=12))
"""Names for creates and deletes: never the targets, so publishes keep somewhere to land."""

OVERRIDES: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("CreateStreamRequest", "name"): NAME_TO_CHANGE,
    ("CreateStreamRequest", "partitions"): PARTITION_COUNT,
    ("CreateStreamRequest", "replicationFactor"): st.integers(-2, 3),
    ("DeleteStreamRequest", "name"): NAME_TO_CHANGE,
    ("PauseStreamRequest", "partitions"): st.lists(PARTITION, max_size=3),
    ("SetStreamReadonlyRequest", "partitions"): st.lists(PARTITION, max_size=3),
    ("FetchMetadataRequest", "streams"): st.lists(NAME, max_size=3),
    ("JoinConsumerGroupRequest", "streams"): st.lists(NAME, max_size=2),
    ("PublishRequest", "value"): PAYLOAD,
    ("PublishRequest", "expectedOffset"): st.one_of(st.integers(-2, 30), INT64),
    ("PublishBatchRequest", "expected_offset"): st.one_of(st.integers(-2, 30), INT64),
    ("BrowseRequest", "partitions"): st.lists(PARTITION, max_size=3),
}


def _by_name(name: str) -> st.SearchStrategy[Any] | None:
    if name in ("stream", "name"):
        return NAME
    if name == "partition":
        return PARTITION
    return None


def _scalar(f: pb_descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = f.type
    if kind in (FIELD.TYPE_INT32, FIELD.TYPE_SINT32, FIELD.TYPE_SFIXED32):
        return INT32
    if kind in (FIELD.TYPE_INT64, FIELD.TYPE_SINT64, FIELD.TYPE_SFIXED64):
        return INT64
    if kind in (FIELD.TYPE_UINT32, FIELD.TYPE_FIXED32):
        return UINT32
    if kind in (FIELD.TYPE_UINT64, FIELD.TYPE_FIXED64):
        return UINT64
    if kind in (FIELD.TYPE_DOUBLE, FIELD.TYPE_FLOAT):
        return st.floats(width=32 if kind == FIELD.TYPE_FLOAT else 64)
    if kind == FIELD.TYPE_BOOL:
        return st.booleans()
    if kind == FIELD.TYPE_STRING:
        return st.text(max_size=16)
    if kind == FIELD.TYPE_BYTES:
        return st.binary(max_size=32)
    if kind == FIELD.TYPE_ENUM:
        return ENUM
    raise AssertionError(f"no strategy for {f.full_name}")


def _field(
    message: pb_descriptor.Descriptor, f: pb_descriptor.FieldDescriptor, depth: int
) -> st.SearchStrategy[Any]:
    special = OVERRIDES.get((message.name, f.name))
    if special is None:
        special = _by_name(f.name)
    if special is not None:
        return special
    if f.type == FIELD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return st.dictionaries(_scalar(key), _single(f.message_type, value, depth), max_size=3)
    single = _single(message, f, depth)
    if f.is_repeated:
        return st.lists(single, max_size=3)
    return single


def _single(
    message: pb_descriptor.Descriptor, f: pb_descriptor.FieldDescriptor, depth: int
) -> st.SearchStrategy[Any]:
    if f.type == FIELD.TYPE_MESSAGE:
        return random_message(f.message_type, depth + 1)
    return _scalar(f)


def _build(cls: type[ProtoMessage], values: dict[str, Any]) -> ProtoMessage:
    message = cls()
    for name, value in values.items():
        target = getattr(message, name)
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, ProtoMessage):
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif isinstance(value, list):
            if value and isinstance(value[0], ProtoMessage):
                for v in value:
                    target.add().CopyFrom(v)
            else:
                target.extend(value)
        elif isinstance(value, ProtoMessage):
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def random_message(descriptor: pb_descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any message of this type: each field left unset or given a random (often odd) value."""
    cls = GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    optional = {f.name: _field(descriptor, f, depth) for f in descriptor.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: _build(cls, values))


def _u32(values: list[int]) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


def _i32(values: list[int]) -> bytes:
    return np.array(values, dtype="<i4").tobytes()


@st.composite
def columns(draw: st.DrawFn) -> v1.Messages:
    """A columnar batch: consistent, or broken in one of the ways a buggy client breaks it."""
    values = draw(st.lists(PAYLOAD, max_size=6))
    keys = draw(
        st.lists(
            st.one_of(st.none(), st.binary(max_size=8)), min_size=len(values), max_size=len(values)
        )
    )
    headers = draw(
        st.lists(
            st.dictionaries(st.text(max_size=6), st.binary(max_size=8), max_size=2),
            min_size=len(values),
            max_size=len(values),
        )
    )
    batch = v1.Messages(values=b"".join(values), value_sizes=_u32([len(v) for v in values]))
    if draw(st.booleans()) and any(k is not None for k in keys):
        batch.keys = b"".join(k for k in keys if k)
        batch.key_sizes = _i32([-1 if k is None else len(k) for k in keys])
    if draw(st.booleans()) and any(headers):
        batch.headers.extend(
            v1.HeaderList(headers=[v1.Header(name=k, value=v) for k, v in h.items()])
            for h in headers
        )
    damage = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "value_sizes_ragged",
                "value_sizes_short",
                "value_sizes_long",
                "value_size_huge",
                "values_extra",
                "key_sizes_wrong_length",
                "key_size_huge",
                "key_size_below_minus_one",
                "keys_extra",
                "headers_wrong_length",
                "random_columns",
            ]
        )
    )
    n = len(values)
    if damage == "value_sizes_ragged":
        batch.value_sizes += draw(st.binary(min_size=1, max_size=3))
    elif damage == "value_sizes_short" and n:
        batch.value_sizes = batch.value_sizes[:-4]
    elif damage == "value_sizes_long":
        batch.value_sizes += _u32([draw(st.integers(1, 10))])
    elif damage == "value_size_huge":
        batch.value_sizes += _u32([draw(st.sampled_from([2**32 - 1, 2**31, 1 << 30]))])
    elif damage == "values_extra":
        batch.values += draw(st.binary(min_size=1, max_size=4))
    elif damage == "key_sizes_wrong_length":
        batch.key_sizes = _i32([1] * draw(st.integers(0, 8).filter(lambda m: m != n)))
        batch.keys = b"k" * (len(batch.key_sizes) // 4)
    elif damage == "key_size_huge" and n:
        batch.key_sizes = _i32([2**31 - 1] + [-1] * (n - 1))
    elif damage == "key_size_below_minus_one" and n:
        batch.key_sizes = _i32([draw(st.integers(-(2**31), -2))] + [0] * (n - 1))
        batch.keys = b""
    elif damage == "keys_extra" and batch.key_sizes:
        batch.keys += b"!"
    elif damage == "headers_wrong_length":
        del batch.headers[:]
        batch.headers.extend(
            v1.HeaderList() for _ in range(draw(st.integers(1, 8).filter(lambda m: m != n)))
        )
    elif damage == "random_columns":
        batch.values = draw(st.binary(max_size=16))
        batch.value_sizes = draw(st.binary(max_size=16))
        batch.keys = draw(st.binary(max_size=16))
        batch.key_sizes = draw(st.binary(max_size=16))
    return batch


# -- the oracle ----------------------------------------------------------------------------------


def column_problem(batch: v1.Messages) -> str | None:
    """Why the columns do not fit together (an independent reading of tidelog.proto), or None.

    ``keys`` bytes sent with no ``key_sizes`` are not judged here: the server ignores them (see
    ``test_keys_without_key_sizes_are_refused``)."""
    if len(batch.value_sizes) % 4:
        return "value_sizes ragged"
    sizes = [int(s) for s in np.frombuffer(batch.value_sizes, dtype="<u4")]
    if sum(sizes) != len(batch.values):
        return "value sizes do not add up"
    n = len(sizes)
    if batch.key_sizes:
        if len(batch.key_sizes) != 4 * n:
            return "key_sizes length"
        key_sizes = [int(s) for s in np.frombuffer(batch.key_sizes, dtype="<i4")]
        if any(s < -1 for s in key_sizes):
            return "key size below -1"
        if sum(max(s, 0) for s in key_sizes) != len(batch.keys):
            return "key sizes do not add up"
    if len(batch.headers) and len(batch.headers) != n:
        return "headers length"
    return None


def batch_messages(batch: v1.Messages) -> list[tuple[bytes, bytes, dict[str, bytes]]]:
    """(value, key, headers) of a consistent batch, for size checks."""
    sizes = [int(s) for s in np.frombuffer(batch.value_sizes, dtype="<u4")]
    ends = np.cumsum(sizes).tolist()
    values = [batch.values[e - s : e] for s, e in zip(sizes, ends, strict=True)]
    keys = [b""] * len(values)
    if batch.key_sizes:
        key_sizes = [max(int(s), 0) for s in np.frombuffer(batch.key_sizes, dtype="<i4")]
        key_ends = np.cumsum(key_sizes).tolist()
        keys = [batch.keys[e - s : e] for s, e in zip(key_sizes, key_ends, strict=True)]
    headers = [{h.name: h.value for h in lst.headers} for lst in batch.headers] or [{}] * len(
        values
    )
    return list(zip(values, keys, headers, strict=True))


def _check_status(code: grpc.StatusCode, detail: Any, what: object) -> None:
    assert code not in NEVER_OK, f"{code} ({detail}) for {what}"
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in {CALL_TIMEOUT} s to {what}"


def account(
    fuzz: Fuzz, path: str, request: ProtoMessage, code: grpc.StatusCode, reply: Any
) -> None:
    """Check what a parsed request got, and book what it wrote."""
    _check_status(code, reply, request)
    ledger = fuzz.ledger
    name = path.rsplit("/", 1)[1]
    if code != grpc.StatusCode.OK:
        if name == "PublishBatch" and request.stream and column_problem(request.messages):
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (reply, request)
        return
    if name == "CreateStream":
        ledger.created(request.name, request.partitions or 1)
    elif name == "DeleteStream":
        ledger.deleted(request.name)
    elif name == "SetCursor":
        key = f"{request.cursorId},{request.stream},{request.partition}".encode()
        ledger.appended("__cursors", zlib.crc32(key) % len(ledger.streams["__cursors"]), 1)
    elif name == "Publish":
        expected = ledger.next_offset(request.stream, request.partition)
        if request.ackPolicy != pb.NONE:
            assert (reply.ack.stream, reply.ack.offset) == (request.stream, expected), request
        ledger.appended(request.stream, request.partition, 1)
    elif name == "PublishBatch":
        assert column_problem(request.messages) is None, request
        count = len(request.messages.value_sizes) // 4
        if count and request.ack_policy != v1.ACK_POLICY_NONE:
            expected = ledger.next_offset(request.stream, request.partition)
            assert (reply.first_offset, reply.count) == (expected, count), request
        ledger.appended(request.stream, request.partition, count)
    elif name == "FetchMetadata":
        assert len(reply.brokers) == 1
        listed = {m.name for m in reply.streamMetadata if m.error == pb.StreamMetadata.OK}
        assert listed <= set(ledger.streams), listed - set(ledger.streams)


FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

UNARY_PATHS = sorted(
    p for p, m in METHODS.items() if not m.client_streaming and not m.server_streaming
)
UNARY_REQUESTS = st.one_of(
    [random_message(METHODS[p].input_type).map(lambda r, p=p: (p, r)) for p in UNARY_PATHS]
)


# -- the tests -----------------------------------------------------------------------------------


@FUZZ
@given(call=UNARY_REQUESTS)
def test_random_unary_requests(fuzz: Fuzz, call: tuple[str, ProtoMessage]) -> None:
    path, request = call
    code, reply = fuzz.unary(path, request)
    account(fuzz, path, request, code, reply)


@FUZZ
@given(
    stream=st.one_of(st.sampled_from([*TARGETS, *POOL]), NAME),
    partition=PARTITION,
    messages=columns(),
    ack_policy=ENUM,
    expected_offset=st.one_of(st.just(-1), st.integers(-2, 30), INT64),
)
@example(  # an internal stream: only the broker writes it (a CI run drew this)
    stream="__cursors",
    partition=0,
    messages=v1.Messages(value_sizes=b"\0\0\0\0"),
    ack_policy=0,
    expected_offset=-1,
)
def test_random_publish_batches(
    fuzz: Fuzz,
    stream: str,
    partition: int,
    messages: v1.Messages,
    ack_policy: int,
    expected_offset: int,
) -> None:
    request = v1.PublishBatchRequest(
        stream=stream,
        partition=partition,
        messages=messages,
        ack_policy=ack_policy,
        expected_offset=expected_offset,
    )
    code, reply = fuzz.unary("/tidelog.v1.Tidelog/PublishBatch", request)
    account(fuzz, "/tidelog.v1.Tidelog/PublishBatch", request, code, reply)
    if code == grpc.StatusCode.OK or not stream or column_problem(messages):
        return
    if ack_policy not in (v1.ACK_POLICY_LEADER, v1.ACK_POLICY_ALL, v1.ACK_POLICY_NONE):
        assert code == grpc.StatusCode.INVALID_ARGUMENT, reply  # request checks come first
        return
    live = fuzz.ledger.streams.get(stream)
    if live is not None and stream.startswith("__"):
        # Only the broker writes an internal stream; a header the format cannot hold is found
        # before the stream is looked at (INVALID_ARGUMENT).
        assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT), reply
        return
    if live is not None and 0 <= partition < len(live) and messages.value_sizes:
        sizes = [len(v) + len(k) for v, k, _ in batch_messages(messages)]
        if max(sizes) > MAX_MESSAGE_BYTES:  # (an expected-offset mismatch may be found first)
            assert code in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION,
            ), reply
        else:  # read-only partition, or an expected offset that is not the next one
            assert code == grpc.StatusCode.FAILED_PRECONDITION, reply
    elif live is None:
        assert code == grpc.StatusCode.NOT_FOUND, reply


ASYNC_REQUEST = random_message(pb.PublishRequest.DESCRIPTOR).filter(
    lambda r: r.ackPolicy != pb.NONE
)
"""NONE gets no response, so nothing would tell the ledger whether it was written."""


@settings(FUZZ, max_examples=100)
@given(
    requests=st.lists(
        st.one_of(
            ASYNC_REQUEST,
            st.builds(
                lambda s, p, v: pb.PublishRequest(stream=s, partition=p, value=v),
                st.sampled_from(list(TARGETS)),
                st.integers(0, 1),
                PAYLOAD,
            ),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_random_publish_async_streams(fuzz: Fuzz, requests: list[pb.PublishRequest]) -> None:
    for i, request in enumerate(requests):
        request.correlationId = str(i)
    code, responses = fuzz.bidi("/proto.API/PublishAsync", requests)
    _check_status(code, responses, requests)
    assert code == grpc.StatusCode.OK
    assert sorted(int(r.correlationId) for r in responses) == list(range(len(requests)))
    for response in sorted(responses, key=lambda r: int(r.correlationId)):
        request = requests[int(response.correlationId)]
        if response.HasField("asyncError"):
            allowed = {
                pb.PublishAsyncError.BAD_REQUEST,
                pb.PublishAsyncError.NOT_FOUND,
                pb.PublishAsyncError.READONLY,
                pb.PublishAsyncError.INCORRECT_OFFSET,
            }
            if request.stream.startswith("__"):  # internal streams refuse outside publishers
                allowed.add(pb.PublishAsyncError.PERMISSION_DENIED)
            assert response.asyncError.code in allowed, response
            continue
        expected = fuzz.ledger.next_offset(request.stream, request.partition)
        assert (response.ack.stream, response.ack.offset) == (request.stream, expected)
        fuzz.ledger.appended(request.stream, request.partition, 1)


def _subscription_frames_ok(request: Any, frames: list[Any], forward: bool) -> None:
    if not frames:
        return
    assert frames[0] == type(frames[0])(), "the first frame is not the handshake"
    offsets: list[int] = []
    for frame in frames[1:]:
        if isinstance(frame, pb.Message):
            assert (frame.stream, frame.partition) == (request.stream, request.partition)
            offsets.append(frame.offset)
        else:
            got = np.frombuffer(frame.offsets, dtype="<i8").tolist()
            if request.without_timestamps:  # left out, and said so on a frame with records
                assert frame.timestamps == b"" and frame.timestamps_omitted == bool(got)
            else:
                assert len(frame.timestamps) == len(frame.offsets)
            if request.without_value_sizes:
                assert frame.messages.value_sizes == b""
                assert frame.messages.value_sizes_omitted == bool(got)
            else:
                assert len(frame.messages.value_sizes) == len(frame.offsets) // 2
            offsets += got
    assert offsets == sorted(offsets, reverse=not forward), offsets
    assert len(set(offsets)) == len(offsets)


@settings(FUZZ, max_examples=100)
@given(request=random_message(pb.SubscribeRequest.DESCRIPTOR))
def test_random_subscribe_requests(fuzz: Fuzz, request: pb.SubscribeRequest) -> None:
    code, frames = fuzz.server_stream("/proto.API/Subscribe", request)
    assert code not in NEVER_OK, (code, request)
    _subscription_frames_ok(request, frames, forward=not request.reverse)


@settings(FUZZ, max_examples=100)
@given(request=random_message(v1.SubscribeBatchesRequest.DESCRIPTOR))
def test_random_subscribe_batches_requests(fuzz: Fuzz, request: v1.SubscribeBatchesRequest) -> None:
    code, frames = fuzz.server_stream("/tidelog.v1.Tidelog/SubscribeBatches", request)
    assert code not in NEVER_OK, (code, request)
    if request.without_value_sizes and not request.without_values:
        assert code is grpc.StatusCode.INVALID_ARGUMENT and not frames, (code, request)
    _subscription_frames_ok(request, frames, forward=not request.reverse)


def _parsed(path: str, data: bytes) -> ProtoMessage | None:
    try:
        return GetMessageClass(METHODS[path].input_type).FromString(data)
    except DecodeError:
        return None


GARBAGE = st.one_of(
    st.binary(max_size=64),
    # Valid field tags with broken lengths and wire types, the usual way protobuf breaks.
    st.lists(
        st.sampled_from([b"\x0a", b"\x12", b"\x1a", b"\x08", b"\x10", b"\xff", b"\x80", b"\x0b"])
        | st.binary(min_size=1, max_size=4),
        max_size=12,
    ).map(b"".join),
)


@FUZZ
@example(path="/tidelog.v1.Tidelog/Replicate", data=b"")
@given(path=st.sampled_from(sorted(METHODS)), data=GARBAGE)
def test_raw_bytes_at_every_method(fuzz: Fuzz, path: str, data: bytes) -> None:
    method = METHODS[path]
    parsed = _parsed(path, data)
    if path == "/tidelog.v1.Tidelog/Consume":
        # A parsable start may legitimately wait for permits until the deadline; what must
        # never happen is an INTERNAL status.
        code, _ = fuzz.bidi(path, [data])
        assert code != grpc.StatusCode.INTERNAL
        return
    if path == "/tidelog.v1.Tidelog/PublishStream":
        code, replies = fuzz.bidi(path, [data])
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED), replies
        for raw in replies:
            assert parsed is not None
            response = v1.PublishBatchResponse.FromString(raw)
            status = next(c for c in grpc.StatusCode if c.value[0] == response.error_code)
            account(fuzz, "/tidelog.v1.Tidelog/PublishBatch", parsed, status, response)
        return
    if path == "/tidelog.v1.Tidelog/Replicate":
        # This server has no site id: a decodable hello or batch is refused as such, bytes that
        # do not decode as the caller's error; nothing is answered or stored either way.
        code, replies = fuzz.bidi(path, [data])
        expected = (
            grpc.StatusCode.FAILED_PRECONDITION
            if parsed is not None
            else (grpc.StatusCode.INVALID_ARGUMENT)
        )
        assert (code, replies) == (expected, []), replies
        return
    if method.client_streaming:
        assume(parsed is None or parsed.ackPolicy != pb.NONE)  # the ledger needs a response
        code, replies = fuzz.bidi(path, [data])
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED), replies
        for raw in replies:
            response = pb.PublishResponse.FromString(raw)
            assert parsed is not None
            if not response.HasField("asyncError"):
                expected = fuzz.ledger.next_offset(parsed.stream, parsed.partition)
                assert response.ack.offset == expected
                fuzz.ledger.appended(parsed.stream, parsed.partition, 1)
        if parsed is not None:
            assert code == grpc.StatusCode.OK
        # (An unparsable request ends the stream OK today: see
        # test_an_unparsable_request_fails_a_publish_async_stream.)
        return
    if method.server_streaming:
        code, frames = fuzz.server_stream(path, data)
        assert code != grpc.StatusCode.INTERNAL, frames
        if parsed is not None:
            assert code not in NEVER_OK, (code, parsed)
        return
    code, reply = fuzz.unary(path, data)
    assert code != grpc.StatusCode.INTERNAL, reply
    if parsed is None:
        # grpc itself answers a request it cannot parse, before any tidelog code runs.
        assert code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT), reply
        return
    if code == grpc.StatusCode.OK:
        reply = GetMessageClass(method.output_type).FromString(reply)
    account(fuzz, path, parsed, code, reply)


# -- targeted cases the fuzzer would otherwise only meet by luck ---------------------------------


def test_unknown_ack_policies_are_invalid_arguments(fuzz: Fuzz) -> None:
    """docs/api.md, Errors: INVALID_ARGUMENT for "unknown enum values"; ackPolicy is an enum."""
    publish = pb.PublishRequest(stream="fz-plain", value=b"v", ackPolicy=7)
    code, reply = fuzz.unary("/proto.API/Publish", publish)
    if code == grpc.StatusCode.OK:
        fuzz.ledger.appended("fz-plain", 0, 1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, reply
    batch = v1.PublishBatchRequest(
        stream="fz-plain", messages=v1.Messages(values=b"v", value_sizes=_u32([1])), ack_policy=9
    )
    code, reply = fuzz.unary("/tidelog.v1.Tidelog/PublishBatch", batch)
    if code == grpc.StatusCode.OK:
        fuzz.ledger.appended("fz-plain", 0, 1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, reply


def test_keys_without_key_sizes_are_refused(fuzz: Fuzz) -> None:
    """tidelog.proto: ``keys`` holds the keys whose lengths ``key_sizes`` gives, and ``key_sizes``
    empty means "no keys at all". Key bytes with no sizes are a malformed batch (a client that
    forgot ``key_sizes``); storing the messages without their keys loses data silently."""
    batch = v1.PublishBatchRequest(
        stream="fz-plain",
        partition=1,
        messages=v1.Messages(values=b"ab", value_sizes=_u32([1, 1]), keys=b"k1k2"),
    )
    code, reply = fuzz.unary("/tidelog.v1.Tidelog/PublishBatch", batch)
    if code == grpc.StatusCode.OK:
        fuzz.ledger.appended("fz-plain", 1, 2)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, reply


def test_an_unparsable_request_fails_a_publish_async_stream(fuzz: Fuzz) -> None:
    """A request the server cannot parse in the middle of a PublishAsync stream must fail the
    call: answering OK would tell the client its stream was handled, while the bad request and
    everything after it were dropped without a word."""
    first = pb.PublishRequest(stream="fz-plain", partition=2, value=b"a", correlationId="1")
    last = pb.PublishRequest(stream="fz-plain", partition=2, value=b"b", correlationId="3")
    code, replies = fuzz.bidi(
        "/proto.API/PublishAsync",
        [first.SerializeToString(), b"\xff\xff\xff", last.SerializeToString()],
    )
    responses = [pb.PublishResponse.FromString(r) for r in replies]
    for response in responses:  # keep the ledger right whatever happened
        if not response.HasField("asyncError"):
            fuzz.ledger.appended("fz-plain", 2, 1)
    assert code not in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL), (code, responses)


def test_empty_and_extreme_values_are_answered(fuzz: Fuzz) -> None:
    """A few hand-picked corner cases, with the exact statuses the contract gives them.

    They use streams of their own: the random tests may have made the shared ones read-only,
    and a read-only partition answers FAILED_PRECONDITION before it looks at anything else."""
    for name, occ in (("fz-edge", False), ("fz-edge-occ", True)):
        create = pb.CreateStreamRequest(name=name, partitions=1)
        if occ:
            create.optimisticConcurrencyControl.value = True
        code, _ = fuzz.unary("/proto.API/CreateStream", create)
        assert code == grpc.StatusCode.OK
        fuzz.ledger.created(name, 1)
    cases: list[tuple[str, ProtoMessage, str]] = [
        ("/proto.API/CreateStream", pb.CreateStreamRequest(name="a" * 250), "INVALID_ARGUMENT"),
        ("/proto.API/CreateStream", pb.CreateStreamRequest(name="ünï"), "INVALID_ARGUMENT"),
        (
            "/proto.API/CreateStream",
            pb.CreateStreamRequest(name="fz-x", partitions=-1),
            "INVALID_ARGUMENT",
        ),
        (
            "/proto.API/CreateStream",
            pb.CreateStreamRequest(name="fz-x", partitions=2**31 - 1),
            "INVALID_ARGUMENT",
        ),
        (
            "/proto.API/CreateStream",
            pb.CreateStreamRequest(name="fz-x", replicationFactor=3),
            "INVALID_ARGUMENT",
        ),
        ("/proto.API/DeleteStream", pb.DeleteStreamRequest(name="__cursors"), "PERMISSION_DENIED"),
        ("/proto.API/Publish", pb.PublishRequest(stream="", value=b"v"), "INVALID_ARGUMENT"),
        ("/proto.API/Publish", pb.PublishRequest(stream="fz-edge", partition=-1), "NOT_FOUND"),
        (
            "/proto.API/Publish",
            pb.PublishRequest(stream="fz-edge", partition=2**31 - 1),
            "NOT_FOUND",
        ),
        (
            "/proto.API/Publish",
            pb.PublishRequest(stream="fz-edge", value=BIG),
            "RESOURCE_EXHAUSTED",
        ),
        (
            "/proto.API/Publish",
            pb.PublishRequest(stream="fz-edge-occ", expectedOffset=2**63 - 1),
            "FAILED_PRECONDITION",
        ),
        (
            "/proto.API/FetchPartitionMetadata",
            pb.FetchPartitionMetadataRequest(stream="fz-edge", partition=-1),
            "NOT_FOUND",
        ),
        ("/proto.API/SetCursor", pb.SetCursorRequest(stream="fz-edge"), "INVALID_ARGUMENT"),
        ("/proto.API/FetchCursor", pb.FetchCursorRequest(cursorId="c"), "INVALID_ARGUMENT"),
        ("/proto.API/PublishToSubject", pb.PublishToSubjectRequest(subject="s"), "NOT_FOUND"),
        ("/proto.API/PublishToSubject", pb.PublishToSubjectRequest(), "INVALID_ARGUMENT"),
        (
            "/proto.API/PublishToSubject",
            pb.PublishToSubjectRequest(subject="fz-edge", ackPolicy=7),
            "INVALID_ARGUMENT",
        ),
        (
            "/proto.API/JoinConsumerGroup",
            pb.JoinConsumerGroupRequest(groupId="g"),
            "INVALID_ARGUMENT",
        ),
        (
            "/tidelog.v1.Tidelog/PublishBatch",
            v1.PublishBatchRequest(stream="fz-edge", messages=v1.Messages(value_sizes=b"\x01")),
            "INVALID_ARGUMENT",
        ),
        (
            "/tidelog.v1.Tidelog/PublishBatch",
            v1.PublishBatchRequest(
                stream="fz-edge", messages=v1.Messages(values=b"x", value_sizes=_u32([2**32 - 1]))
            ),
            "INVALID_ARGUMENT",
        ),
    ]
    for path, request, expected in cases:
        code, reply = fuzz.unary(path, request)
        assert code.name == expected, (path, request, code, reply)
    for request in (
        pb.SubscribeRequest(stream="fz-edge", stopPosition=pb.STOP_OFFSET, stopOffset=-5),
        pb.SubscribeRequest(stream="fz-edge", startPosition=99),
        pb.SubscribeRequest(stream="fz-edge", stopPosition=-3),
    ):
        code, frames = fuzz.server_stream("/proto.API/Subscribe", request)
        assert (code, frames) == (grpc.StatusCode.INVALID_ARGUMENT, []), request


# -- afterwards ----------------------------------------------------------------------------------


def test_zz_server_survived_and_every_log_verifies(fuzz: Fuzz) -> None:
    """Runs last (file order): the server is alive, then stops cleanly, then every partition on
    disk verifies and holds exactly what was acknowledged."""
    server = fuzz.server
    assert server.process is not None and server.process.poll() is None, "the server died"
    code, metadata = fuzz.unary("/proto.API/FetchMetadata", pb.FetchMetadataRequest())
    assert code == grpc.StatusCode.OK
    served = {m.name: len(m.partitions) for m in metadata.streamMetadata}
    assert served == {name: len(counts) for name, counts in fuzz.ledger.streams.items()}

    fuzz.channel.close()
    assert server.stop() == 0
    # No tidelog code logged an unexpected exception (grpc's own complaints about unparsable
    # requests are logged under grpc's logger and are expected here).
    tidelog_errors = [
        line for line in server.stderr_lines if re.search(r" (ERROR|CRITICAL) tidelog\.", line)
    ]
    assert not tidelog_errors, "".join(tidelog_errors)

    streams = server.data_dir / "streams"
    on_disk = sorted(p.name for p in streams.iterdir() if p.is_dir())
    assert on_disk == sorted(fuzz.ledger.streams)
    config = LogConfig(flush_policy=FlushPolicy.NEVER)
    for name, counts in fuzz.ledger.streams.items():
        partitions = sorted(  # beside the partitions, a stream may hold views/
            (int(p.name) for p in (streams / name).iterdir() if p.is_dir() and p.name != "views"),
        )
        assert partitions == list(range(len(counts))), name
        for number, acknowledged in enumerate(counts):
            with SegmentedLog(streams / name / str(number), config) as log:
                assert log.recovery_report.clean, (name, number, log.recovery_report)
                assert log.verify() == acknowledged, (name, number)
                assert log.next_offset == acknowledged, (name, number)
