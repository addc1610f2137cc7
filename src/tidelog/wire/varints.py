"""Protobuf's unsigned varint, for the encoders that lay out messages themselves.

Shared by the api's frame encoders (``tidelog.api.framed``) and the cluster's replication
responses (``tidelog.cluster.serving``): both write a length or a number as protobuf would,
7 bits a byte, low group first. Invariant: the bytes equal what protobuf writes for the same
value in a uint64/int64/int32 field (a negative number is its 64-bit two's complement).
"""

from __future__ import annotations


def uvarint(value: int) -> bytes:
    """One protobuf varint: ``value`` as an unsigned 64-bit number (a negative int64 or int32 is
    its two's complement, 10 bytes)."""
    if 0 <= value < 0x4000:  # the lengths of a live frame's fields: one or two bytes, no loop
        return bytes((value,)) if value < 0x80 else bytes(((value & 0x7F) | 0x80, value >> 7))
    raw = value & 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)
