"""The stored record's fixed header, and the encoders that lay whole batches out by it.

One record, little-endian (``docs/format.md`` has the byte table)::

    0  crc32c    u32   CRC-32C (Castagnoli) of bytes [4, size) of this record
    4  size      u32   the whole record, header included
    8  offset    i64   absolute offset
    16 timestamp i64   broker time, ns since the Unix epoch
    24 magic     u8    format version, 1
    25 attrs     u8    bit 0 (CONTINUES): set on every record of an atomic batch but its last;
                       bits 1-7 reserved, 0
    26 hcount    u16   number of headers
    28 keylen    i32   key length, -1 for no key
    32 vallen    i32   value length
    36 key, value, then hcount headers: u16 name length, UTF-8 name, u32 value length, value

Invariants: ``size == 36 + max(keylen, 0) + vallen + len(headers)``; the CRC covers the offset, so a
record copied to the wrong place fails its check.

Theory of operation. ``record.encode_batch`` chooses how a batch is laid out and calls the pieces
here, which only lay bytes out (the bodies are given ready): :func:`header_rows` builds a batch's
headers as one numpy array (the fields the records share set once, the others column by column);
:func:`encode_small` packs a handful of records one by one with ``struct`` (numpy's fixed cost
per call outweighs its savings there); and the one-size path (:func:`one_size` tells a batch of
plain ``bytes`` of one length, :func:`encode_one_size` lays it out as one 2-D array) is the
log's fastest append. Every path lays the records out with a zero CRC field and then fills every
record's CRC field in one native pass over the laid-out bytes (``crcs.stamp_crcs``), so a stored
CRC is always of the bytes written. Each gives the same bytes as the others for the same records.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from operator import countOf
from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog.errors import MessageTooLarge
from tidelog.log.crcs import stamp_crcs

MAGIC: Final = 1
HEADER_SIZE: Final = 36
CONTINUES: Final = 0x01
"""``attrs`` bit: more records of the same atomic batch follow this one."""

HEADER_DTYPE: Final = np.dtype(
    [
        ("crc", "<u4"),
        ("size", "<u4"),
        ("offset", "<i8"),
        ("timestamp", "<i8"),
        ("magic", "u1"),
        ("attrs", "u1"),
        ("hcount", "<u2"),
        ("keylen", "<i4"),
        ("vallen", "<i4"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_SIZE

HEADER_STRUCT: Final = struct.Struct("<IIqqBBHii")
"""The whole fixed header, field by field (``scan_records`` reads it record by record)."""
_HEADER_TAIL: Final = struct.Struct("<IqqBBHii")  # the header after its CRC field
_NO_CRC: Final = bytes(4)  # a record's CRC field until the batch's CRCs are stamped

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Records ready to be written: ``data`` holds them back to back, ``sizes[i]`` bytes each."""

    data: npt.NDArray[np.uint8]
    offsets: Int64Array
    sizes: Int64Array
    timestamp: int


def one_size(messages: Sequence[object]) -> int:
    """The length of every value if ``messages`` (n > 0) are all plain ``bytes`` of one length
    (exactly ``bytes``: immutable, so a checksum taken of them is of what is written), else -1.

    Two C-level passes, no array: counting the ``bytes`` among the types, then the values of the
    first one's length (cheaper than collecting the lengths). A batch whose first and last values
    differ in length is told at once."""
    if not isinstance(messages, list | tuple):
        return -1
    first, last = messages[0], messages[-1]
    if type(first) is not bytes or type(last) is not bytes or len(first) != len(last):
        return -1
    n = len(messages)
    if countOf(map(type, messages), bytes) != n:
        return -1
    size = len(first)
    return size if countOf(map(len, messages), size) == n else -1


def encode_one_size(
    values: Sequence[bytes],
    size: int,
    offsets: Int64Array,
    timestamp: int,
    max_message_bytes: int,
    atomic: bool,
) -> EncodedBatch:
    """``encode_batch`` for n > 0 plain ``bytes`` values of ``size`` bytes each: the batch is one
    2-D array (a row per record) whose header columns are filled from one header row, then the
    offsets, then the values; the CRCs last, in one pass over the array."""
    if size > max_message_bytes:
        raise MessageTooLarge(size, max_message_bytes, 0)
    n = len(values)
    width = HEADER_SIZE + size
    attrs = CONTINUES if atomic else 0
    first = HEADER_STRUCT.pack(0, width, int(offsets[0]), timestamp, MAGIC, attrs, 0, -1, size)
    grid = np.empty((n, width), dtype=np.uint8)
    grid[:, :HEADER_SIZE] = np.frombuffer(first, dtype=np.uint8)
    header: npt.NDArray[np.void] = np.ndarray(
        (n,), dtype=HEADER_DTYPE, buffer=grid, strides=(width,)
    )
    header["offset"] = offsets
    if atomic:  # the last record of an atomic batch has no CONTINUES
        header["attrs"][-1] = 0
    grid[:, HEADER_SIZE:] = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(n, size)
    flat = grid.reshape(-1)
    sizes = np.full(n, width, dtype=np.int64)
    stamp_crcs(flat, np.arange(0, n * width, width, dtype=np.int64), sizes)
    return EncodedBatch(flat, offsets, sizes, timestamp)


def header_rows(
    offsets: Int64Array,
    timestamp: int,
    sizes: Int64Array | int,
    vallens: Int64Array | int,
    keylens: Int64Array | int,
    hcounts: Int64Array | int,
    atomic: bool,
) -> npt.NDArray[np.void]:
    """The batch's record headers (CRC field 0): one row with every field the records share
    (the ``int`` arguments) copied to all, then the fields that differ column by column."""
    row = np.zeros((), dtype=HEADER_DTYPE)
    row["timestamp"] = timestamp
    row["magic"] = MAGIC
    columns = {"size": sizes, "keylen": keylens, "hcount": hcounts, "vallen": vallens}
    for name, column in list(columns.items()):
        if isinstance(column, int):
            row[name] = column
            del columns[name]
    header = np.empty(len(offsets), dtype=HEADER_DTYPE)
    header[...] = row
    header["offset"] = offsets
    for name, column in columns.items():
        header[name] = column
    if atomic:
        header["attrs"][:-1] = CONTINUES
    return header


def encode_small(
    bodies: Sequence[bytes],
    offsets: Int64Array,
    sizes: Int64Array,
    timestamp: int,
    vallens: Int64Array,
    keylens: Int64Array | int,
    hcounts: Int64Array | int,
    atomic: bool,
) -> EncodedBatch:
    """The same bytes as the vectorised path, packed record by record: for a handful of records
    numpy's fixed cost per call outweighs its per-record savings. The CRCs are taken in one
    native call over the packed bytes (cheaper than two ``crc32c`` calls per record even for
    one record)."""
    n = len(bodies)
    keys = [keylens] * n if isinstance(keylens, int) else keylens.tolist()
    counts = [hcounts] * n if isinstance(hcounts, int) else hcounts.tolist()
    attrs = [CONTINUES] * (n - 1) + [0] if atomic and n else [0] * n
    parts: list[bytes] = []
    positions = array("q")
    at = 0
    for offset, size, vallen, keylen, count, body, attr in zip(
        offsets.tolist(),
        sizes.tolist(),
        vallens.tolist(),
        keys,
        counts,
        bodies,
        attrs,
        strict=True,
    ):
        tail = _HEADER_TAIL.pack(size, offset, timestamp, MAGIC, attr, count, keylen, vallen)
        parts += (_NO_CRC, tail, body)
        positions.append(at)
        at += size
    data = np.frombuffer(bytearray().join(parts), dtype=np.uint8)
    stamp_crcs(data, positions, sizes)
    return EncodedBatch(data, offsets, sizes, timestamp)
