"""gRPC over HTTP/2, the parts that are plain bytes and strings: message framing, timeouts,
metadata and status text.

A gRPC message on an HTTP/2 stream is one byte of flags (0: not compressed), a 4-byte
big-endian length (``framed.PREFIX``), then that many bytes. :class:`MessageReader` cuts a
stream's DATA into messages, whatever the DATA frame boundaries; it refuses a message longer
than its limit (:class:`MessageTooLarge`) as soon as the prefix is read, before buffering it,
and a compressed one (this server announces no ``grpc-encoding``, so a client never has a
reason to send one).

Headers follow the gRPC HTTP/2 protocol document: ``grpc-timeout`` is an integer of ASCII
digits (eight by the document, up to ten taken) and a unit (H M S m u n), anything else
:class:`MalformedTimeout`; metadata keys ending in ``-bin`` carry base64 (padded or
not) and are handed to handlers as bytes, others as str; ``grpc-message`` is percent-encoded
UTF-8 (bytes outside printable ASCII and ``%`` itself).
"""

from __future__ import annotations

import base64
from typing import Final

from tidelog.api.framed import PREFIX

Metadata = tuple[tuple[str, str | bytes], ...]
"""A call's metadata as handlers see it (``-bin`` values as bytes)."""

_TIMEOUT_UNITS: Final[dict[str, float]] = {
    "H": 3600.0,
    "M": 60.0,
    "S": 1.0,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}
TIMEOUT_DIGITS_MAX: Final = 10
"""The protocol says eight digits; grpc-core takes more (nine here), so a few more pass."""

RESERVED_HEADERS: Final = frozenset(
    {
        "content-type",
        "te",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "user-agent",
        "grpc-message-type",
        "host",
    }
)
"""Headers the transport reads itself and grpcio does not hand to handlers as metadata
(``user-agent`` is handed on, as grpcio does)."""


class MalformedTimeout(ValueError):
    """A ``grpc-timeout`` header that is not digits and a unit: the call fails INTERNAL
    "Error parsing 'grpc-timeout' metadata", as grpcio's."""

    def __init__(self, value: bytes) -> None:
        super().__init__("Error parsing 'grpc-timeout' metadata")
        self.value = value


class FramingError(Exception):
    """A stream's DATA is not a sequence of gRPC messages this server takes."""


class MessageTooLarge(FramingError):
    """A message longer than the server receives (``tidelog.wire.MAX_FRAME``)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"Received message larger than max ({length} vs. {limit})")
        self.length = length
        self.limit = limit


def frame(payload: bytes) -> bytes:
    """``payload`` as one gRPC message (prefix and bytes)."""
    return PREFIX.pack(0, len(payload)) + payload


class MessageReader:
    """Cuts the bytes of one stream's DATA frames into messages (module docstring)."""

    __slots__ = ("_buffer", "_limit", "_need")

    def __init__(self, limit: int) -> None:
        self._buffer = bytearray()
        self._limit = limit
        self._need = 0
        """The length of the message being read once its prefix is in; 0 before."""

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished message are held (a stream may not end so)."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order; :class:`FramingError` on a bad prefix."""
        buffer = self._buffer
        buffer += data
        messages: list[bytes] = []
        start = 0
        end = len(buffer)
        while end - start >= PREFIX.size:
            flag, length = PREFIX.unpack_from(buffer, start)
            if flag != 0:
                raise FramingError("compressed message received, but no encoding was negotiated")
            if length > self._limit:
                raise MessageTooLarge(length, self._limit)
            if end - start - PREFIX.size < length:
                break
            body = start + PREFIX.size
            messages.append(bytes(buffer[body : body + length]))
            start = body + length
        if start:
            del buffer[:start]
        return messages


def parse_timeout(value: bytes) -> float:
    """Seconds of a ``grpc-timeout`` header: ASCII digits (at most
    :data:`TIMEOUT_DIGITS_MAX`) and a unit; :class:`MalformedTimeout` otherwise."""
    digits = value[:-1]
    unit = _TIMEOUT_UNITS.get(value[-1:].decode("latin-1"))
    if unit is None or not 0 < len(digits) <= TIMEOUT_DIGITS_MAX or not _ascii_digits(digits):
        raise MalformedTimeout(value)
    return int(digits) * unit


def _ascii_digits(text: bytes) -> bool:
    return all(0x30 <= byte <= 0x39 for byte in text)  # str.isdigit() takes '²' too


def metadata_value(key: str, value: bytes) -> str | bytes:
    """A header's value as a handler sees it: ``-bin`` keys decoded from base64 to bytes."""
    if key.endswith("-bin"):
        text = value.strip()
        return base64.b64decode(text + b"=" * (-len(text) % 4))
    return value.decode("latin-1")


def header_value(key: str, value: str | bytes) -> bytes:
    """A metadata value as it goes on the wire (``-bin``: base64 without padding, as grpc's
    core writes it)."""
    if key.endswith("-bin"):
        raw = value if isinstance(value, bytes) else value.encode()
        return base64.b64encode(raw).rstrip(b"=")
    return value.encode("latin-1") if isinstance(value, str) else value


def encode_message(text: str) -> bytes:
    """``grpc-message``: percent-encoded UTF-8."""
    out = bytearray()
    for byte in text.encode("utf-8", errors="replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def peer_name(address: object) -> str:
    """A socket's peer address as grpcio's ``context.peer()`` writes it."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        if ":" in str(host):
            return f"ipv6:[{host}]:{port}"
        return f"ipv4:{host}:{port}"
    if isinstance(address, str) and address:
        return f"unix:{address}"
    return "unknown"
