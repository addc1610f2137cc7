"""A full disk, end to end: a real server whose data directory is a 4 MiB tmpfs. Writes are
refused with RESOURCE_EXHAUSTED naming the disk space and where, reads keep working, and once
space is freed publishing works again (docs/operations.md, "Full disk, descriptor limit")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess
from tests.support.tmpfs import fill_disk, small_tmpfs

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.wire import columns


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test and always unmounted."""
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        yield disk


def read_all(api: pb_grpc.APIStub, stream: str) -> list[bytes]:
    values: list[bytes] = []
    request = pb.SubscribeRequest(
        stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    with pytest.raises(grpc.RpcError) as ended:  # Liftbridge ends at the stop with this
        for message in api.Subscribe(request, timeout=20):
            if message.value:
                values.append(message.value)
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value.details()
    return values


def refused(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, timeout=20)  # type: ignore[operator]
    return raised.value


def assert_disk_full(error: grpc.RpcError) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())
    assert "disk space" in error.details(), error.details()


def test_a_full_disk_refuses_writes_and_keeps_serving_reads(small_disk: Path) -> None:
    server = ServerProcess(small_disk / "data").start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            tidelog = v1_grpc.TidelogStub(channel)
            api.CreateStream(pb.CreateStreamRequest(name="s", subject="s"))
            stored = [b"before-%d" % i for i in range(10)]
            for value in stored:
                api.Publish(pb.PublishRequest(stream="s", value=value, ackPolicy=pb.ALL))

            filler = fill_disk(small_disk)
            big = b"x" * 8192
            assert_disk_full(refused(api.Publish, pb.PublishRequest(stream="s", value=big)))
            assert_disk_full(
                refused(api.Publish, pb.PublishRequest(stream="s", value=big, ackPolicy=pb.ALL))
            )
            batch = v1.PublishBatchRequest(stream="s", messages=columns.pack([big] * 4))
            assert_disk_full(refused(tidelog.PublishBatch, batch))
            (response,) = api.PublishAsync(
                iter([pb.PublishRequest(stream="s", value=big, correlationId="a")]), timeout=20
            )
            assert "disk space" in response.asyncError.message, response
            assert_disk_full(
                refused(api.CreateStream, pb.CreateStreamRequest(name="t", subject="t"))
            )
            assert not (small_disk / "data" / "streams" / "t").exists()  # a failed create
            # Reads go on: everything acknowledged is there, nothing of the refused publishes.
            assert read_all(api, "s") == stored
            assert api.FetchMetadata(pb.FetchMetadataRequest()).streamMetadata

            filler.unlink()
            ack = api.Publish(pb.PublishRequest(stream="s", value=b"after", ackPolicy=pb.ALL))
            assert ack.ack.offset == len(stored)  # the refused publishes took no offset
            assert read_all(api, "s") == [*stored, b"after"]
            api.CreateStream(pb.CreateStreamRequest(name="t", subject="t"))
    finally:
        server.stop()
    log = "".join(server.stderr_lines)
    assert "Traceback" not in log, log
    warnings = [line for line in server.stderr_lines if "disk space" in line]
    assert warnings and all(" WARNING " in line for line in warnings), log
