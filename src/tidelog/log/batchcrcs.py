"""CRC-32C of the records of a batch being encoded, from its headers and its bodies as given.

What it computes: for every record i, exactly ``crc32c(header_i[4:36] + body_i)``, the checksum
the format stores in a record's first four bytes (``docs/format.md``: over bytes [4, size)). It is
computed before the batch is laid out, so the laid-out buffer is written once, CRCs included, and
never sliced per record.

Theory. A record's checksummed bytes are its 32-byte header tail followed by its body. The tails
of a batch differ from each other in few bytes (the offset's low bytes; the sizes when the bodies
differ in length): CRC-32C is affine over GF(2), so for tails of one length
``crc(t_i) = crc(t_0) ^ raw(t_i ^ t_0)``, where ``raw`` is the CRC without its initial and final
inversion, a linear map, the xor of one 256-entry table per byte position. Only the columns in
which some tail differs from the first are looked up: a handful of numpy calls for the whole
batch. When the tails differ only in the offset (plain values of one size:
``offset_tail_crcs``) even the columns come from the offsets alone, without the tails. The body
then continues each record's checksum from its tail's, ``crc32c(body, crc(t))``
(the ``crc32c`` package continues a CRC from a given value), one C call per record through
``map`` on the body objects as the caller gave them: no slice, no Python frame per record. That
call is most of the cost (about 0.1 µs for a 100-byte body), half of what a call over a slice of
the laid-out batch costs, which was what the append path did before.

Only immutable ``bytes`` bodies are checksummed this way (``record.encode_batch`` decides): a
``bytearray`` the caller might change between the checksum and the layout is checksummed in the
laid-out batch instead (``crcs.record_crcs``), so a stored CRC is always of the bytes written.

Invariant: the result equals ``crc32c`` of each record's bytes [4, size) for every input
(``tests/log/test_batch_crcs.py`` checks it with hypothesis against the ``crc32c`` package).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Final

import numpy as np
import numpy.typing as npt
from crc32c import crc32c

from tidelog.log.crcs import Int64Array, UInt32Array

TAIL_START: Final = 4
"""The CRC covers a record from its byte 4: the header after its own CRC field."""
TAIL_SIZE: Final = 32
"""Bytes of the fixed header the CRC covers (36 - 4)."""


@cache
def _position_tables() -> tuple[int, UInt32Array]:
    """CRC-32C of ``TAIL_SIZE`` zero bytes, and for every byte position j of a tail and byte
    value b the linear part ``raw``: crc(zeros with b at j) ^ crc(zeros)."""
    zero = crc32c(bytes(TAIL_SIZE))
    tables = np.empty((TAIL_SIZE, 256), dtype=np.uint32)
    message = bytearray(TAIL_SIZE)
    for j in range(TAIL_SIZE):
        for b in range(256):
            message[j] = b
            tables[j, b] = crc32c(message) ^ zero
        message[j] = 0
    return zero, tables


def tail_crcs(header: npt.NDArray[np.void]) -> UInt32Array:
    """CRC-32C of bytes [4, 36) of every record header in ``header`` (a contiguous array of n > 0
    36-byte headers, ``record.HEADER_DTYPE``)."""
    words = header.view("<u4").reshape(len(header), 9)[:, 1:]  # the tails as 8 words each
    first = words[0]
    differ = words ^ first
    columns = np.flatnonzero(np.bitwise_or.reduce(differ, axis=0).view(np.uint8)).tolist()
    result = np.full(len(words), crc32c(first.tobytes()), dtype=np.uint32)
    if columns:
        _, tables = _position_tables()
        differ_bytes = differ.view(np.uint8)
        for j in columns:
            result ^= tables[j].take(differ_bytes[:, j])
    return result


OFFSET_IN_TAIL: Final = 4
"""Where a record's offset (8 bytes, little-endian) lies in its header tail (header byte 8)."""


def offset_tail_crcs(tail: bytes, offsets: Int64Array) -> UInt32Array:
    """CRC-32C of ``len(offsets)`` header tails that are ``tail`` (32 bytes, holding
    ``offsets[0]``) but for their offset field, which holds ``offsets[i]``.

    The tails of a batch of plain values of one size differ in nothing else, so the columns to
    look up are the offset's bytes in which some offset differs from the first (found from the
    offsets alone, without building or scanning the tails): usually two or three."""
    differ = offsets.astype("<i8", copy=False) ^ offsets[0]
    mask = int(np.bitwise_or.reduce(differ)) if len(differ) else 0
    result = np.full(len(offsets), crc32c(tail), dtype=np.uint32)
    if mask:
        _, tables = _position_tables()
        columns = differ.view(np.uint8).reshape(len(offsets), 8)
        for j in range(8):
            if (mask >> (8 * j)) & 0xFF:
                result ^= tables[OFFSET_IN_TAIL + j].take(columns[:, j])
    return result


def continued_crcs(seeds: UInt32Array, bodies: Iterable[object]) -> UInt32Array:
    """``crc32c(bodies[i], seeds[i])`` for every i: one C call per body, on the body itself.
    Raises ``TypeError`` for a body that is not a contiguous bytes-like object."""
    return np.fromiter(
        map(crc32c, bodies, seeds.tolist()),  # type: ignore[arg-type]
        dtype=np.uint32,
        count=len(seeds),
    )
