"""A ``RecordBatch`` frame as it was received, still serialised: its columns found in place.

A subscription's frames are most of what a catch-up moves (a frame carries up to 1 MiB of
records). Parsing one with protobuf copies every field into the message, and reading a bytes
field of the message copies it again: two copies of the frame per frame, which for 100-byte
values measured ~40 ns per message, a fifth of what the client spends on a columnar catch-up.
:class:`ReceivedFrame` reads the frame's wire format instead: one pass over the top-level fields
and those of its ``Messages`` (a few fields, not one per record) notes where each field lies;
the value bytes are then used where they arrived (:meth:`ReceivedFrame.values_span`: the
buffer, where the values start in it, their length), the small columns are sliced out once when
asked for, and the protobuf message is parsed only if something asks for it (``frame``, and the
header lists, which the protocol carries as protobuf messages).

Invariants: the columns are those ``v1.RecordBatch.FromString`` of the same bytes would give,
field for field (the last occurrence of a scalar field wins, unknown fields are skipped, an enum
is the varint's low 32 bits as a signed int32, as protobuf does;
``tests/wire/test_received_frames.py``). A frame whose ``messages`` occurs more than once (which
protobuf merges; the server never writes one) is parsed by protobuf and read in place in its
re-serialised, canonical form. Bytes that are not a well-formed message raise
:class:`~tidelog.wire.arrow.MalformedBatch` when the frame is made, never later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from google.protobuf.message import DecodeError

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.wire.arrow import MalformedBatch
from tidelog.wire.columns import FrameBytes

_LENGTH_DELIMITED: Final = 2
_VARINT: Final = 0
_FIXED64: Final = 1
_FIXED32: Final = 5
_SKIP_FIXED: Final = {_FIXED64: 8, _FIXED32: 4}

# Field numbers (proto/tidelog/v1/tidelog.proto).
_BATCH_OFFSETS, _BATCH_TIMESTAMPS, _BATCH_MESSAGES, _BATCH_END = 1, 2, 3, 4
_VALUES, _VALUE_SIZES, _KEYS, _KEY_SIZES, _HEADERS, _VALUE_POSITIONS, _VALUES_OMITTED = range(1, 8)

Span = tuple[int, int]
"""Where a length-delimited field's payload lies in the frame: [start, end)."""
_EMPTY: Final[Span] = (0, 0)


def _uvarint(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at ``at`` and where the next field starts."""
    value = shift = 0
    while at < end and shift < 64:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise MalformedBatch("malformed frame: a varint runs past its message")


def _int32(value: int) -> int:
    """A varint as protobuf reads an enum (or int32) field: its low 32 bits, signed."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _fields(
    data: bytes, at: int, end: int, merged: int = 0
) -> tuple[dict[int, Span], dict[int, int]]:
    """The length-delimited fields (their payloads' spans) and the varint fields (their values)
    of the message in ``data[at:end]``; the last occurrence of a field wins. A repeated field's
    spans are not kept (the header lists are read by protobuf), only that it occurred. Field
    ``merged`` (a message field, which protobuf merges) occurring twice raises ``_Merged``."""
    spans: dict[int, Span] = {}
    varints: dict[int, int] = {}
    while at < end:
        key, at = _uvarint(data, at, end)
        kind, number = key & 7, key >> 3
        if kind == _LENGTH_DELIMITED:
            length, at = _uvarint(data, at, end)
            if at + length > end:
                raise MalformedBatch("malformed frame: a field runs past its message")
            if number == merged and number in spans:
                raise _Merged
            spans[number] = (at, at + length)
            at += length
        elif kind == _VARINT:
            varints[number], at = _uvarint(data, at, end)
        elif kind in _SKIP_FIXED:
            at += _SKIP_FIXED[kind]
            if at > end:
                raise MalformedBatch("malformed frame: a field runs past its message")
        else:  # groups (3, 4) are not proto3, and 6, 7 are not wire types
            raise MalformedBatch(f"malformed frame: wire type {kind}")
        if number == 0:
            raise MalformedBatch("malformed frame: field number 0")
    return spans, varints


class _Merged(Exception):
    """A message field occurs twice: protobuf merges the occurrences (not read in place)."""


class ReceivedFrame(FrameBytes):
    """One serialised ``RecordBatch`` frame's columns, found in place (module docstring)."""

    __slots__ = ("_batch", "_data", "_message", "_messages", "_omitted", "end")

    def __init__(self, data: bytes) -> None:
        # Not FrameBytes.__init__: the message is built only when asked for (``frame``).
        self._read: dict[str, bytes] = {}
        self._message: v1.RecordBatch | None = None
        try:
            spans, varints = _fields(data, 0, len(data), _BATCH_MESSAGES)
        except _Merged:  # not the layout the server writes: protobuf merges, then read that
            try:
                self._message = v1.RecordBatch.FromString(data)
            except DecodeError as error:
                raise MalformedBatch(f"malformed frame: {error}") from error
            data = self._message.SerializeToString()
            spans, varints = _fields(data, 0, len(data))
        self._data = data
        self._batch = spans
        self.end: int = _int32(varints.get(_BATCH_END, 0))
        """The frame's ``end`` (an ``EndReason``; 0: the subscription goes on)."""
        start, stop = spans.get(_BATCH_MESSAGES, _EMPTY)
        self._messages, inner = _fields(data, start, stop)
        self._omitted = bool(inner.get(_VALUES_OMITTED, 0))

    @property
    def frame(self) -> v1.RecordBatch:
        """The frame as a protobuf message (parsed when first asked for)."""
        if self._message is None:
            self._message = v1.RecordBatch.FromString(self._data)
        return self._message

    def _slice(self, name: str, spans: dict[int, Span], number: int) -> bytes:
        got = self._read.get(name)
        if got is None:
            start, end = spans.get(number, _EMPTY)
            got = self._read[name] = self._data[start:end]
        return got

    @property
    def offsets(self) -> bytes:
        return self._slice("offsets", self._batch, _BATCH_OFFSETS)

    @property
    def timestamps(self) -> bytes:
        return self._slice("timestamps", self._batch, _BATCH_TIMESTAMPS)

    @property
    def values(self) -> bytes:
        return self._slice("values", self._messages, _VALUES)

    def values_span(self) -> tuple[bytes, int, int]:
        start, end = self._messages.get(_VALUES, _EMPTY)
        return self._data, start, end - start

    @property
    def values_omitted(self) -> bool:
        return self._omitted

    @property
    def value_sizes(self) -> bytes:
        return self._slice("value_sizes", self._messages, _VALUE_SIZES)

    @property
    def value_positions(self) -> bytes:
        return self._slice("value_positions", self._messages, _VALUE_POSITIONS)

    @property
    def keys(self) -> bytes:
        return self._slice("keys", self._messages, _KEYS)

    @property
    def key_sizes(self) -> bytes:
        return self._slice("key_sizes", self._messages, _KEY_SIZES)

    @property
    def headers(self) -> Sequence[v1.HeaderList]:
        if _HEADERS not in self._messages:
            return ()
        return self.frame.messages.headers


__all__ = ["ReceivedFrame"]
