"""Raw Kafka requests for tests: frames built and answers read with kio, over a plain socket.

Beside the framing, the requests several test files send raw (a Metadata that may create its
topics, a Fetch of one partition, a ListOffsets), built here once with the fields a test varies as
arguments, and :func:`run`, the deadline every sans-IO coordinator or inbox scenario runs under.
"""

from __future__ import annotations

import asyncio
import io
import socket
import struct
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from kio.index import load_response_schema
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer

T = TypeVar("T")


def frame(body: Any, correlation_id: int = 1, client_id: str = "tidelog-test") -> bytes:
    """The request frame (size included) carrying ``body``, a kio request."""
    out = io.BytesIO()
    header_cls = HeaderV2 if body.__flexible__ else HeaderV1
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=body.__api_key__,
            request_api_version=body.__version__,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(type(body))(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def receive(sock: socket.socket) -> bytes | None:
    """One response frame without its size; None when the server closed the connection."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return _exactly(sock, size)


def _exactly(sock: socket.socket, count: int) -> bytes | None:
    parts = b""
    while len(parts) < count:
        chunk = sock.recv(count - len(parts))
        if not chunk:
            return None
        parts += chunk
    return parts


def decode(api_key: int, version: int, data: bytes) -> tuple[int, Any]:
    """(correlation id, response body) of a response frame (the size already read)."""
    cls = load_response_schema(api_key, version)
    (correlation,) = struct.unpack_from(">i", data)
    offset = 4
    if cls.__flexible__ and api_key != 18:
        offset += 1  # the header's empty tagged fields
    body, _ = entity_reader(cls)(data, offset)
    return correlation, body


def call(sock: socket.socket, body: Any, correlation_id: int = 1) -> Any:
    """Send ``body`` and return the decoded answer (an AssertionError if the server hung up)."""
    sock.sendall(frame(body, correlation_id))
    data = receive(sock)
    assert data is not None, "the server closed the connection"
    correlation, answer = decode(body.__api_key__, body.__version__, data)
    assert correlation == correlation_id
    return answer


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return sock


def metadata_request(*topics: str, create: bool = True) -> MetadataRequest:
    """A Metadata v12 request for ``topics`` (None: every topic), creating absent ones if
    ``create``."""
    return MetadataRequest(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics) or None,
        allow_auto_topic_creation=create,
        include_topic_authorized_operations=False,
    )


def fetch_request(
    topic: str,
    offset: int = 0,
    max_wait: timedelta = timedelta(milliseconds=100),
    max_bytes: int = 1 << 20,
    partition: int = 0,
) -> FetchRequest:
    """A Fetch v12 request of one partition from ``offset``, up to ``max_bytes`` (the request's
    and the partition's bound), waiting up to ``max_wait`` for one byte."""
    return FetchRequest(
        replica_id=-1,
        max_wait=max_wait,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def list_offsets_request(topic: str, *wanted: tuple[int, int]) -> ListOffsetsRequest:
    """A ListOffsets v7 request of ``topic``'s (partition, timestamp) pairs (-1 latest,
    -2 earliest)."""
    return ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(
            ListOffsetsTopic(
                name=topic,
                partitions=tuple(
                    ListOffsetsPartition(
                        partition_index=index, current_leader_epoch=-1, timestamp=timestamp
                    )
                    for index, timestamp in wanted
                ),
            ),
        ),
    )


def run(scenario: Callable[[], Coroutine[Any, Any, T]], within: float = 20.0) -> T:
    """``scenario`` run in a new event loop, failed if it takes more than ``within`` seconds."""
    return asyncio.run(asyncio.wait_for(scenario(), within))
