"""Raw Kafka requests for tests: frames built and answers read with kio, over a plain socket."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer


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
