"""Reads without values (``subscribe_batches(values=False)``, ``without_values`` on the wire).

Against a real server: such a read delivers the same offsets, timestamps, keys, headers and value
sizes as a full read, and no value bytes (the frames' ``values`` and ``value_positions`` are
empty); what needs the values raises ``ValuesOmitted`` instead of guessing them. The server still
verifies every record it reads: a value damaged on disk stops the read without values at the same
record, with the same error, as a full read. A publish that carries ``values_omitted`` is refused.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import Client, Message, ReceivedBatch
from tidelog.client.errors import ClientError
from tidelog.errors import ValuesOmitted

RECORDS = 300


def value_of(i: int) -> bytes:
    return f"value-{i:05d}-".encode() + bytes([i % 251]) * (i % 40)


def publish(client: Client, stream: str) -> None:
    client.create_stream(stream)
    messages = [
        Message(
            value_of(i),
            key=None if i % 3 == 0 else f"k{i}".encode(),
            headers={"h": str(i).encode()} if i % 5 == 0 else {},
        )
        for i in range(RECORDS)
    ]
    for first in range(0, RECORDS, 100):
        client.publish_batch(stream, messages[first : first + 100])


def read_all(client: Client, stream: str, *, values: bool) -> list[ReceivedBatch]:
    return list(
        client.subscribe_batches(
            stream, start="earliest", stop=RECORDS - 1, max_messages=64, values=values
        )
    )


def test_a_read_without_values_has_every_other_column_and_no_value_bytes(
    server: ServerProcess, stream: str
) -> None:
    with Client(server.address) as client:
        publish(client, stream)
        full = read_all(client, stream, values=True)
        bare = read_all(client, stream, values=False)
    assert [len(b) for b in bare] == [len(b) for b in full]
    for got, want in zip(bare, full, strict=True):
        assert got.values_omitted and not want.values_omitted
        assert got.frame.messages.values == b"" and got.frame.messages.value_positions == b""
        assert got.offsets.tolist() == want.offsets.tolist()
        assert got.timestamps.tolist() == want.timestamps.tolist()
        assert got.value_sizes.tolist() == [len(v) for v in want.values.to_list()]
        assert want.keys is not None and got.keys is not None
        assert got.keys.to_list() == want.keys.to_list()
        assert got.headers == want.headers
        narrowed = got.to_arrow(("partition", "offset", "key"))
        assert narrowed.column("offset").to_pylist() == want.offsets.tolist()
        assert narrowed.column("key").to_pylist() == want.keys.to_list()
        with pytest.raises(ValuesOmitted):
            _ = got.values
        with pytest.raises(ValuesOmitted):
            got.messages()
        with pytest.raises(ValuesOmitted):
            got.to_arrow(("value",))
    assert sum(len(b.frame.SerializeToString()) for b in bare) < (
        sum(len(b.frame.SerializeToString()) for b in full)
        - sum(len(value_of(i)) for i in range(RECORDS))
    ) + 10 * len(full)


def test_a_publish_that_says_its_values_were_omitted_is_refused(
    server: ServerProcess, stream: str
) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
    with grpc.insecure_channel(server.address) as channel:
        stub = v1_grpc.TidelogStub(channel)
        messages = v1.Messages(values=b"ab", value_sizes=b"\x02\x00\x00\x00", values_omitted=True)
        with pytest.raises(grpc.RpcError) as refused:
            stub.PublishBatch(v1.PublishBatchRequest(stream=stream, messages=messages))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "values_omitted" in (refused.value.details() or "")


def damage_value(data_dir: Path, value: bytes) -> None:
    """Flip one byte inside ``value`` where it is stored (exactly one log file holds it)."""
    hits = [p for p in data_dir.rglob("*.log") if value in p.read_bytes()]
    assert len(hits) == 1, hits
    blob = bytearray(hits[0].read_bytes())
    at = blob.index(value) + len(value) // 2
    blob[at] ^= 0x01
    hits[0].write_bytes(bytes(blob))


def delivered_until_failure(client: Client, stream: str, *, values: bool) -> tuple[list[int], str]:
    offsets: list[int] = []
    try:
        for batch in read_all(client, stream, values=values):
            offsets.extend(batch.offsets.tolist())
    except ClientError as error:
        return offsets, type(error).__name__
    return offsets, "no error"


def test_a_damaged_value_stops_a_read_without_values_as_it_stops_a_full_read(
    tmp_path: Path,
) -> None:
    """The damage is made under the running server (a restart would cut the log at it, which
    ``tests/log`` covers): the reads must find it by the CRC check of every record they read."""
    data_dir = tmp_path / "data"
    with served(data_dir) as process, Client(process.address) as client:
        publish(client, "damaged")
        damage_value(data_dir, value_of(150))
        full, full_error = delivered_until_failure(client, "damaged", values=True)
        bare, bare_error = delivered_until_failure(client, "damaged", values=False)
    assert full_error == "DataLoss"
    assert (bare, bare_error) == (full, full_error)
    assert 150 not in bare and len(bare) < 150


def test_frames_without_values_hold_more_records(server: ServerProcess, stream: str) -> None:
    """A read without values may read 4x the subscriber byte budget (256 KiB) per frame, as it
    sends a fraction of the bytes it reads; a full read stays within the budget."""
    with Client(server.address) as client:
        client.create_stream(stream)
        for _ in range(3):
            client.publish_batch(stream, [bytes(1000)] * 1000)
        sizes = {}
        for values in (True, False):
            frames = client.subscribe_batches(
                stream, start="earliest", stop=2999, max_messages=5000, values=values
            )
            sizes[values] = [len(b) for b in frames]
    assert sum(sizes[True]) == sum(sizes[False]) == 3000
    assert max(sizes[True]) <= 256 * 1024 // 1000
    assert 256 * 1024 // 1000 < max(sizes[False]) <= 4 * 256 * 1024 // 1000


def raw_frames(address: str, stream: str, **flags: bool) -> list[v1.RecordBatch]:
    """The frames of a whole read as protobuf has them (the raw stub: the client asks for
    neither flag)."""
    with grpc.insecure_channel(address) as channel:
        stub = v1_grpc.TidelogStub(channel)
        request = v1.SubscribeBatchesRequest(
            stream=stream,
            start_position=v1.START_EARLIEST,
            stop_position=v1.STOP_OFFSET,
            stop_offset=RECORDS - 1,
            max_messages=64,
            **flags,
        )
        return [f for f in stub.SubscribeBatches(request) if len(f.offsets)]


@pytest.mark.parametrize("values", [True, False])
def test_frames_without_timestamps_or_value_sizes_leave_only_those_out(
    server: ServerProcess, stream: str, values: bool
) -> None:
    """``without_timestamps`` (with or without values) and ``without_value_sizes`` (with
    ``without_values``): those columns are empty and flagged, every other one as in a full
    read."""
    with Client(server.address) as client:
        publish(client, stream)
    full = raw_frames(server.address, stream, without_values=not values)
    flags = {"without_values": not values, "without_timestamps": True}
    if not values:
        flags["without_value_sizes"] = True
    bare = raw_frames(server.address, stream, **flags)
    assert [f.offsets for f in bare] == [f.offsets for f in full]
    assert [f.messages.keys for f in bare] == [f.messages.keys for f in full]
    assert [f.messages.headers for f in bare] == [f.messages.headers for f in full]
    for frame in bare:
        assert frame.timestamps_omitted and frame.timestamps == b""
        assert frame.messages.value_sizes_omitted is (not values)
        assert (frame.messages.value_sizes == b"") is (not values)
    assert not any(f.timestamps_omitted or f.messages.value_sizes_omitted for f in full)
    if values:
        assert [f.messages.values for f in bare] == [f.messages.values for f in full]


def test_without_value_sizes_needs_without_values(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        publish(client, stream)
    with pytest.raises(grpc.RpcError) as refused:
        raw_frames(server.address, stream, without_value_sizes=True)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "without_value_sizes needs without_values" in (refused.value.details() or "")
