"""The RocksDB byte layout of composite keys: order-preserving and prefix-free.

A composite ``(key, t1, t2)`` is stored as::

    escape(key) 0x00 0x00 | t1: 8 bytes | t2: 8 bytes

``escape`` writes each 0x00 of the key as 0x00 0xFF and leaves other bytes alone; the 0x00 0x00
terminator is then the first 0x00 0x00 in the string. Comparing encodings byte by byte compares
keys first, by unsigned bytes, because the terminator sorts below both an escaped 0x00
(0x00 0xFF) and any other byte: ``b"a"`` (``61 00 00``) sorts before ``b"a\\x00"``
(``61 00 FF 00 00``) and before ``b"ab"``, and no key's entries can interleave another's.
Times are big-endian with the sign bit flipped (``t + 2**63`` as unsigned), so negative times
sort before positive ones. Window stores put the insertion sequence in ``t2``, session stores
the start (``t1`` is the end).
"""

from __future__ import annotations

import struct

from tidelog.store._base import TIME_MAX, TIME_MIN
from tidelog.store._composite import Composite

_TWO_TIMES = struct.Struct(">QQ")
_TIME = struct.Struct(">Q")
_BIAS = 1 << 63
_TERMINATOR = b"\x00\x00"


def encode_key(key: bytes) -> bytes:
    """The escaped, terminated key: the prefix shared by all of ``key``'s entries."""
    return key.replace(b"\x00", b"\x00\xff") + _TERMINATOR


def after_encoded_key(encoded: bytes) -> bytes:
    """The smallest byte string above every entry of the key encoded as ``encoded``."""
    return encoded[:-1] + b"\x01"


def encode_time(t: int) -> bytes:
    return _TIME.pack(t + _BIAS)


def encode_composite(composite: Composite) -> bytes:
    """Encode an entry key or a seek target; a ``t1`` outside the time range (the targets of
    ``before_key``/``after_key``) becomes the key's prefix or the string right after its
    entries."""
    key, t1, t2 = composite
    encoded = encode_key(key)
    if t1 < TIME_MIN:
        return encoded
    if t1 > TIME_MAX:
        return after_encoded_key(encoded)
    return encoded + _TWO_TIMES.pack(t1 + _BIAS, t2 + _BIAS)


def decode_composite(raw: bytes) -> Composite:
    end = raw.find(_TERMINATOR)
    key = raw[:end].replace(b"\x00\xff", b"\x00")
    t1, t2 = _TWO_TIMES.unpack_from(raw, end + 2)
    return key, t1 - _BIAS, t2 - _BIAS
