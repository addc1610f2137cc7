"""Kafka's framing and headers: a request frame in, a response frame out.

On a connection, every request is an int32 big-endian size then that many bytes: the request
header (api key, api version, correlation id, client id; from header version 2, tagged fields)
then the body. The response is a size, the response header (the correlation id; from header
version 1, tagged fields) and the body. Which header version a message uses follows from whether
its api version is *flexible* (KIP-482), with one exception: an ``ApiVersions`` response always
has header version 0, so that a client can read it whatever version it asked for.

The bodies are encoded and decoded by ``kio``: dataclasses generated from Kafka's own schema files,
one module per api and version, with a native decoder. This module knows the schema of no api
(that is :mod:`tidelog.kafka.apis`'s table); it turns bytes into a :class:`Request` and a
response object back into bytes, and raises :class:`MalformedRequest` for anything it cannot read.

A response is written as a list of buffers (:func:`encode_response_parts`): kio writes each field
to a :class:`_Parts` sink, which keeps the small writes together and every large one (a Fetch
answer's records, or :class:`RecordChunks`, several batches that make one ``records`` field) as
the object it was given, so the records reach the socket without being copied into a frame.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

SIZE: Final = struct.Struct(">i")
_KEY_VERSION: Final = struct.Struct(">hhi")
_CORRELATION: Final = struct.Struct(">i")
API_VERSIONS_KEY: Final = 18


MAX_FRAME: Final = 0x7FFFFFFF
"""A frame's size is an int32: no response can be larger."""


class ResponseTooLarge(Exception):
    """A response whose frame would not fit an int32 size: not sent; the connection is closed
    after a log line (the handlers' budgets should never let one be built)."""


class MalformedRequest(Exception):
    """A frame that does not decode as the request its header names: the connection is closed
    (Kafka's answer to a request it cannot read), after a log line."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header fields and its body (a kio dataclass)."""

    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any


@dataclass(frozen=True, slots=True)
class FrameStart:
    """What every request's first eight bytes say, readable even when the rest is not."""

    api_key: int
    version: int
    correlation_id: int


def frame_start(frame: bytes) -> FrameStart:
    if len(frame) < _KEY_VERSION.size:
        raise MalformedRequest(f"a request of {len(frame)} bytes is shorter than its header")
    key, version, correlation = _KEY_VERSION.unpack_from(frame)
    return FrameStart(key, version, correlation)


_MODULES: dict[tuple[int, int, EntityType], ModuleType] = {}


def schema_module(api_key: int, version: int, kind: EntityType) -> ModuleType:
    """kio's module for the api's request or response at ``version`` (cached)."""
    key = (api_key, version, kind)
    module = _MODULES.get(key)
    if module is None:
        module = _MODULES[key] = load_payload_module(api_key, version, kind)  # type: ignore[arg-type]
    return module


def _payload_class(module: ModuleType, kind: EntityType) -> type[Any]:
    suffix = "Request" if kind is EntityType.request else "Response"
    for name, value in vars(module).items():
        if (
            isinstance(value, type)
            and name.endswith(suffix)
            and getattr(value, "__type__", None) is kind
        ):
            return value
    raise LookupError(f"no {suffix} class in {module.__name__}")


_READERS: dict[tuple[int, int], tuple[bool, Any]] = {}


def _request_reader(api_key: int, version: int) -> tuple[bool, Any]:
    found = _READERS.get((api_key, version))
    if found is None:
        cls = _payload_class(
            schema_module(api_key, version, EntityType.request), EntityType.request
        )
        found = _READERS[(api_key, version)] = (bool(cls.__flexible__), entity_reader(cls))
    return found


_HEADER_V1 = entity_reader(RequestHeaderV1)
_HEADER_V2 = entity_reader(RequestHeaderV2)


def decode_request(frame: bytes) -> Request:
    """The request in ``frame`` (the bytes after the size). The caller has checked that the api
    key and version are served (:func:`frame_start`)."""
    start = frame_start(frame)
    try:
        flexible, read_body = _request_reader(start.api_key, start.version)
        header, used = (_HEADER_V2 if flexible else _HEADER_V1)(frame, 0)
        # Bytes after the body are ignored, as Kafka's broker ignores them (librdkafka sends a
        # few past Metadata v12's fields).
        body, _ = read_body(frame, used)
    except MalformedRequest:
        raise
    except Exception as error:  # kio raises its own errors, ValueError and IndexError alike
        raise MalformedRequest(
            f"api {start.api_key} v{start.version} (correlation id {start.correlation_id}) "
            f"does not decode: {type(error).__name__}: {error}"
        ) from error
    return Request(start.api_key, start.version, start.correlation_id, header.client_id, body)


_WRITERS: dict[type[Any], Any] = {}


LARGE_WRITE: Final = 16 * 1024
"""A write of at least this many bytes stays its own part of the response, not copied."""


class RecordChunks:
    """A ``records`` field made of several buffers (record batches back to back), written in
    order and never joined: its ``len`` is theirs together, as kio's writer asks."""

    __slots__ = ("chunks", "size")

    def __init__(self, chunks: Sequence[bytes | memoryview]) -> None:
        self.chunks = tuple(chunks)
        self.size = sum(len(c) for c in self.chunks)

    def __len__(self) -> int:
        return self.size

    def tobytes(self) -> bytes:
        return b"".join(self.chunks)


class _Parts:
    """A sink for kio's writers: small writes gathered in a bytearray, large ones kept as the
    objects given (the caller does not change them afterwards)."""

    __slots__ = ("parts", "size", "small")

    def __init__(self) -> None:
        self.small = bytearray()
        self.parts: list[bytes | bytearray | memoryview] = [self.small]
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview | RecordChunks) -> int:
        size = len(data)
        self.size += size
        if isinstance(data, RecordChunks):
            self._large(data.chunks)
        elif size >= LARGE_WRITE:
            self._large((data,))
        else:
            self.small += data
        return size

    def _large(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        self.parts += chunks
        self.small = bytearray()
        self.parts.append(self.small)


def encode_response_parts(
    request: FrameStart | Request, body: Any
) -> list[bytes | bytearray | memoryview]:
    """The response frame (size included) answering ``request`` with ``body``, as buffers to
    send in order (module docstring)."""
    cls = type(body)
    write: Any = _WRITERS.get(cls)  # kio's writers take any object with ``write``
    if write is None:
        write = _WRITERS[cls] = entity_writer(cls)
    out = _Parts()
    out.write(b"\0\0\0\0")
    out.write(_CORRELATION.pack(request.correlation_id))
    if cls.__flexible__ and request.api_key != API_VERSIONS_KEY:
        out.write(b"\0")  # the response header's tagged fields: none
    write(out, body)
    if out.size - SIZE.size > MAX_FRAME:
        raise ResponseTooLarge(
            f"the answer to api {request.api_key} (correlation id {request.correlation_id}) "
            f"is {out.size - SIZE.size} bytes, above a frame's {MAX_FRAME}"
        )
    first = out.parts[0]
    assert isinstance(first, bytearray)  # the size, at least, was a small write
    SIZE.pack_into(first, 0, out.size - SIZE.size)
    return [part for part in out.parts if len(part)]


def encode_response(request: FrameStart | Request, body: Any) -> bytes:
    """The response frame (size included) answering ``request`` with ``body``."""
    return b"".join(encode_response_parts(request, body))


def response_module(request: FrameStart | Request) -> ModuleType:
    """kio's module of the response to ``request`` (its nested classes build the answer)."""
    return schema_module(request.api_key, request.version, EntityType.response)


def response_class(request: FrameStart | Request) -> type[Any]:
    return _payload_class(response_module(request), EntityType.response)


def build(cls: type[Any], /, **fields: Any) -> Any:
    """An instance of the kio class ``cls`` from ``fields``, leaving out those its version does
    not have: one handler answers every version of its api."""
    names = cls.__dataclass_fields__
    return cls(**{name: value for name, value in fields.items() if name in names})


def nested(request: FrameStart | Request, class_name: str, /, **fields: Any) -> Any:
    """An instance of the response's nested class ``name`` at the request's version."""
    return build(getattr(response_module(request), class_name), **fields)


def answer(request: FrameStart | Request, /, **fields: Any) -> Any:
    """The response body to ``request`` from ``fields`` (those its version lacks left out)."""
    return build(response_class(request), **fields)


def has_field(request: FrameStart | Request, cls_name: str, field: str) -> bool:
    cls = getattr(response_module(request), cls_name)
    return field in cls.__dataclass_fields__
