"""A server under a low descriptor limit starts on a data directory holding many more segment
files than the limit, serves every record of it both ways, takes new publishes, and restarts
again: the number of streams and segments is bounded by the disk, not by ``ulimit -n``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest
from tests.broker.brokertools import broker_config, running
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.broker import StreamConfig

LIMIT = 256
STREAMS = 40
PARTITIONS = 2
SEGMENTS = 8
PER_SEGMENT = 4
VALUE = b"v" * 900


def _write_data_dir(data_dir: Path) -> None:
    """Streams whose partitions each hold SEGMENTS sealed segments (a broker in this process,
    writing through the logs: quicker than over gRPC, and the same files)."""

    async def fill() -> None:
        async with running(broker_config(data_dir)) as broker:
            config = StreamConfig(partitions=PARTITIONS, segment_max_bytes=4096)
            for s in range(STREAMS):
                broker.create_stream(f"s{s}", config)
                for p in range(PARTITIONS):
                    log = broker.partition(f"s{s}", p).log
                    for _ in range(SEGMENTS):
                        log.append([VALUE] * PER_SEGMENT)
                    assert log.segment_count >= SEGMENTS

    asyncio.run(fill())


def _read(api: pb_grpc.APIStub, stream: str, partition: int, *, reverse: bool) -> list[int]:
    request = pb.SubscribeRequest(
        stream=stream,
        partition=partition,
        startPosition=pb.LATEST if reverse else pb.EARLIEST,
        stopPosition=pb.STOP_LATEST,
        reverse=reverse,
    )
    offsets: list[int] = []
    try:
        for i, message in enumerate(api.Subscribe(request, timeout=30)):
            if i:  # the first message is the handshake
                offsets.append(message.offset)
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error  # the stop signal
    return offsets


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
def test_a_server_starts_and_serves_far_more_segments_than_its_descriptor_limit(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    _write_data_dir(data_dir)
    files = sum(len(files) for _, _, files in os.walk(data_dir / "streams"))
    assert files > 4 * LIMIT, files
    server = ServerProcess(data_dir, max_open_files=LIMIT)
    try:
        server.start()
        count = SEGMENTS * PER_SEGMENT
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            for s in range(STREAMS):
                for p in range(PARTITIONS):
                    assert _read(api, f"s{s}", p, reverse=False) == list(range(count))
                    assert _read(api, f"s{s}", p, reverse=True) == list(range(count))[::-1]
                    ack = api.Publish(
                        pb.PublishRequest(stream=f"s{s}", partition=p, value=b"new"), timeout=30
                    ).ack
                    assert ack.offset == count
                assert _descriptors(server.pid) < LIMIT
        assert server.stop() == 0, "".join(server.stderr_lines[-20:])
        server.start()
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            assert _read(api, "s0", 0, reverse=False) == list(range(count + 1))
            assert _read(api, f"s{STREAMS - 1}", 1, reverse=True)[0] == count
    finally:
        server.kill()
    assert not any("Too many open files" in line for line in server.stderr_lines)


@pytest.mark.parametrize("low", [True, False])
def test_the_open_file_cache_fits_the_descriptor_limit(low: bool) -> None:
    """Capacity is the setting, or half of ``ulimit -n`` when the setting does not fit."""
    import resource

    from tidelog.broker.broker import open_files_capacity

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 64 if low else hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        expected = 900 if limit == resource.RLIM_INFINITY or limit // 2 >= 900 else limit // 2
        assert open_files_capacity(900) == expected
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
