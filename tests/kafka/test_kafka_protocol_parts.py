"""A response written as buffers (``protocol.encode_response_parts``): the same frame as one
joined encoding, read back by kio, with the large records handed over as the very objects given
(not copied into the frame)."""

from __future__ import annotations

import struct
from datetime import timedelta

import pytest
from kio.schema.errors import ErrorCode
from tests.kafka.kafka_wire import decode

from tidelog.kafka.protocol import (
    LARGE_WRITE,
    RecordChunks,
    Request,
    answer,
    encode_response,
    encode_response_parts,
    nested,
)


def _fetch_answer(request: Request, records: list[bytes | RecordChunks | None]) -> object:
    partitions = tuple(
        nested(
            request,
            "PartitionData",
            partition_index=i,
            error_code=ErrorCode.none,
            high_watermark=7,
            last_stable_offset=7,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=r,
        )
        for i, r in enumerate(records)
    )
    topic = nested(request, "FetchableTopicResponse", topic="t", partitions=partitions)
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(topic,),
    )


@pytest.mark.parametrize("version", [4, 11, 12])  # legacy bytes, and flexible compact bytes
def test_records_are_sent_as_given_in_a_frame_kio_reads(version: int) -> None:
    big = bytes(range(256)) * (LARGE_WRITE // 256 + 3)
    chunks = [b"a" * (LARGE_WRITE + 1), b"tiny", bytes(LARGE_WRITE * 2)]
    request = Request(api_key=1, version=version, correlation_id=42, client_id=None, body=None)
    body = _fetch_answer(request, [big, RecordChunks(chunks), b"small", b"", None])
    parts = encode_response_parts(request, body)
    frame = b"".join(parts)
    assert frame == encode_response(request, body)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    for given in (big, *chunks):  # every large buffer, and every chunk, is its own part
        assert any(part is given for part in parts)
    correlation, read = decode(1, version, frame[4:])
    assert correlation == 42
    records = [p.records for p in read.responses[0].partitions]
    assert records[0] == big
    assert records[1] == b"".join(chunks)
    assert records[2] == b"small"
    assert records[3] == b""
    assert records[4] is None


def test_record_chunks_measure_and_join_in_order() -> None:
    chunks = RecordChunks([b"ab", memoryview(b"cde"), b""])
    assert len(chunks) == 5
    assert chunks.tobytes() == b"abcde"
