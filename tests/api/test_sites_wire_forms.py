"""Both forms of a ``DeltaBatch`` on a real sink: one message per entry (what a sender from
before the packed fields sends) and the packed columns (what a sender sends to a sink that says
``packed_deltas``), applied alike, each payload with its ``__position`` (docs/replication.md)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.sites.routed import RoutedColumns, RoutedEntry, to_wire
from tidelog.wire import POSITION_HEADER, RECEIVE_QUEUE_PREFIX


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("sink")) / "data", "--site-id", "b") as process:
        yield process


def replicate(address: str, *batches: v1.DeltaBatch) -> list[v1.ReplicationReply]:
    hello = v1.ReplicationHello(source_site="x", sink_site="b")
    requests = [v1.ReplicationRequest(hello=hello)]
    requests += [v1.ReplicationRequest(deltas=b) for b in batches]
    with grpc.insecure_channel(address) as channel:
        return list(v1_grpc.TidelogStub(channel).Replicate(iter(requests), timeout=30))


def columns(*entries: tuple[int, str, bytes]) -> RoutedColumns:
    return RoutedColumns.from_entries([RoutedEntry(*e) for e in entries])


def test_old_and_packed_batches_apply_alike(sink: ServerProcess) -> None:
    old = to_wire(-1, 5, columns((3, "app", b"o3"), (5, "app", b"o5")), packed=False)
    packed = to_wire(
        5, 12, columns((7, "app", b"p7"), (9, "kv", b"p9"), (12, "app", b"")), packed=True
    )
    resent = to_wire(-1, 5, columns((3, "app", b"o3"), (5, "app", b"o5")), packed=True)
    replies = replicate(sink.address, old, packed, resent)
    assert replies[0].progress.packed_deltas  # this sink reads the packed fields
    assert [r.acked for r in replies[1:]] == [5, 12, 12]  # the resend is a duplicate
    with tidelog.Client(sink.address) as client:
        found = {}
        for name in ("app", "kv"):
            queue = f"{RECEIVE_QUEUE_PREFIX}{name}.x"
            count = client.stream_info(queue).partitions[0].newest_offset + 1
            messages = client.subscribe(queue, start="earliest", stop="latest")
            found[name] = [
                (struct.unpack(">q", m.headers[POSITION_HEADER])[0], m.value) for m in messages
            ]
            assert len(found[name]) == count
    assert found == {"app": [(3, b"o3"), (5, b"o5"), (7, b"p7"), (12, b"")], "kv": [(9, b"p9")]}


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (
            v1.DeltaBatch(prev=20, current=30, positions=b"\0" * 7),
            "whole number",
        ),
        (
            to_wire(20, 30, columns((30, "app", b"a"), (25, "app", b"b")), packed=True),
            "in order",
        ),
        (
            to_wire(20, 30, columns((25, "no.dots", b"a"), (30, "app", b"b")), packed=True),
            "invalid",
        ),
    ],
)
def test_packed_batches_that_do_not_fit_are_refused(
    sink: ServerProcess, batch: v1.DeltaBatch, match: str
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        replicate(sink.address, batch)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert match in raised.value.details()
