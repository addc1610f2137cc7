"""Publishing over ``proto.API`` (and the client) against a real server: acks, PublishAsync
correlation, optimistic concurrency, oversized messages, read-only and paused partitions
(docs/api.md, "Publishing" and "Errors")."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import IncorrectOffset, MessageTooLarge, NotFound, PartitionReadonly
from tidelog.client.errors import from_rpc_error

LIMIT = 256 * 1024
"""The server's default max_message_bytes."""

_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("publish")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[pb_grpc.APIStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.APIStub(channel)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[tidelog.Client]:
    with tidelog.Client(server.address) as c:
        yield c


def new_stream(api: pb_grpc.APIStub, *, partitions: int = 1, occ: bool = False) -> str:
    name = f"p{next(_names)}"
    request = pb.CreateStreamRequest(name=name, subject=f"{name}.subj", partitions=partitions)
    if occ:
        request.optimisticConcurrencyControl.value = True
    api.CreateStream(request)
    return name


def stored(client: tidelog.Client, stream: str, partition: int = 0) -> list[bytes]:
    if client.stream_info(stream).partitions[partition].high_watermark < 0:
        return []
    return [m.value for m in client.subscribe(stream, partition, start="earliest", stop="latest")]


def rpc_error(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(*args)  # type: ignore[operator]
    return raised.value


# -- Publish ---------------------------------------------------------------------------------------


def test_publish_acks(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    stream = new_stream(api, partitions=2)
    for i, policy in enumerate((pb.LEADER, pb.ALL, pb.LEADER)):
        response = api.Publish(
            pb.PublishRequest(
                stream=stream,
                partition=1,
                value=b"v%d" % i,
                correlationId=f"id{i}",
                ackInbox="inbox",
                ackPolicy=policy,
            )
        )  # no deadline: acknowledged all the same
        ack = response.ack
        assert response.HasField("ack")
        assert (ack.stream, ack.offset, ack.correlationId, ack.ackPolicy) == (
            stream,
            i,
            f"id{i}",
            policy,
        )
        assert (ack.msgSubject, ack.partitionSubject) == (f"{stream}.subj", f"{stream}.subj.1")
        assert ack.ackInbox == "inbox"
        assert 0 < ack.receptionTimestamp <= ack.commitTimestamp
    none = api.Publish(
        pb.PublishRequest(stream=stream, partition=1, value=b"v3", ackPolicy=pb.NONE)
    )
    assert not none.HasField("ack")
    assert stored(client, stream, 1) == [b"v0", b"v1", b"v2", b"v3"]
    assert stored(client, stream, 0) == []


def test_publish_errors(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api)
    assert rpc_error(api.Publish, pb.PublishRequest(stream="nope", value=b"x")).code() is (
        grpc.StatusCode.NOT_FOUND
    )
    assert rpc_error(api.Publish, pb.PublishRequest(stream=stream, partition=3)).code() is (
        grpc.StatusCode.NOT_FOUND
    )
    assert rpc_error(api.Publish, pb.PublishRequest(value=b"x")).code() is (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_message_too_large_names_both_sizes_and_writes_nothing(
    api: pb_grpc.APIStub, client: tidelog.Client
) -> None:
    stream = new_stream(api)
    api.Publish(pb.PublishRequest(stream=stream, value=b"x" * LIMIT))  # exactly the limit
    error = rpc_error(api.Publish, pb.PublishRequest(stream=stream, value=b"x" * (LIMIT + 1)))
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(LIMIT + 1) in error.details() and str(LIMIT) in error.details()
    # key + value + headers count: 100 + (LIMIT - 100) is fine on its own, not with a header.
    big = pb.PublishRequest(stream=stream, key=b"k" * 100, value=b"v" * (LIMIT - 100))
    api.Publish(big)
    big.headers["h"] = b"!"
    assert rpc_error(api.Publish, big).code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(MessageTooLarge):
        client.publish(stream, b"y" * (LIMIT + 1))
    with pytest.raises(MessageTooLarge):
        client.publish_batch(stream, [b"ok", b"y" * (LIMIT + 1), b"ok"], partition=0)
    assert [len(v) for v in stored(client, stream)] == [LIMIT, LIMIT - 100]


def test_readonly_refuses_and_paused_resumes(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    stream = new_stream(api, partitions=3)
    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream, partitions=[0], readonly=True))
    error = rpc_error(api.Publish, pb.PublishRequest(stream=stream, value=b"x"))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "readonly partition" in error.details()
    with pytest.raises(PartitionReadonly):
        client.publish(stream, b"x", partition=0)
    api.Publish(pb.PublishRequest(stream=stream, partition=1, value=b"fine"))

    def paused() -> list[bool]:
        return [p.paused for p in client.stream_info(stream).partitions]

    api.PauseStream(pb.PauseStreamRequest(name=stream, partitions=[1, 2]))
    assert paused() == [False, True, True]
    api.Publish(pb.PublishRequest(stream=stream, partition=2, value=b"wakes 2"))
    assert paused() == [False, True, False]
    api.PauseStream(pb.PauseStreamRequest(name=stream, partitions=[1, 2], resumeAll=True))
    api.Publish(pb.PublishRequest(stream=stream, partition=1, value=b"wakes all"))
    assert paused() == [False, False, False]
    assert stored(client, stream, 1) == [b"fine", b"wakes all"]


# -- optimistic concurrency ------------------------------------------------------------------------


def test_expected_offset(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    stream = new_stream(api, occ=True)
    for offset in range(3):
        request = pb.PublishRequest(stream=stream, value=b"%d" % offset, expectedOffset=offset)
        ack = api.Publish(request).ack
        assert ack.offset == offset
    for wrong in (0, 2, 4):
        error = rpc_error(
            api.Publish, pb.PublishRequest(stream=stream, value=b"no", expectedOffset=wrong)
        )
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "incorrect expected offset" in error.details()
    assert (
        api.Publish(pb.PublishRequest(stream=stream, value=b"3", expectedOffset=-1)).ack.offset == 3
    )
    responses = list(
        api.PublishAsync(
            iter(
                [
                    pb.PublishRequest(
                        stream=stream, value=b"4", expectedOffset=4, correlationId="a"
                    ),
                    pb.PublishRequest(
                        stream=stream, value=b"no", expectedOffset=4, correlationId="b"
                    ),
                    pb.PublishRequest(
                        stream=stream, value=b"5", expectedOffset=-1, correlationId="c"
                    ),
                ]
            )
        )
    )
    by_id = {r.correlationId: r for r in responses}
    assert by_id["a"].ack.offset == 4
    assert by_id["b"].asyncError.code == pb.PublishAsyncError.INCORRECT_OFFSET
    assert by_id["c"].ack.offset == 5
    assert stored(client, stream) == [b"0", b"1", b"2", b"3", b"4", b"5"]
    # The client's typed error for the same status.
    occ_error = rpc_error(
        api.Publish, pb.PublishRequest(stream=stream, value=b"x", expectedOffset=0)
    )
    assert isinstance(from_rpc_error(occ_error), IncorrectOffset)


def test_expected_offset_is_ignored_without_occ(api: pb_grpc.APIStub) -> None:
    stream = new_stream(api)
    assert (
        api.Publish(pb.PublishRequest(stream=stream, value=b"a", expectedOffset=9)).ack.offset == 0
    )
    assert (
        api.Publish(pb.PublishRequest(stream=stream, value=b"b", expectedOffset=0)).ack.offset == 1
    )


# -- PublishAsync ----------------------------------------------------------------------------------


def test_publish_async_one_response_per_acked_request(
    api: pb_grpc.APIStub, client: tidelog.Client
) -> None:
    stream = new_stream(api, partitions=2)
    policies = [pb.LEADER, pb.NONE, pb.ALL, pb.LEADER, pb.NONE] * 40
    requests = [
        pb.PublishRequest(
            stream=stream,
            partition=i % 2,
            value=b"m%d" % i,
            correlationId=f"id-{i}",
            ackPolicy=policy,
            expectedOffset=-1 if i % 3 else 0,  # 0 is ignored: the stream is not OCC
        )
        for i, policy in enumerate(policies)
    ]
    responses = list(api.PublishAsync(iter(requests)))
    wanted = [r.correlationId for r in requests if r.ackPolicy != pb.NONE]
    assert sorted(r.correlationId for r in responses) == sorted(wanted)
    assert all(r.HasField("ack") and not r.HasField("asyncError") for r in responses)
    # Each ack names where its own request went, and the partition holds them in order.
    by_id = {r.correlationId: r.ack for r in responses}
    for partition in (0, 1):
        values = stored(client, stream, partition)
        assert values == [r.value for r in requests if r.partition == partition]
        for r in requests:
            if r.partition == partition and r.correlationId in by_id:
                ack = by_id[r.correlationId]
                assert values[ack.offset] == r.value
                assert ack.correlationId == r.correlationId


def test_publish_async_errors_keep_the_stream_open(
    api: pb_grpc.APIStub, client: tidelog.Client
) -> None:
    stream = new_stream(api)
    readonly = new_stream(api)
    api.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=readonly, readonly=True))
    requests = [
        pb.PublishRequest(stream="nope", value=b"x", correlationId="unknown"),
        pb.PublishRequest(stream=stream, value=b"a", correlationId="ok1"),
        pb.PublishRequest(stream=readonly, value=b"x", correlationId="readonly"),
        pb.PublishRequest(stream=stream, partition=7, value=b"x", correlationId="partition"),
        pb.PublishRequest(stream=stream, value=b"x" * (LIMIT + 1), correlationId="large"),
        pb.PublishRequest(stream=stream, value=b"b", correlationId="ok2"),
    ]
    responses = {r.correlationId: r for r in api.PublishAsync(iter(requests))}
    assert set(responses) == {r.correlationId for r in requests}
    codes = pb.PublishAsyncError
    assert responses["unknown"].asyncError.code == codes.NOT_FOUND
    assert responses["partition"].asyncError.code == codes.NOT_FOUND
    assert responses["readonly"].asyncError.code == codes.READONLY
    assert "readonly partition" in responses["readonly"].asyncError.message
    assert responses["large"].asyncError.code == codes.BAD_REQUEST
    assert str(LIMIT + 1) in responses["large"].asyncError.message
    assert [responses[c].ack.offset for c in ("ok1", "ok2")] == [0, 1]
    assert stored(client, stream) == [b"a", b"b"]


def test_publish_async_answers_errors_whatever_the_ack_policy(api: pb_grpc.APIStub) -> None:
    """docs/api.md: a success with ``AckPolicy.NONE`` is not answered, a failure always is (as
    Liftbridge answers request errors): a Go client's handler otherwise fires only at its
    deadline. The error response carries an ack with an empty correlation id, as Liftbridge's."""
    stream = new_stream(api)
    requests = [
        pb.PublishRequest(stream="nope", value=b"x", ackPolicy=pb.NONE, correlationId="none"),
        pb.PublishRequest(stream=stream, value=b"y", ackPolicy=pb.NONE, correlationId="quiet"),
        pb.PublishRequest(stream=stream, partition=5, ackPolicy=pb.NONE, correlationId="part"),
        pb.PublishRequest(stream=stream, value=b"z", correlationId="leader"),
    ]
    responses = list(api.PublishAsync(iter(requests)))
    assert [r.correlationId for r in responses] == ["none", "part", "leader"]
    for failed in responses[:2]:
        assert failed.asyncError.code == pb.PublishAsyncError.NOT_FOUND
        assert failed.HasField("ack") and failed.ack.correlationId == ""
    assert responses[2].ack.offset == 1


@pytest.fixture(scope="module")
def always_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose appends wait for fsync: PublishAsync requests pile up meanwhile, so they are
    appended together."""
    data = Path(tmp_path_factory.mktemp("publish-always")) / "data"
    with served(data, "--flush-policy", "always") as process:
        yield process


def test_publish_async_an_oversized_request_fails_alone(always_server: ServerProcess) -> None:
    """Requests that arrive together are appended together, but "nothing of *its* request is
    written": one oversized message must not fail the requests appended with it."""
    with grpc.insecure_channel(always_server.address) as channel:
        api = pb_grpc.APIStub(channel)
        api.CreateStream(pb.CreateStreamRequest(name="s", subject="s"))
        for attempt in range(3):
            requests = [
                pb.PublishRequest(
                    stream="s",
                    value=b"%d-%d" % (attempt, i),
                    correlationId=str(i),
                    expectedOffset=-1,
                )
                for i in range(200)
            ]
            requests[100] = pb.PublishRequest(
                stream="s", value=b"x" * (LIMIT + 1), correlationId="big", expectedOffset=-1
            )
            responses = list(api.PublishAsync(iter(requests)))
            failed = sorted(r.correlationId for r in responses if r.HasField("asyncError"))
            assert failed == ["big"], f"attempt {attempt}: {len(failed)} requests failed"
            assert len(responses) == 200
    with tidelog.Client(always_server.address) as client:
        assert len(stored(client, "s")) == 3 * 199


def test_client_publish(api: pb_grpc.APIStub, client: tidelog.Client) -> None:
    stream = new_stream(api, partitions=3)
    ack = client.publish(stream, b"v", key=b"k", headers={"h": b"1"}, partition=2)
    assert (ack.stream, ack.partition, ack.offset) == (stream, 2, 0)
    # partition=None: the key's CRC-32 picks the partition; no key: partition 0.
    assert client.publish(stream, b"w", key=b"abc").partition == zlib.crc32(b"abc") % 3
    assert client.publish(stream, b"z").partition == 0
    acks = client.publish_batch(stream, [b"%d" % i for i in range(2500)], partition=1)
    assert [a.offset for a in acks] == list(range(2500))
    with pytest.raises(NotFound):
        client.publish("nope", b"x")
    m = next(iter(client.subscribe(stream, 2, start="earliest")))
    assert (m.key, m.value, dict(m.headers)) == (b"k", b"v", {"h": b"1"})
