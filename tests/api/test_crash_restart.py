"""Restarts of a real server on the same data directory.

A crash (SIGKILL, no shutdown work) must lose nothing that was acknowledged: every acked message
comes back identical (offset, key, value, headers, timestamp), offsets continue densely, streams
and cursors are still there. A graceful stop (SIGTERM) exits 0, ends live subscriptions with
UNAVAILABLE and leaves every log closed cleanly, so the next open has nothing to recover.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess

import tidelog
from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import ClientError, Message, ReceivedMessage
from tidelog.log import FlushPolicy, LogConfig, SegmentedLog

Key = tuple[int, int]
"""(partition, offset)"""


@dataclass(frozen=True)
class Stored:
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Every ServerProcess a test starts goes here and is killed (by PID) at the end."""
    started: list[ServerProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()


def start(servers: list[ServerProcess], data_dir: Path) -> ServerProcess:
    process = ServerProcess(data_dir)
    servers.append(process)
    return process.start()


def publish_everything_ways(address: str, acked: dict[Key, Stored]) -> None:
    """Publish through Publish (with keys, headers, every ack policy that acks), PublishAsync and
    the client; record what each acknowledgement says was stored where."""
    with grpc.insecure_channel(address) as channel:
        api = pb_grpc.APIStub(channel)
        for i in range(30):
            headers = {"i": str(i).encode(), "empty": b""} if i % 2 else {}
            key = f"key-{i}".encode() if i % 3 else b""
            request = pb.PublishRequest(
                stream="c",
                partition=i % 2,
                key=key,
                value=f"publish-{i}".encode() * (i + 1),
                headers=headers,
                ackPolicy=pb.ALL if i % 5 == 0 else pb.LEADER,
            )
            ack = api.Publish(request).ack
            acked[(i % 2, ack.offset)] = Stored(key or None, request.value, headers)
        requests = [
            pb.PublishRequest(
                stream="c",
                partition=0,
                value=f"async-{i}".encode(),
                headers={"h": b"\x00\xff"},
                correlationId=f"c{i}",
                expectedOffset=-1,
            )
            for i in range(50)
        ]
        by_id = {r.correlationId: r for r in requests}
        for response in api.PublishAsync(iter(requests)):
            assert response.HasField("ack"), response
            sent = by_id[response.correlationId]
            acked[(0, response.ack.offset)] = Stored(None, sent.value, dict(sent.headers))
    with tidelog.Client(address) as client:
        messages = [Message(b"batch-%d" % i, key=b"k%d" % i) for i in range(500)]
        for ack, m in zip(client.publish_batch("c", messages, partition=1), messages, strict=True):
            acked[(1, ack.offset)] = Stored(m.key, m.value, {})


def read_partition(address: str, partition: int) -> list[ReceivedMessage]:
    with tidelog.Client(address) as client:
        if client.stream_info("c").partitions[partition].high_watermark < 0:
            return []
        return list(client.subscribe("c", partition, start="earliest", stop="latest"))


def check_against(acked: dict[Key, Stored], got: dict[Key, Stored]) -> None:
    missing = sorted(set(acked) - set(got))
    assert not missing, f"acknowledged messages lost: {missing[:10]}"
    for where, stored in acked.items():
        assert got[where] == stored, where


def snapshot(address: str) -> tuple[dict[Key, Stored], dict[Key, int]]:
    contents: dict[Key, Stored] = {}
    timestamps: dict[Key, int] = {}
    for partition in (0, 1):
        messages = read_partition(address, partition)
        assert [m.offset for m in messages] == list(range(len(messages))), "dense from 0"
        for m in messages:
            contents[(partition, m.offset)] = Stored(m.key, m.value, dict(m.headers))
            timestamps[(partition, m.offset)] = m.timestamp
    return contents, timestamps


def test_sigkill_loses_nothing_acknowledged(tmp_path: Path, servers: list[ServerProcess]) -> None:
    data = tmp_path / "data"
    first = start(servers, data)
    with tidelog.Client(first.address) as client:
        client.create_stream("c", partitions=2, subject="crash.subject")
    acked: dict[Key, Stored] = {}
    publish_everything_ways(first.address, acked)
    contents, timestamps = snapshot(first.address)
    check_against(acked, contents)
    with tidelog.Client(first.address) as client:
        client.set_cursor("reader", "c", 1, 123)

    # A publisher still going when the process dies: what it sent, in order, and what was acked.
    sent: list[bytes] = []
    acked_live: list[int] = []
    enough = threading.Event()

    def keep_publishing() -> None:
        with tidelog.Client(first.address) as client:
            for n in range(100_000):  # bounded; ends at the crash
                value = b"live-%d" % n
                sent.append(value)
                try:
                    acked_live.append(client.publish("live", value).offset)
                except ClientError:
                    return
                if n == 300:
                    enough.set()
        enough.set()

    with tidelog.Client(first.address) as client:
        client.create_stream("live")
    thread = threading.Thread(target=keep_publishing, daemon=True)
    thread.start()
    assert enough.wait(30)
    first.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert first.process is not None and first.process.returncode == -9

    second = start(servers, data)
    after, after_timestamps = snapshot(second.address)
    assert after == contents, "every message is back, identical"
    assert after_timestamps == timestamps, "with the same timestamps"
    with tidelog.Client(second.address) as client:
        info = client.stream_info("c")
        assert (info.subject, len(info.partitions)) == ("crash.subject", 2)
        assert client.fetch_cursor("reader", "c", 1) == 123
        live = list(client.subscribe("live", start="earliest", stop="latest"))
        # A prefix of what was sent, in order, holding at least everything acknowledged.
        assert [m.offset for m in live] == list(range(len(live)))
        assert [m.value for m in live] == sent[: len(live)]
        assert len(live) >= len(acked_live) > 300
        assert acked_live == list(range(len(acked_live)))
        # Offsets continue densely after the crash.
        for partition in (0, 1):
            newest = max(o for p, o in after if p == partition)
            assert client.publish("c", b"after", partition=partition).offset == newest + 1
        assert client.publish("live", b"after").offset == len(live)


def test_sigterm_exits_cleanly_and_recovery_has_nothing_to_do(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    data = tmp_path / "data"
    first = start(servers, data)
    with tidelog.Client(first.address) as client:
        client.create_stream("c", partitions=2)
    acked: dict[Key, Stored] = {}
    publish_everything_ways(first.address, acked)
    contents, timestamps = snapshot(first.address)
    check_against(acked, contents)

    # A live subscription is told the server is going away.
    channel = grpc.insecure_channel(first.address)
    call = pb_grpc.APIStub(channel).Subscribe(
        pb.SubscribeRequest(stream="c", startPosition=pb.NEW_ONLY), timeout=30
    )
    assert next(call) == pb.Message()
    assert first.stop() == 0
    with pytest.raises(grpc.RpcError) as raised:
        next(call)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    channel.close()
    assert any("every log synced and closed" in line for line in first.stderr_lines)

    # Every partition log (and the cursors') was closed cleanly: opening it recovers nothing.
    partition_dirs = sorted(p for p in (data / "streams").glob("*/*") if p.is_dir())
    assert len(partition_dirs) == 3  # c/0, c/1, __cursors/0
    for directory in partition_dirs:
        log = SegmentedLog(directory, LogConfig(flush_policy=FlushPolicy.NEVER))
        try:
            report = log.recovery_report
            assert report.clean and report.scanned_records == 0, (directory, report)
        finally:
            log.close()

    second = start(servers, data)
    after, after_timestamps = snapshot(second.address)
    assert (after, after_timestamps) == (contents, timestamps)
    assert not [line for line in second.stderr_lines if "WARNING" in line]
    with tidelog.Client(second.address) as client:
        assert client.publish("c", b"after", partition=1).offset == 1 + max(
            o for p, o in after if p == 1
        )
    assert second.stop() == 0
