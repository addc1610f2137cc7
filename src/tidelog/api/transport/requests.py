"""What a new stream's headers ask of the native gRPC server, read without I/O.

:func:`read_request` turns the decoded header list of a stream's HEADERS into either a
:class:`Request` (the method's path, the caller's metadata, its deadline) or an :class:`HttpRefusal`
/ :class:`GrpcRefusal` the connection answers at once, never opening a call. The checks and their
order follow grpcio's server: the header list's size (RFC 7541 4.1: name + value + 32 per entry)
against ``max_header_list``, the method (``POST``: else HTTP 405) and content type
(``application/grpc...``: else HTTP 415). Whether the method exists is the connection's question
(its router) and comes next; a malformed ``grpc-timeout`` (``INTERNAL``) and an elapsed one
(``DEADLINE_EXCEEDED``) are reported only after it, as grpcio does, so :class:`Request` carries
them. Metadata keeps grpc's reserved headers out (``user-agent`` excepted) and drops entries
whose ``-bin`` value is not base64. A refused call is answered with :func:`trailers_only`.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass

import grpc

from tidelog.api.transport.messages import (
    RESERVED_HEADERS,
    MalformedTimeout,
    Metadata,
    encode_message,
    metadata_value,
    parse_timeout,
)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    metadata: Metadata
    timeout: float | None
    """Seconds from now, or None: no deadline."""
    bad_timeout: str | None = None
    """Why ``grpc-timeout`` could not be read (the call then fails ``INTERNAL``)."""


@dataclass(frozen=True, slots=True)
class HttpRefusal:
    """Not a gRPC request: an HTTP status alone."""

    status: bytes


@dataclass(frozen=True, slots=True)
class GrpcRefusal:
    code: grpc.StatusCode
    details: str


def read_request(
    headers: list[tuple[bytes, bytes]], max_header_list: int
) -> Request | HttpRefusal | GrpcRefusal:
    """The request a stream's headers make, or how to refuse it (module docstring)."""
    size = sum(len(key) + len(value) + 32 for key, value in headers)
    if size > max_header_list:
        return GrpcRefusal(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"received metadata size exceeds hard limit ({size} vs. {max_header_list})",
        )
    pseudo: dict[bytes, bytes] = {}
    metadata: list[tuple[str, str | bytes]] = []
    timeout: float | None = None
    bad_timeout: str | None = None
    for raw_key, raw_value in headers:
        if raw_key.startswith(b":"):
            pseudo[raw_key] = raw_value
            continue
        key = raw_key.decode("latin-1")
        if key == "grpc-timeout":
            try:
                timeout = parse_timeout(raw_value)
            except MalformedTimeout as error:
                bad_timeout = str(error)
        elif key == "content-type":
            pseudo[b"content-type"] = raw_value
        elif key not in RESERVED_HEADERS or key == "user-agent":
            try:
                metadata.append((key, metadata_value(key, raw_value)))
            except (binascii.Error, ValueError):
                continue
    if pseudo.get(b":method") != b"POST":
        return HttpRefusal(b"405")
    if not pseudo.get(b"content-type", b"").startswith(b"application/grpc"):
        return HttpRefusal(b"415")
    method = pseudo.get(b":path", b"").decode("latin-1")
    return Request(method, tuple(metadata), timeout, bad_timeout)


def trailers_only(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    """The one HEADERS block (end of stream) answering a call with ``code`` and no response."""
    return [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", str(code.value[0]).encode()),
        (b"grpc-message", encode_message(details)),
    ]
