"""The Kafka listener against bad input, from outside: a real ``tidelog serve --kafka-port`` and
raw frames. Every refusal is an answer the client understands or a closed connection, and the
listener keeps serving everyone else."""

from __future__ import annotations

import random
import socket
import struct
from datetime import timedelta

import numpy as np
import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from tests.kafka.kadmin_support import produce_request
from tests.kafka.kafka_wire import (
    call,
    connect,
    decode,
    fetch_request,
    frame,
    list_offsets_request,
    metadata_request,
    receive,
)
from tests.support.server import ServerProcess

from tidelog.kafka.compression import Codec
from tidelog.kafka.records import build_batch


def _versions(port: int) -> dict[int, tuple[int, int]]:
    with connect(port) as sock:
        body = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        answer = call(sock, body)
    assert answer.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}


def test_api_versions_lists_the_served_ranges(kafka: tuple[ServerProcess, int]) -> None:
    served_apis = _versions(kafka[1])
    assert served_apis[18] == (0, 4)
    assert served_apis[0][0] <= 3 <= served_apis[0][1]  # Produce with RecordBatch v2
    assert served_apis[1][0] <= 4 <= served_apis[1][1]
    assert 3 in served_apis and 2 in served_apis


def test_a_newer_api_versions_gets_the_v0_refusal_and_the_connection_stays(
    kafka: tuple[ServerProcess, int],
) -> None:
    with connect(kafka[1]) as sock:
        # ApiVersions v9 does not exist: the answer is v0-shaped, UNSUPPORTED_VERSION, with the
        # ranges, so the client can retry at a version both know (KIP-511).
        header = struct.pack(">hhih", 18, 9, 7, 1) + b"x" + b"\0" + b"\x02t\x021\x00"
        sock.sendall(struct.pack(">i", len(header)) + header)
        data = receive(sock)
        assert data is not None
        correlation, answer = decode(18, 0, data)
        assert correlation == 7
        assert answer.error_code == ErrorCode.unsupported_version
        assert any(k.api_key == 0 for k in answer.api_keys)
        # The same connection goes on.
        again = call(sock, ApiVersionsV0(), correlation_id=8)
        assert again.error_code == ErrorCode.none


def test_an_api_not_served_is_answered_unsupported_and_the_connection_stays(
    kafka: tuple[ServerProcess, int],
) -> None:
    with connect(kafka[1]) as sock:
        request = struct.pack(">hhih", 57, 0, 11, 1) + b"x" + b"\0" * 8
        sock.sendall(struct.pack(">i", len(request)) + request)
        data = receive(sock)
        assert data is not None
        assert struct.unpack(">ih", data) == (11, ErrorCode.unsupported_version.value)
        assert call(sock, ApiVersionsV0(), correlation_id=12).error_code == ErrorCode.none


@pytest.mark.parametrize(
    "size",
    [-1, 3, (100 << 20) + 1],
    ids=["negative", "shorter-than-a-header", "above-request-max"],
)
def test_a_frame_of_impossible_size_closes_only_its_connection(
    kafka: tuple[ServerProcess, int], size: int
) -> None:
    with connect(kafka[1]) as sock:
        sock.sendall(struct.pack(">i", size) + b"\0" * 16)
        assert receive(sock) is None
    assert _versions(kafka[1])[18] == (0, 4)
    assert kafka[0].process is not None and kafka[0].process.poll() is None


def test_a_body_that_does_not_decode_closes_its_connection(
    kafka: tuple[ServerProcess, int],
) -> None:
    with connect(kafka[1]) as sock:
        good = frame(metadata_request(create=False))
        # Cut the body: the header is whole, the topics array claims more than there is.
        bad = good[4:16] + b"\x7f\xff\xff\xff"
        sock.sendall(struct.pack(">i", len(bad)) + bad)
        assert receive(sock) is None
    assert 18 in _versions(kafka[1])


def test_metadata_names_this_broker_and_unknown_topics(kafka: tuple[ServerProcess, int]) -> None:
    with connect(kafka[1]) as sock:
        answer = call(sock, metadata_request("absent", create=False))
    assert [(b.host, b.port) for b in answer.brokers] == [("127.0.0.1", kafka[1])]
    assert answer.controller_id == answer.brokers[0].node_id
    (topic,) = answer.topics
    assert topic.error_code == ErrorCode.unknown_topic_or_partition


def test_metadata_creates_a_topic_a_producer_names(kafka: tuple[ServerProcess, int]) -> None:
    with connect(kafka[1]) as sock:
        answer = call(sock, metadata_request("made"))
        (topic,) = answer.topics
        assert topic.error_code == ErrorCode.none
        assert [p.partition_index for p in topic.partitions] == [0]
        assert topic.partitions[0].leader_id == answer.brokers[0].node_id
        offsets = call(sock, list_offsets_request("made", (0, -2), (9, -1)), correlation_id=2)
    first, missing = offsets.topics[0].partitions
    assert (first.error_code, first.offset) == (ErrorCode.none, 0)
    assert missing.error_code == ErrorCode.unknown_topic_or_partition


def test_random_frames_never_stop_the_listener(kafka: tuple[ServerProcess, int]) -> None:
    """A bounded fuzz: frames with served and unserved api keys, random versions and random
    bodies, on fresh and reused connections. Each is answered or its connection closed; the
    server stays up and answers a well-formed request afterwards."""
    rng = random.Random(2026)
    port = kafka[1]
    keys = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 32, 36, 37, 57, 99, -1]
    sock: socket.socket | None = None
    closed = answered = 0
    for i in range(400):
        if sock is None:
            sock = connect(port, timeout=2)
        body = rng.randbytes(rng.choice([0, 1, 7, 30, 200, 2000]))
        head = struct.pack(">hhi", rng.choice(keys), rng.randint(-1, 15), i)
        data = head + body
        sock.sendall(struct.pack(">i", len(data)) + data)
        try:
            answer = receive(sock)
        except TimeoutError:
            answer = None  # e.g. a produce with acks=0 says nothing: move on
        if answer is None:
            closed += 1
            sock.close()
            sock = None
        else:
            answered += 1
            assert struct.unpack_from(">i", answer)[0] == i
    if sock is not None:
        sock.close()
    assert closed and answered
    assert kafka[0].process is not None and kafka[0].process.poll() is None
    assert _versions(port)[18] == (0, 4)


def _batch(count: int, codec: Codec = Codec.NONE) -> bytes:
    values = b"".join(b"value-%03d" % i for i in range(count))
    return build_batch(
        offsets=np.arange(count, dtype=np.int64),
        timestamps=np.full(count, 1_700_000_000_000, dtype=np.int64),
        values=(
            values,
            np.arange(count, dtype=np.int64) * 9,
            np.full(count, 9, dtype=np.int64),
        ),
        codec=codec,
    )


def _latest(sock: socket.socket, topic: str) -> int:
    answer = call(sock, list_offsets_request(topic, (0, -1)), correlation_id=99)
    return int(answer.topics[0].partitions[0].offset)


def _made(sock: socket.socket, topic: str) -> None:
    made = call(sock, metadata_request(topic))
    assert made.topics[0].error_code == ErrorCode.none


def test_a_corrupt_batch_is_refused_and_nothing_is_written(
    kafka: tuple[ServerProcess, int],
) -> None:
    with connect(kafka[1]) as sock:
        _made(sock, "crc")
        good = _batch(5)
        answer = call(sock, produce_request("crc", 0, good))
        part = answer.responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset) == (ErrorCode.none, 0)
        bad = bytearray(_batch(5))
        bad[-3] ^= 0xFF  # inside the last record: the CRC no longer matches
        # A good batch and a corrupt one in the same partition's records: neither is written.
        answer = call(sock, produce_request("crc", 0, good + bytes(bad)), correlation_id=2)
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.corrupt_message
        assert part.error_message
        assert _latest(sock, "crc") == 5


def test_mutated_requests_never_stop_the_listener(kafka: tuple[ServerProcess, int]) -> None:
    """Well-formed requests of every served kind with bytes changed or cut: each is answered
    or its connection closed, and afterwards the server appends and reads as before."""
    rng = random.Random(26)
    port = kafka[1]
    with connect(port) as sock:
        _made(sock, "fz")
    seeds = [
        frame(metadata_request("fz")),
        frame(produce_request("fz", 0, _batch(4))),
        frame(produce_request("fz", 0, _batch(4, Codec.ZSTD))),
        frame(produce_request("fz", 0, _batch(4, Codec.GZIP))),
        frame(fetch_request("fz", max_wait=timedelta(milliseconds=5))),
    ]
    sock: socket.socket | None = None
    for i in range(600):
        if sock is None:
            sock = connect(port, timeout=2)
        data = bytearray(rng.choice(seeds)[4:])
        for _ in range(rng.choice([1, 2, 5])):
            data[rng.randrange(8, len(data))] = rng.randrange(256)
        if rng.random() < 0.1:
            data = data[: rng.randrange(8, len(data))]
        struct.pack_into(">i", data, 4, i)
        sock.sendall(struct.pack(">i", len(data)) + bytes(data))
        try:
            answer = receive(sock)
        except TimeoutError:
            answer = None
        if answer is None:
            sock.close()
            sock = None
    if sock is not None:
        sock.close()
    assert kafka[0].process is not None and kafka[0].process.poll() is None
    with connect(port) as sock:
        before = _latest(sock, "fz")
        answer = call(sock, produce_request("fz", 0, _batch(3)), correlation_id=5)
        part = answer.responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset) == (ErrorCode.none, before)
        assert _latest(sock, "fz") == before + 3
    logged = kafka[0].stderr_lines
    assert any("kafka connection from" in line for line in logged)  # each close is logged
    assert not any("Traceback" in line for line in logged)  # and none was a bug
