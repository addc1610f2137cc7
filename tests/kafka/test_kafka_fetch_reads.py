"""A Fetch over more records than one read of the log holds (``fetch.READ_RECORDS``): the answer
carries one record batch per read, back to back, which together hold every record once and in
order, and a real consumer (librdkafka) reads them all."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from tests.kafka.kafka_wire import call, connect, fetch_request
from tests.support.kafka_clients import Outgoing, confluent_consume, confluent_produce
from tests.support.server import ServerProcess

from tidelog.kafka.fetch import READ_RECORDS
from tidelog.kafka.records import parse_batches

COUNT = 2 * READ_RECORDS + 500

pytestmark = pytest.mark.slow  # a real server and ~17,000 records through librdkafka


def _messages() -> list[Outgoing]:
    return [
        Outgoing(
            value=b"v" * (i % 3 * 50) + str(i).encode(),
            key=None if i % 5 else f"k{i}".encode(),
            headers=(("seq", str(i).encode()),) if i % 1000 == 7 else (),
        )
        for i in range(COUNT)
    ]


def _fetch(port: int, topic: str) -> bytes:
    request = fetch_request(topic, max_bytes=64 << 20)
    with connect(port) as sock:
        response = call(sock, request)
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    assert partition.high_watermark == COUNT  # the offset after the newest record
    return bytes(partition.records)


def test_a_large_fetch_is_several_batches_holding_every_record(
    kafka: tuple[ServerProcess, int],
) -> None:
    bootstrap = f"127.0.0.1:{kafka[1]}"
    sent = _messages()
    acks = confluent_produce(bootstrap, "reads", sent)
    assert [a.offset for a in acks] == list(range(COUNT))
    batches = parse_batches(_fetch(kafka[1], "reads"))
    assert len(batches) >= COUNT // READ_RECORDS + 1
    offsets = [b.base_offset + d for b in batches for d in b.offset_delta.tolist()]
    assert offsets == list(range(COUNT))
    values = [v for b in batches for v in b.values()]
    keys = [k for b in batches for k in b.keys()]  # noqa: SIM118 - a batch is no dict
    headers = [
        [(k.decode(), v) for k, v in b.raw_headers_of(i)] for b in batches for i in range(len(b))
    ]
    assert values == [m.value for m in sent]
    assert keys == [m.key for m in sent]
    assert headers == [list(m.headers) for m in sent]
    read = confluent_consume(bootstrap, "reads", COUNT)
    assert [(r.offset, r.key, r.value, r.headers) for r in read] == [
        (i, m.key, m.value, m.headers) for i, m in enumerate(sent)
    ]
