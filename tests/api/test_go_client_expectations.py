"""What Liftbridge's Go client (go-liftbridge v2) expects of ``proto.API``, item by item of
issue 12, through the generated Liftbridge stubs against a real ``tidelog serve``
(docs/api.md, "Publishing", "Subscribe positions" and "Differences from Liftbridge")."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc

_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("go-client")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[pb_grpc.APIStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.APIStub(channel)


def new_stream(api: pb_grpc.APIStub, **options: object) -> str:
    name = f"go{next(_names)}"
    request = pb.CreateStreamRequest(name=name, subject=f"{name}.subject")
    for field, value in options.items():
        if field in ("partitions", "group", "subject"):
            setattr(request, field, value)
        else:
            getattr(request, field).value = value
    api.CreateStream(request)
    return name


def read(api: pb_grpc.APIStub, request: pb.SubscribeRequest, count: int) -> list[pb.Message]:
    """Up to ``count`` messages of a subscription (after its handshake); its end status, if it
    ends first, stops the read."""
    messages: list[pb.Message] = []
    call = api.Subscribe(request, timeout=10)
    try:
        handshake = next(call)
        assert handshake == pb.Message()
        for message in call:
            messages.append(message)
            if len(messages) == count:
                break
    except grpc.RpcError as error:
        if error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:  # the stop's end signal
            raise
    finally:
        call.cancel()
    return messages


def publish_async(
    api: pb_grpc.APIStub, requests: list[pb.PublishRequest]
) -> list[pb.PublishResponse]:
    return list(api.PublishAsync(iter(requests), timeout=10))


def rpc_error(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request)  # type: ignore[operator]
    return raised.value


# -- 1. the ack's timestamp is the stored message's ------------------------------------------------


def test_ack_reception_timestamp_is_the_stored_timestamp(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api)
    acks = [api.Publish(pb.PublishRequest(stream=stream, value=b"%d" % i)).ack for i in range(4)]
    acks += [
        r.ack
        for r in publish_async(
            api,
            [
                pb.PublishRequest(stream=stream, value=b"%d" % i, correlationId=str(i))
                for i in range(4, 8)
            ],
        )
    ]
    stored = read(
        api,
        pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST),
        8,
    )
    assert [a.offset for a in acks] == list(range(8))
    assert [a.receptionTimestamp for a in acks] == [m.timestamp for m in stored]
    assert all(a.commitTimestamp >= a.receptionTimestamp for a in acks)
    # A time position taken from an ack: just after message 4 starts at message 5 ...
    # (messages of one PublishAsync may share a timestamp when the server appends them together:
    # then the read starts at the first later one, or finds none)
    after_four = read(
        api,
        pb.SubscribeRequest(
            stream=stream,
            startPosition=pb.TIMESTAMP,
            startTimestamp=acks[4].receptionTimestamp + 1,
            stopPosition=pb.STOP_LATEST,
        ),
        1,
    )
    later = [a.offset for a in acks if a.receptionTimestamp > acks[4].receptionTimestamp]
    assert [m.offset for m in after_four] == later[:1]
    # ... and ack 2 to ack 6 (Liftbridge's own stop-position test) is 2..6.
    window = read(
        api,
        pb.SubscribeRequest(
            stream=stream,
            startPosition=pb.TIMESTAMP,
            startTimestamp=acks[2].receptionTimestamp,
            stopPosition=pb.STOP_TIMESTAMP,
            stopTimestamp=acks[6].receptionTimestamp,
        ),
        10,
    )
    low, high = acks[2].receptionTimestamp, acks[6].receptionTimestamp
    inside = [a.offset for a in acks if low <= a.receptionTimestamp <= high]
    assert [m.offset for m in window] == inside
    assert inside[:5] == [2, 3, 4, 5, 6]


# -- 2. a start offset beyond the newest starts at the next message --------------------------------


def test_start_offset_beyond_the_newest_starts_at_the_next_message(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api)
    for i in range(14):
        api.Publish(pb.PublishRequest(stream=stream, value=b"%d" % i))
    call = api.Subscribe(
        pb.SubscribeRequest(stream=stream, startPosition=pb.OFFSET, startOffset=20), timeout=10
    )
    try:
        assert next(call) == pb.Message()
        api.Publish(pb.PublishRequest(stream=stream, value=b"next"))
        message = next(call)
        assert (message.offset, message.value) == (14, b"next")
    finally:
        call.cancel()


def test_a_negative_start_offset_counts_as_zero(api: pb_grpc.APIStub) -> None:
    """gufo-liftbridge resumes a cursor never set (-1) as OFFSET -1; Liftbridge starts at 0."""
    stream = new_stream(api)
    for i in range(3):
        api.Publish(pb.PublishRequest(stream=stream, value=b"%d" % i))
    for reverse in (False, True):
        request = pb.SubscribeRequest(
            stream=stream, startPosition=pb.OFFSET, startOffset=-1, reverse=reverse
        )
        (first,) = read(api, request, 1)
        assert first.offset == 0


# -- 3, 4, 5: errors whatever the ack policy; OCC needs an ack policy; Liftbridge's texts -------


def test_occ_stream_refuses_ack_policy_none_and_writes_nothing(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api, optimisticConcurrencyControl=True)
    unary = rpc_error(
        api.Publish,
        pb.PublishRequest(stream=stream, value=b"x", ackPolicy=pb.NONE, expectedOffset=0),
    )
    assert unary.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert unary.details() == "stream with concurrency control must have AckPolicy set"
    (answer,) = publish_async(
        api,
        [pb.PublishRequest(stream=stream, value=b"y", ackPolicy=pb.NONE, correlationId="n")],
    )
    assert answer.correlationId == "n"
    assert answer.asyncError.code == pb.PublishAsyncError.BAD_REQUEST
    assert answer.asyncError.message == "stream with concurrency control must have AckPolicy set"
    metadata = api.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream))
    assert metadata.metadata.newestOffset == -1  # nothing written
    # An unknown partition is still NOT_FOUND first, as Liftbridge orders its checks.
    missing = rpc_error(
        api.Publish, pb.PublishRequest(stream=stream, partition=3, ackPolicy=pb.NONE)
    )
    assert missing.code() is grpc.StatusCode.NOT_FOUND


def test_incorrect_expected_offset_is_worded_as_liftbridge_words_it(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api, optimisticConcurrencyControl=True)
    api.Publish(pb.PublishRequest(stream=stream, value=b"0", expectedOffset=0))
    unary = rpc_error(api.Publish, pb.PublishRequest(stream=stream, value=b"x", expectedOffset=7))
    assert unary.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert unary.details() == "incorrect expected offset"
    (answer,) = publish_async(
        api, [pb.PublishRequest(stream=stream, value=b"x", expectedOffset=0, correlationId="c")]
    )
    assert answer.asyncError.code == pb.PublishAsyncError.INCORRECT_OFFSET
    assert answer.asyncError.message == "incorrect expected offset"
    assert answer.ack.correlationId == ""


# -- 6. pause and readonly timestamps move on resume and on clearing readonly ---------------------


def test_pause_and_readonly_timestamps_follow_every_change(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api)

    def timestamps() -> tuple[pb.PartitionEventTimestamps, pb.PartitionEventTimestamps]:
        found = api.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream))
        return found.metadata.pauseTimestamps, found.metadata.readonlyTimestamps

    paused, readonly = timestamps()
    assert (paused.firstTimestamp, paused.latestTimestamp) == (0, 0)
    api.PauseStream(pb.PauseStreamRequest(name=stream))
    first_pause = timestamps()[0].firstTimestamp
    assert first_pause > 0 and timestamps()[0].latestTimestamp == first_pause
    time.sleep(0.002)
    api.Publish(pb.PublishRequest(stream=stream, value=b"resumes"))  # resumes the partition
    paused = timestamps()[0]
    assert paused.firstTimestamp == first_pause and paused.latestTimestamp > first_pause

    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream, readonly=True))
    first_readonly = timestamps()[1].firstTimestamp
    assert first_readonly > 0 and timestamps()[1].latestTimestamp == first_readonly
    time.sleep(0.002)
    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream, readonly=False))
    readonly = timestamps()[1]
    assert readonly.firstTimestamp == first_readonly and readonly.latestTimestamp > first_readonly


# -- 7. small segments -----------------------------------------------------------------------------


@pytest.mark.parametrize("segment_bytes", [1, 100, 4095])
def test_small_segment_max_bytes_is_accepted(
    api: pb_grpc.APIStub, server: ServerProcess, segment_bytes: int
) -> None:
    stream = new_stream(api, segmentMaxBytes=segment_bytes)
    for i in range(30):
        api.Publish(pb.PublishRequest(stream=stream, value=b"value-%03d" % i))
    messages = read(
        api,
        pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST),
        30,
    )
    assert [m.value for m in messages] == [b"value-%03d" % i for i in range(30)]
    reverse = read(
        api, pb.SubscribeRequest(stream=stream, startPosition=pb.LATEST, reverse=True), 30
    )
    assert [m.offset for m in reverse] == list(range(29, -1, -1))
    segments = list((server.data_dir / "streams" / stream).rglob("*.log"))
    assert len(segments) > (1 if segment_bytes < 4095 else 0)


# -- 9. PublishToSubject ---------------------------------------------------------------------------


def stored_values(api: pb_grpc.APIStub, stream: str, partition: int = 0) -> list[bytes]:
    found = api.FetchPartitionMetadata(
        pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    )
    count = found.metadata.newestOffset + 1
    if count == 0:
        return []
    request = pb.SubscribeRequest(
        stream=stream, partition=partition, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    return [m.value for m in read(api, request, count)]


def test_publish_to_subject_appends_to_every_stream_on_it(api: pb_grpc.APIStub) -> None:
    subject = f"orders{next(_names)}"
    first = new_stream(api, subject=subject)
    second = new_stream(api, subject=subject, partitions=3)
    other = new_stream(api)  # another subject: untouched
    response = api.PublishToSubject(
        pb.PublishToSubjectRequest(
            subject=subject, value=b"v", key=b"k", headers={"h": b"1"}, correlationId="c1"
        )
    )
    assert response.ack.stream == min(first, second)  # the first in stream-name order
    assert (response.ack.offset, response.ack.correlationId) == (0, "c1")
    assert response.ack.msgSubject == subject
    assert response.ack.receptionTimestamp > 0
    assert stored_values(api, first) == [b"v"] and stored_values(api, second) == [b"v"]
    assert stored_values(api, other) == []
    # Partition n > 0 listens on "<subject>.<n>".
    api.PublishToSubject(pb.PublishToSubjectRequest(subject=f"{subject}.2", value=b"p2"))
    assert stored_values(api, second, 2) == [b"p2"]
    assert stored_values(api, second, 1) == [] and stored_values(api, first) == [b"v"]
    # The stored message has the key and headers given.
    (message,) = read(
        api,
        pb.SubscribeRequest(stream=first, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST),
        1,
    )
    assert (message.key, dict(message.headers)) == (b"k", {"h": b"1"})


def test_publish_to_subject_load_balance_group_takes_turns(api: pb_grpc.APIStub) -> None:
    subject = f"jobs{next(_names)}"
    workers = [new_stream(api, subject=subject, group="workers") for _ in range(3)]
    audit = new_stream(api, subject=subject)  # not in the group: gets every message
    for i in range(6):
        api.PublishToSubject(pb.PublishToSubjectRequest(subject=subject, value=b"%d" % i))
    counts = [len(stored_values(api, w)) for w in workers]
    assert counts == [2, 2, 2]
    assert sorted(v for w in workers for v in stored_values(api, w)) == [
        b"%d" % i for i in range(6)
    ]
    assert stored_values(api, audit) == [b"%d" % i for i in range(6)]


def test_publish_to_subject_nobody_listens_on(api: pb_grpc.APIStub) -> None:
    error = rpc_error(api.PublishToSubject, pb.PublishToSubjectRequest(subject="nobody.here"))
    assert error.code() is grpc.StatusCode.NOT_FOUND
    assert "nothing was stored" in error.details()
    none = rpc_error(
        api.PublishToSubject, pb.PublishToSubjectRequest(subject="nobody", ackPolicy=pb.NONE)
    )
    assert none.code() is grpc.StatusCode.NOT_FOUND


# -- 10. a graceful stop does not wait for an idle publish stream --------------------------------


def test_sigterm_ends_open_publish_streams_at_once(tmp_path: Path) -> None:
    """A connected Go client keeps its PublishAsync stream open; the stop must not wait the
    grace period (5 s by default) for it to close."""
    with served(tmp_path / "data") as process, grpc.insecure_channel(process.address) as channel:
        api = pb_grpc.APIStub(channel)
        stream = new_stream(api)
        outbox: list[pb.PublishRequest | None] = [
            pb.PublishRequest(stream=stream, value=b"acked", correlationId="1")
        ]

        def requests() -> Iterator[pb.PublishRequest]:
            while True:  # an idle client: one request, then silence until the call ends
                if outbox:
                    request = outbox.pop()
                    if request is None:
                        return
                    yield request
                time.sleep(0.01)

        call = api.PublishAsync(requests(), timeout=30)
        assert next(call).ack.offset == 0
        started = time.monotonic()
        assert process.stop() == 0
        stopped_s = time.monotonic() - started
        with pytest.raises(grpc.RpcError) as ended:
            next(call)
        outbox.append(None)
        assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
        assert stopped_s < 3.0, f"the stop took {stopped_s:.2f} s: it waited for the stream"
