"""Subscribe positions against a real server, through ``proto.API/Subscribe`` (raw gRPC: the
handshake frame and the end statuses) and through ``tidelog.Client`` (``tidelog.v1``), for every
row of the table in ``tests/broker/subscribe_model.py`` (docs/api.md, "Subscribe positions").

The model of each partition is built from what the test published: offsets, keys, values and
headers from the acknowledgements; timestamps from one full read, which is first checked against
those acknowledgements. Partitions: ``empty``, ``dense`` (one three-message batch shares a
timestamp; fresh for every test, so subscriptions that wait can be fed three more messages), and
``trimmed`` (retention removed its first segments; one per module, never written after setup).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.broker.subscribe_model import (
    AFTER_NEWEST,
    BEFORE_FIRST,
    CASES,
    Case,
    End,
    Outcome,
    Plan,
    Pos,
    Rec,
    expect,
    high_watermark,
    outcome,
    plan,
)
from tests.support.server import ServerProcess

import tidelog
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.broker import StartPosition, StopPosition, SubscribeRequest
from tidelog.client import ClientError, InvalidArgument, Message, ReceivedMessage

DEADLINE_S = 15.0
"""Per-call deadline for raw subscriptions: a server that under-delivers fails, never hangs."""

Content = tuple[bytes | None, bytes, dict[str, bytes]]
"""(key, value, headers) of one message"""


@dataclass
class Fixture:
    server: ServerProcess
    client: tidelog.Client
    api: pb_grpc.APIStub
    v1: v1_grpc.TidelogStub
    trimmed: PartitionModel | None = None
    names: Iterator[int] = field(default_factory=itertools.count)

    def name(self, kind: str) -> str:
        return f"{kind}-{next(self.names)}"


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    """One server for the module (maintenance every 50 ms, for the trimmed partition)."""
    server = ServerProcess(
        Path(tmp_path_factory.mktemp("subscribe")) / "data",
        env={"TIDELOG_MAINTENANCE_INTERVAL_S": "0.05"},
    ).start()
    try:
        channel = grpc.insecure_channel(server.address)
        with tidelog.Client(server.address) as client:
            yield Fixture(server, client, pb_grpc.APIStub(channel), v1_grpc.TidelogStub(channel))
        channel.close()
    finally:
        server.kill()


# -- the model of one partition --------------------------------------------------------------------


@dataclass
class PartitionModel:
    stream: str
    content: dict[int, Content] = field(default_factory=dict)
    """Every acknowledged message by offset."""
    records: list[Rec] = field(default_factory=list)
    """Retained records (offset, timestamp), as read back once and checked against ``content``."""

    def timestamp(self, offset: int) -> int:
        return dict(self.records)[offset]


def content_of(label: str, i: int) -> Content:
    key = None if i % 3 == 0 else f"k-{label}-{i}".encode()
    headers = {"n": str(i).encode()} if i % 2 else {}
    return key, f"v-{label}-{i}".encode(), headers


def publish(fx: Fixture, model: PartitionModel, sizes: list[int], label: str) -> None:
    """Publish batches of the given sizes (one timestamp each); the acks extend the model."""
    for size in sizes:
        contents = [content_of(label, len(model.content) + i) for i in range(size)]
        acks = fx.client.publish_batch(
            model.stream, [Message(v, key=k, headers=h) for k, v, h in contents], partition=0
        )
        assert len(acks) == size
        for ack, item in zip(acks, contents, strict=True):
            assert ack.offset not in model.content
            model.content[ack.offset] = item


def read_all(fx: Fixture, stream: str) -> list[ReceivedMessage]:
    return list(fx.client.subscribe(stream, start="earliest", stop="latest"))


def refresh(fx: Fixture, model: PartitionModel, *, trimmed: bool = False) -> None:
    """Read the partition back: it must hold exactly the acknowledged messages (with ``trimmed``:
    a suffix of them, retention having removed the head); take the timestamps from it."""
    got = read_all(fx, model.stream) if model.content else []
    offsets = [m.offset for m in got]
    acked = sorted(model.content)
    if trimmed:
        assert offsets and offsets == acked[len(acked) - len(offsets) :], "a suffix of the acked"
    else:
        assert offsets == acked, "exactly what was acknowledged"
    for m in got:
        key, value, headers = model.content[m.offset]
        assert (m.key, m.value, dict(m.headers)) == (key, value, headers)
    model.records = [(m.offset, m.timestamp) for m in got]


def dense(fx: Fixture) -> PartitionModel:
    model = PartitionModel(fx.name("dense"))
    fx.client.create_stream(model.stream)
    publish(fx, model, [1, 1, 3, 1, 2, 1, 1], "d")
    refresh(fx, model)
    return model


def empty(fx: Fixture) -> PartitionModel:
    model = PartitionModel(fx.name("empty"))
    fx.client.create_stream(model.stream)
    return model


def trimmed(fx: Fixture) -> PartitionModel:
    """Built once: 20 messages of ~1 KB in 4 KiB segments, keeping at least 6."""
    if fx.trimmed is not None:
        return fx.trimmed
    model = PartitionModel(fx.name("trimmed"))
    fx.client.create_stream(model.stream, segment_max_bytes=4096, retention_messages=6)
    for i in range(20):
        acks = fx.client.publish_batch(model.stream, [b"%d" % i + b"." * 1000], partition=0)
        model.content[acks[0].offset] = (None, b"%d" % i + b"." * 1000, {})
    # Wait for retention (a maintenance pass every 50 ms) to settle: the oldest offset above 0
    # and unchanged over several passes. Bounded; the assertion below reports a server that never
    # applied retention.
    history: list[int] = []
    for _ in range(200):
        messages = fx.client.subscribe(model.stream, start="earliest", stop="latest")
        history.append(next(messages).offset)
        messages.close()
        if len(history) >= 5 and history[-1] > 0 and len(set(history[-5:])) == 1:
            break
        time.sleep(0.05)
    assert history[-1] > 0, f"retention never removed the head: {history[-10:]}"
    refresh(fx, model, trimmed=True)
    fx.trimmed = model
    return model


BUILDERS = {"empty": empty, "dense": dense, "trimmed": trimmed}


def feed(fx: Fixture, model: PartitionModel) -> None:
    """Three more messages (two publishes) for a subscription that waits; the model follows."""
    assert not model.stream.startswith("trimmed"), "the trimmed partition is never written"
    publish(fx, model, [1, 2], "m")
    refresh(fx, model)


# -- raw proto.API/Subscribe -----------------------------------------------------------------------


def raw_request(stream: str, request: SubscribeRequest) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(
        stream=stream,
        partition=0,
        startPosition=int(request.start),  # type: ignore[arg-type]
        startOffset=request.start_offset,
        startTimestamp=request.start_timestamp,
        stopPosition=int(request.stop),  # type: ignore[arg-type]
        stopOffset=request.stop_offset,
        stopTimestamp=request.stop_timestamp,
        reverse=request.reverse,
    )


def check_raw_message(model: PartitionModel, message: pb.Message, offset: int) -> None:
    key, value, headers = model.content[offset]
    assert message.offset == offset
    assert (message.key, message.value, dict(message.headers)) == (key or b"", value, headers)
    assert message.timestamp == model.timestamp(offset)
    assert (message.stream, message.partition, message.subject) == (model.stream, 0, model.stream)


def raw_take(call: Iterator[pb.Message], model: PartitionModel, offsets: Any) -> None:
    """The next messages are exactly ``offsets`` (the call's deadline bounds a short delivery)."""
    for offset in offsets:
        check_raw_message(model, next(call), offset)


def raw_end(call: Any, end: End) -> None:
    """The call's next event is the documented end."""
    if end is End.WAITS:
        call.cancel()
        return
    if end is End.OLDEST:
        with pytest.raises(StopIteration):
            next(call)
        assert call.code() is grpc.StatusCode.OK
        return
    assert end is End.STOP
    with pytest.raises(grpc.RpcError) as raised:
        next(call)
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.details() == "stop offset reached"


def as_liftbridge_starts(records: list[Rec], request: SubscribeRequest) -> SubscribeRequest:
    """The request as ``proto.API/Subscribe`` resolves it, as Liftbridge does: a negative start
    offset counts as 0, and a forward start beyond the high watermark starts at the next message
    (``tidelog.v1`` refuses the first and waits for the offset in the second; docs/api.md,
    "Subscribe positions")."""
    if request.start is not StartPosition.OFFSET:
        return request
    start = max(request.start_offset, 0)
    if not request.reverse:
        start = min(start, high_watermark(records) + 1)
    return dataclasses.replace(request, start_offset=start)


@pytest.mark.parametrize("kind", BUILDERS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_raw_subscribe(fx: Fixture, kind: str, case: Case) -> None:
    model = BUILDERS[kind](fx)
    request = as_liftbridge_starts(model.records, case.request(model.records))
    expected = expect(model.records, request)
    call = fx.api.Subscribe(raw_request(model.stream, request), timeout=DEADLINE_S)
    try:
        if expected.end in (End.INVALID, End.EMPTY):
            with pytest.raises(grpc.RpcError) as raised:
                next(call)  # the error comes instead of the handshake
            if expected.end is End.INVALID:
                assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            else:
                assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "stream is empty" in raised.value.details()
            return
        handshake = next(call)
        assert handshake == pb.Message(), "the first frame is an empty handshake message"
        raw_take(call, model, expected.offsets)
        if expected.end is End.WAITS and kind != "trimmed":
            resolved = plan(model.records, request)
            assert isinstance(resolved, Plan)
            feed(fx, model)
            later = outcome(model.records, resolved)
            assert later.offsets[: len(expected.offsets)] == expected.offsets
            raw_take(call, model, later.offsets[len(expected.offsets) :])
            expected = later
        raw_end(call, expected.end)
    finally:
        call.cancel()


# -- tidelog.Client --------------------------------------------------------------------------------


def _when(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def client_args(request: SubscribeRequest) -> dict[str, Any]:
    start: Any = {
        StartPosition.NEW_ONLY: "new",
        StartPosition.EARLIEST: "earliest",
        StartPosition.LATEST: "latest",
        StartPosition.OFFSET: request.start_offset,
        StartPosition.TIMESTAMP: _when(request.start_timestamp),
    }[request.start]
    stop: Any = {
        StopPosition.ON_CANCEL: None,
        StopPosition.LATEST: "latest",
        StopPosition.OFFSET: request.stop_offset,
        StopPosition.TIMESTAMP: _when(request.stop_timestamp),
    }[request.stop]
    return {"start": start, "stop": stop, "reverse": request.reverse}


def next_within(
    messages: Iterator[ReceivedMessage], timeout: float = DEADLINE_S
) -> ReceivedMessage:
    """``next(messages)`` in a daemon thread, so a server that under-delivers fails the test
    after ``timeout`` instead of hanging it (the stuck generator is then abandoned)."""
    box: list[Any] = []

    def step() -> None:
        try:
            box.append(("value", next(messages)))
        except BaseException as error:  # handed to the test thread as is
            box.append(("error", error))

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    thread.join(timeout)
    if not box:
        pytest.fail(f"no message and no end within {timeout} s")
    kind, value = box[0]
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]


def client_take(messages: Iterator[ReceivedMessage], model: PartitionModel, offsets: Any) -> None:
    for offset in offsets:
        m = next_within(messages)
        key, value, headers = model.content[offset]
        assert (m.offset, m.key, m.value, dict(m.headers)) == (offset, key, value, headers)
        assert (m.timestamp, m.stream, m.partition) == (model.timestamp(offset), model.stream, 0)


def waits_for_later_messages_only(case: Case) -> bool:
    """Forward, endless, and nothing to deliver from what is there at subscribe time."""
    return (
        not case.reverse
        and case.stop is StopPosition.ON_CANCEL
        and (
            case.start is StartPosition.NEW_ONLY
            or case.start_at == AFTER_NEWEST
            or (case.start_at is not None and case.start_at.from_hw and case.start_at.n > 0)
        )
    )


# The client opens its call at the first ``next()``, so a subscription that can only wait for
# later messages cannot be fed after it is known to exist: NEW_ONLY is left to the raw tests (and
# test_client_subscribe_starts_at_first_read), the others are fed first on the partitions that
# may be written.
CLIENT_PARAMS = [
    pytest.param(case, kind, id=f"{case.id}-{kind}")
    for case in CASES
    for kind in BUILDERS
    if not case.exact_timestamps
    and not (case.start is StartPosition.NEW_ONLY and waits_for_later_messages_only(case))
    and not (kind == "trimmed" and waits_for_later_messages_only(case))
]


@pytest.mark.parametrize(("case", "kind"), CLIENT_PARAMS)
def test_client_subscribe(fx: Fixture, case: Case, kind: str) -> None:
    model = BUILDERS[kind](fx)
    request = case.request(model.records)
    expected = expect(model.records, request)
    if expected.end in (End.INVALID, End.EMPTY):
        # Client.subscribe opens the subscription before it returns: errors raise there.
        with pytest.raises(ClientError) as raised:
            fx.client.subscribe(model.stream, 0, **client_args(request))
        if expected.end is End.INVALID:
            assert isinstance(raised.value, InvalidArgument)
        else:
            assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "stream is empty" in str(raised.value)
        return
    messages = fx.client.subscribe(model.stream, 0, **client_args(request))
    if expected.end is End.WAITS and (not expected.offsets or kind != "trimmed"):
        # The subscription was resolved when subscribe() returned; what is fed later arrives
        # under that resolution.
        resolved = plan(model.records, request)
        assert isinstance(resolved, Plan)
        client_take(messages, model, expected.offsets)
        for _ in range(3):
            feed(fx, model)
            later = outcome(model.records, resolved)
            if len(later.offsets) > len(expected.offsets) or later.end is not End.WAITS:
                break
        assert later.offsets[: len(expected.offsets)] == expected.offsets
        expected = Outcome(later.offsets[len(expected.offsets) :], later.end)
        assert expected.offsets or expected.end is not End.WAITS, "nothing the test could see"
    client_take(messages, model, expected.offsets)
    if expected.end is not End.WAITS:
        # A bounded or reverse subscription simply ends (tidelog.v1 ends with OK).
        with pytest.raises(StopIteration):
            next_within(messages)
    messages.close()


def test_client_subscribe_is_open_when_it_returns(fx: Fixture) -> None:
    """``subscribe(start="new")`` then publish: the message published after ``subscribe()``
    returned is "published later" and must be delivered."""
    model = dense(fx)
    with tidelog.Client(fx.server.address) as client:
        messages = client.subscribe(model.stream, start="new")
        publish(fx, model, [1], "after")
        assert next_within(messages, timeout=5).value == model.content[10][1]
        messages.close()


# -- before the first frame, and the read-only end -------------------------------------------------


def test_unknown_stream_or_partition_is_not_found_before_any_frame(fx: Fixture) -> None:
    model = dense(fx)
    for stream, partition in (("no-such-stream", 0), (model.stream, 1), (model.stream, -1)):
        request = pb.SubscribeRequest(stream=stream, partition=partition, startPosition=pb.EARLIEST)
        call = fx.api.Subscribe(request, timeout=DEADLINE_S)
        with pytest.raises(grpc.RpcError) as raised:
            next(call)
        assert raised.value.code() is grpc.StatusCode.NOT_FOUND, (stream, partition)
    with pytest.raises(tidelog.client.NotFound):
        next(fx.client.subscribe("no-such-stream", start="earliest"))


def test_unknown_enum_values_are_invalid(fx: Fixture) -> None:
    model = dense(fx)
    for fields in ({"startPosition": 9}, {"stopPosition": 9}):
        call = fx.api.Subscribe(pb.SubscribeRequest(stream=model.stream, **fields), timeout=5)
        with pytest.raises(grpc.RpcError) as raised:
            next(call)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, fields


def test_paused_partition_needs_resume(fx: Fixture) -> None:
    model = dense(fx)
    fx.api.PauseStream(pb.PauseStreamRequest(name=model.stream))
    request = pb.SubscribeRequest(
        stream=model.stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    with pytest.raises(grpc.RpcError) as raised:
        next(fx.api.Subscribe(request, timeout=DEADLINE_S))
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    request.resume = True
    call = fx.api.Subscribe(request, timeout=DEADLINE_S)
    assert next(call) == pb.Message()
    raw_take(call, model, sorted(model.content))
    raw_end(call, End.STOP)


def test_readonly_partition_ends_after_the_newest_message(fx: Fixture) -> None:
    model = dense(fx)
    fx.api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=model.stream, readonly=True))
    call = fx.api.Subscribe(
        pb.SubscribeRequest(stream=model.stream, startPosition=pb.OFFSET, startOffset=4),
        timeout=DEADLINE_S,
    )
    assert next(call) == pb.Message()
    raw_take(call, model, range(4, 10))
    with pytest.raises(grpc.RpcError) as raised:
        next(call)
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.details() == "end of readonly partition"
    # The client ends the same subscription cleanly (tidelog.v1: END_REASON_READONLY, then OK).
    got = [m.offset for m in fx.client.subscribe(model.stream, start=4)]
    assert got == list(range(4, 10))


def test_a_start_beyond_the_high_watermark_starts_at_the_next_message(fx: Fixture) -> None:
    """``proto.API``: ``OFFSET n`` beyond HW starts at HW + 1, as Liftbridge (``tidelog.v1``
    waits for n: the client's rows of the table check that)."""
    model = dense(fx)
    following = high_watermark(model.records) + 1
    call = fx.api.Subscribe(
        pb.SubscribeRequest(
            stream=model.stream, startPosition=pb.OFFSET, startOffset=following + 5
        ),
        timeout=DEADLINE_S,
    )
    try:
        assert next(call) == pb.Message()
        publish(fx, model, [1, 1, 1, 2], "w")
        refresh(fx, model)
        raw_take(call, model, range(following, following + 5))
    finally:
        call.cancel()


def test_a_group_subscription_needs_a_consumer_id_and_a_known_group(fx: Fixture) -> None:
    model = dense(fx)
    for consumer, code in (
        (pb.Consumer(groupId="g"), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.Consumer(groupId="never-joined", consumerId="c"), grpc.StatusCode.NOT_FOUND),
    ):
        request = pb.SubscribeRequest(
            stream=model.stream, startPosition=pb.EARLIEST, consumer=consumer
        )
        with pytest.raises(grpc.RpcError) as raised:
            next(fx.api.Subscribe(request, timeout=DEADLINE_S))
        assert raised.value.code() is code


V1_ENDS = [
    # reverse, stop position, stop at, the end reason of the last frame
    pytest.param(True, v1.STOP_ON_CANCEL, None, v1.END_REASON_OLDEST, id="rev-oncancel"),
    # STOP_LATEST reverse runs "after the oldest message"
    pytest.param(True, v1.STOP_LATEST, None, v1.END_REASON_OLDEST, id="rev-latest"),
    # every message is at or after the stop time: the stop never cuts, the oldest ends it
    pytest.param(True, v1.STOP_TIMESTAMP, BEFORE_FIRST, v1.END_REASON_OLDEST, id="rev-ts-first"),
    pytest.param(True, v1.STOP_OFFSET, Pos("offset", 3), v1.END_REASON_STOP, id="rev-offset"),
    pytest.param(True, v1.STOP_TIMESTAMP, Pos("mid", 5), v1.END_REASON_STOP, id="rev-ts-mid"),
    pytest.param(False, v1.STOP_LATEST, None, v1.END_REASON_STOP, id="fwd-latest"),
    pytest.param(False, v1.STOP_OFFSET, Pos("offset", 4), v1.END_REASON_STOP, id="fwd-offset"),
]


@pytest.mark.parametrize(("reverse", "stop", "stop_at", "reason"), V1_ENDS)
def test_v1_end_reasons(
    fx: Fixture, reverse: bool, stop: int, stop_at: Pos | None, reason: int
) -> None:
    """tidelog.v1 names how a subscription ended (proto: END_REASON_OLDEST when a reverse
    subscription passed the oldest retained message, END_REASON_STOP for its stop)."""
    model = dense(fx)
    request = v1.SubscribeBatchesRequest(
        stream=model.stream,
        start_position=v1.START_LATEST if reverse else v1.START_EARLIEST,
        stop_position=stop,  # type: ignore[arg-type]
        reverse=reverse,
    )
    if stop_at is not None and stop == v1.STOP_OFFSET:
        request.stop_offset = stop_at.value(model.records)
    elif stop_at is not None:
        request.stop_timestamp = stop_at.value(model.records)
    frames = list(fx.v1.SubscribeBatches(request, timeout=DEADLINE_S))
    assert [f.end for f in frames[:-1]] == [v1.END_REASON_NONE] * (len(frames) - 1)
    assert frames[-1].end == reason
