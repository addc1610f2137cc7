"""Kafka's variable-length integers, decoded and encoded for many at once with numpy.

Records in a batch (format 2) carry their lengths, deltas and counts as zigzag varints, the
encoding of Protocol Buffers' ``sint32``/``sint64``: the value ``v`` becomes ``(v << 1) ^ (v >>
63)``, written 7 bits a byte, least significant first, the top bit of each byte set when another
byte follows. An int32 field takes at most 5 bytes, an int64 field (the timestamp delta) 10.

Theory of operation. :func:`decode` reads one varint at each of many positions at once: it gathers
a window of ``max_width`` bytes at every position into an ``(n, max_width)`` array, finds each
row's first byte without the continuation bit, masks the bytes after it, shifts and sums. The
buffer it reads must be followed by at least :data:`PAD` bytes (zeros), so a window never reads
past its end; a varint whose bytes cross the end of its record is the caller's check. When every
first byte stands alone (the common case for attributes, deltas and counts) one gather does it.
:func:`encode` is the reverse: the width of each value from its bit length, then the bytes of all
values as rows of one array. :func:`read` decodes one varint in Python, for the few places (header
lists) that walk record by record.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]
UInt8Array = npt.NDArray[np.uint8]

PAD: Final = 10
"""Zero bytes a buffer given to :func:`decode` must end with."""
INT32_WIDTH: Final = 5
INT64_WIDTH: Final = 10
_COLUMNS: Final = np.arange(INT64_WIDTH, dtype=np.int64)
_SHIFTS: Final = (7 * np.arange(INT64_WIDTH, dtype=np.uint64)).astype(np.uint64)
_NO_VALUES: Final[Int64Array] = np.empty(0, dtype=np.int64)


class VarintError(ValueError):
    """A varint longer than its field allows (``index``: the first such position's place)."""

    def __init__(self, index: int) -> None:
        super().__init__(f"varint {index} runs past its maximum length")
        self.index = index


def decode(
    buffer: UInt8Array, positions: Int64Array, max_width: int, *, strict: bool = True
) -> tuple[Int64Array, Int64Array]:
    """The zigzag varints starting at ``positions`` in ``buffer``: (values, widths in bytes).

    ``buffer`` ends with :data:`PAD` zero bytes past every position; a varint of more than
    ``max_width`` bytes raises :class:`VarintError`, or without ``strict`` gets width 0."""
    if not len(positions):
        return _NO_VALUES, _NO_VALUES
    first = buffer[positions].astype(np.int64)
    if int(first.max()) < 0x80:
        return (first >> 1) ^ -(first & 1), np.ones(len(positions), dtype=np.int64)
    second = buffer[positions + 1].astype(np.int64)
    longer = first >= 0x80
    if not bool((longer & (second >= 0x80)).any()):
        raw = np.where(longer, (first & 0x7F) | (second << 7), first)
        return (raw >> 1) ^ -(raw & 1), longer.astype(np.int64) + 1
    window = buffer[positions[:, None] + _COLUMNS[:max_width]]
    more = window >= 0x80
    stops = np.argmin(more, axis=1)  # the first byte without the continuation bit
    unended = more[np.arange(len(positions)), stops]
    if strict and bool(unended.any()):
        raise VarintError(int(np.argmax(unended)))
    keep = _COLUMNS[:max_width] <= stops[:, None]
    payload = (window & 0x7F).astype(np.uint64) << _SHIFTS[:max_width]
    raw_u = np.where(keep, payload, np.uint64(0)).sum(axis=1, dtype=np.uint64)
    values = (raw_u >> np.uint64(1)).astype(np.int64) ^ -(raw_u & np.uint64(1)).astype(np.int64)
    return values, np.where(unended, 0, stops.astype(np.int64) + 1)


def zigzag(values: Int64Array) -> npt.NDArray[np.uint64]:
    """The unsigned zigzag form of ``values`` (small magnitudes become small numbers)."""
    return ((values << 1) ^ (values >> 63)).astype(np.uint64)


def widths(values: Int64Array) -> Int64Array:
    """The bytes each of ``values`` takes as a zigzag varint."""
    raw = zigzag(values)
    width = np.ones(len(values), dtype=np.int64)
    top = int(raw.max()) if len(raw) else 0
    for shift in range(7, 64, 7):
        if top < 1 << shift:  # no value needs another byte
            break
        width += raw >= np.uint64(1 << shift)
    return width


def encode(values: Int64Array, max_width: int) -> tuple[UInt8Array, Int64Array]:
    """Every value's varint bytes as the rows of an ``(n, max_width)`` array (each row's bytes
    after its width are unspecified) and the widths."""
    raw = zigzag(values)
    width = widths(values)
    septets = ((raw[:, None] >> _SHIFTS[:max_width]) & np.uint64(0x7F)).astype(np.uint8)
    septets |= (_COLUMNS[:max_width] < (width - 1)[:, None]).astype(np.uint8) << 7
    return septets, width


def encode_one(value: int) -> bytes:
    """One zigzag varint (for a header list or a count: the per-record paths)."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def read(
    data: bytes | memoryview, at: int, end: int, max_width: int = INT32_WIDTH
) -> tuple[int, int]:
    """(value, position after it) of the zigzag varint at ``at``; ``ValueError`` when it runs
    past ``end`` or ``max_width`` bytes."""
    raw = 0
    shift = 0
    for i in range(at, min(end, at + max_width)):
        byte = data[i]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    raise ValueError(f"a varint at byte {at} runs past its record or its {max_width} bytes")
