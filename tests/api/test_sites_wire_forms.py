"""Both forms of a ``DeltaBatch`` on a real sink: one message per entry (what a sender from
before the packed fields sends) and the packed columns (what a sender sends to a sink that says
``packed_deltas``), applied alike, each payload with its ``__position``; and both forms of a
``TransmitRequest`` on a real source, stored alike (docs/replication.md)."""

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
from tidelog.sites.envelope import decode, split_position
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


# -- TransmitRequest: one message per entry, or packed ----------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("source")) / "data", "--site-id", "a") as process:
        with tidelog.Client(process.address) as client:
            for site, port in (("x1", 9321), ("x2", 9322)):  # nothing listens: never delivered
                client.add_site(site, f"127.0.0.1:{port}")
        yield process


def transmit(address: str, request: v1.TransmitRequest) -> v1.TransmitResponse:
    with grpc.insecure_channel(address) as channel:
        response: v1.TransmitResponse = v1_grpc.TidelogStub(channel).Transmit(request, timeout=30)
        return response


def packed_request(items: list[tuple[bytes, list[str]]], **changes: object) -> v1.TransmitRequest:
    lists: dict[tuple[str, ...], int] = {}
    indexes = [lists.setdefault(tuple(d), len(lists)) for _, d in items]
    fields: dict[str, object] = {
        "client_name": "orders",
        "payloads": b"".join(p for p, _ in items),
        "payload_sizes": b"".join(struct.pack("<I", len(p)) for p, _ in items),
        "destination_lists": [v1.DestinationList(sites=d) for d in lists],
        "destination_indexes": b"".join(struct.pack("<I", i) for i in indexes),
    }
    fields.update(changes)
    return v1.TransmitRequest(**fields)  # type: ignore[arg-type]


def stored(address: str) -> list[tuple[int, bytes]]:
    """(destination mask, payload) of every entry in the source's delta queue."""
    with tidelog.Client(address) as client:
        if client.stream_info("__lrq_delta").partitions[0].newest_offset < 0:
            return []
        values = [m.value for m in client.subscribe("__lrq_delta", start="earliest", stop="latest")]
    return [(e.destinations, e.payload) for v in values for e in decode(v).entries]


ITEMS = [(b"one", ["x1"]), (b"", ["x2", "x1"]), (b"three", ["x1", "x2"]), (b"four", ["x2"])]


def test_both_transmit_forms_store_the_same_entries(source: ServerProcess) -> None:
    before = len(stored(source.address))
    messages = v1.TransmitRequest(
        client_name="orders",
        entries=[v1.TransmitEntry(payload=p, destinations=d) for p, d in ITEMS],
    )
    first = transmit(source.address, messages)
    second = transmit(source.address, packed_request(ITEMS))
    assert first.packed_transmit and second.packed_transmit  # this server reads packed calls
    assert [split_position(p)[1] for p in second.positions] == [0, 1, 2, 3]
    entries = stored(source.address)[before:]
    assert entries[:4] == entries[4:]
    assert [p for _, p in entries[:4]] == [p for p, _ in ITEMS]
    assert entries[1][0] == entries[2][0]  # one mask for two spellings of one set of sites


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"payload_sizes": b"\x03\x00\x00"}, "multiples of 4"),
        ({"payloads": b"one"}, "add up to"),
        ({"destination_indexes": struct.pack("<4I", 0, 1, 1, 9)}, "points past"),
        ({"destination_indexes": struct.pack("<3I", 0, 1, 1)}, "4 payloads but 3"),
        (
            {"destination_lists": [v1.DestinationList(sites=["x1"])] * 3 + [v1.DestinationList()]},
            "at least one destination",
        ),
        ({"entries": [v1.TransmitEntry(payload=b"p", destinations=["x1"])]}, "not both"),
        ({"client_name": "no.dots"}, "invalid client name"),
    ],
)
def test_packed_transmits_that_do_not_fit_store_nothing(
    source: ServerProcess, changes: dict[str, object], match: str
) -> None:
    before = len(stored(source.address))
    with pytest.raises(grpc.RpcError) as raised:
        transmit(source.address, packed_request(ITEMS, **changes))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert match in raised.value.details()
    assert len(stored(source.address)) == before
