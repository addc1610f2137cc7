"""The compression codecs of Kafka record batches, with a bound on what decompression produces.

A batch's ``attributes`` name its codec in the low three bits: 0 none, 1 gzip, 2 snappy, 3 lz4,
4 zstd (:class:`Codec`). The codec applies to the records part of the batch (everything after the
61-byte header). All four run in ``cramjam``, which releases the GIL while it works.

- **gzip**: one gzip member (RFC 1952), as Java's ``GZIPOutputStream`` and librdkafka write.
- **snappy**: Java and librdkafka producers frame it the way the xerial ``snappy-java`` library
  does: the 8-byte magic ``\\x82SNAPPY\\x00``, two big-endian int32 versions, then blocks, each a
  big-endian int32 length and one raw snappy block. Some clients send one raw snappy block
  instead; both are read (the magic decides), and batches are written xerial-framed, which every
  client reads.
- **lz4**: the LZ4 frame format with independent blocks (Kafka's reader refuses linked blocks).
- **zstd**: one zstd frame.

Invariant: :func:`decompress` never produces (nor allocates memory it touches for) more than
``max_bytes``: the output buffer is that size and the codec fails rather than grow it, so a small
batch that inflates to gigabytes (a decompression bomb) costs nothing. A failure, whether the
data is corrupt or inflates beyond the bound, is :class:`InvalidRecord`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

import cramjam
import numpy as np

from tidelog.kafka.errors import InvalidRecord, UnsupportedCompression


class Codec(IntEnum):
    """A record batch's compression (``attributes & 0x07``)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_VERSION: Final = 1
_BLOCK_LEN: Final = struct.Struct(">i")
XERIAL_BLOCK: Final = 32 * 1024
"""Uncompressed bytes per xerial block written (snappy-java's default block size)."""


def codec_of(attributes: int) -> Codec:
    """The codec a batch's attributes name; :class:`UnsupportedCompression` for 5..7."""
    value = attributes & 0x07
    try:
        return Codec(value)
    except ValueError:
        raise UnsupportedCompression(
            f"record batch compression codec {value} is not one Kafka defines (0 none, 1 gzip, "
            f"2 snappy, 3 lz4, 4 zstd): produce with one of those"
        ) from None


def compress(codec: Codec, data: bytes | memoryview) -> bytes:
    """``data`` compressed with ``codec`` in the framing Kafka clients read."""
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec is Codec.SNAPPY:
        return _xerial_compress(memoryview(data))
    if codec is Codec.LZ4:
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    return bytes(cramjam.zstd.compress(data))


def _xerial_compress(data: memoryview) -> bytes:
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, _XERIAL_VERSION, _XERIAL_VERSION)]
    for start in range(0, len(data), XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + XERIAL_BLOCK]))
        parts += (_BLOCK_LEN.pack(len(block)), block)
    return b"".join(parts)


def decompress(codec: Codec, data: bytes | memoryview, max_bytes: int) -> bytes:
    """``data`` decompressed; :class:`InvalidRecord` if it is not valid ``codec`` data or would
    decompress to more than ``max_bytes``."""
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.SNAPPY:
        return _snappy_decompress(memoryview(data), max_bytes)
    # np.empty of a large size maps pages without touching them: only what is written costs.
    out = np.empty(max_bytes, dtype=np.uint8)
    function = {
        Codec.GZIP: cramjam.gzip.decompress_into,
        Codec.LZ4: cramjam.lz4.decompress_into,
        Codec.ZSTD: cramjam.zstd.decompress_into,
    }[codec]
    try:
        size = int(function(data, out.data))
    except cramjam.DecompressionError as error:
        raise _undecodable(codec, max_bytes, error) from None
    return out[:size].tobytes()


def _undecodable(codec: Codec, max_bytes: int, error: Exception) -> InvalidRecord:
    return InvalidRecord(
        f"the records of a {codec.name.lower()} batch do not decompress within {max_bytes} bytes "
        f"({error}): the data is corrupt or inflates beyond the limit; send smaller batches"
    )


def _snappy_decompress(data: memoryview, max_bytes: int) -> bytes:
    if bytes(data[:8]) != XERIAL_MAGIC:
        blocks = [data]
    else:
        blocks = []
        at = _XERIAL_HEADER.size
        if len(data) < at:
            raise InvalidRecord("a snappy (xerial) batch ends inside its 16-byte header")
        while at < len(data):
            if at + 4 > len(data):
                raise InvalidRecord(f"a snappy (xerial) block length at byte {at} is cut short")
            (size,) = _BLOCK_LEN.unpack_from(data, at)
            at += 4
            if size < 0 or at + size > len(data):
                raise InvalidRecord(
                    f"a snappy (xerial) block at byte {at} claims {size} bytes; "
                    f"{len(data) - at} remain"
                )
            blocks.append(data[at : at + size])
            at += size
    try:
        sizes = [int(cramjam.snappy.decompress_raw_len(block)) for block in blocks]
    except cramjam.DecompressionError as error:
        raise _undecodable(Codec.SNAPPY, max_bytes, error) from None
    total = sum(sizes)
    if total > max_bytes:
        raise InvalidRecord(
            f"the records of a snappy batch would decompress to {total} bytes, over the limit "
            f"of {max_bytes}: send smaller batches"
        )
    out = np.empty(total, dtype=np.uint8)
    at = 0
    try:
        for block, size in zip(blocks, sizes, strict=True):
            written = int(cramjam.snappy.decompress_raw_into(block, out[at : at + size].data))
            if written != size:
                raise InvalidRecord(
                    f"a snappy block declared {size} bytes but decompressed to {written}"
                )
            at += size
    except cramjam.DecompressionError as error:
        raise _undecodable(Codec.SNAPPY, max_bytes, error) from None
    return out.tobytes()
