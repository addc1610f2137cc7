"""The tag index's snapshot file: the index in a compact binary form, checked whole on read.

``<data_dir>/sites_tag_index.bin``, replaced atomically (``tidelog.durable.replace_bytes``), so a
crash leaves the old snapshot or the new one. The send queue restores it at open and reads only
the records after its ``covers`` offset (``send_queue.py``); a file that is missing, does not
decode, or does not fit the queue is ignored and the index rebuilt from the whole queue.

Layout (little-endian): magic ``TLTI``, version u8 ``1``, ``covers`` i64, ``oldest`` i64,
``base`` i64 (below it, which sites trimmed records were for is unknown), site count u16; per
site: its number u8, its ``since`` i64 (the registry's, when written: a number taken since by
another site shows as another ``since``), the newest of its records trimmed since ``base`` i64
(-1: none), record count u32, then the record offsets and the running totals, i64 each; last,
the CRC32 of everything before it, u32. Sans-IO.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import Final

import numpy as np

from tidelog.sites.tag_index import TagIndex

TAG_INDEX_FILE: Final = "sites_tag_index.bin"
_MAGIC: Final = b"TLTI"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<4sBqqqH")
_SITE: Final = struct.Struct("<BqqI")
_CRC: Final = struct.Struct("<I")


def encode(index: TagIndex, since: Mapping[int, int]) -> bytes:
    """``index`` as bytes; ``since``: site number -> that site's ``since`` offset (every number
    the index lists must be there)."""
    snapshot = index.snapshot()
    sites = snapshot["sites"]
    lost = snapshot["lost"]
    parts = [
        _HEADER.pack(
            _MAGIC, _VERSION, snapshot["covers"], snapshot["oldest"], snapshot["base"], len(sites)
        )
    ]
    for key in sorted(sites, key=int):
        offsets, totals = sites[key], snapshot["totals"][key]
        parts.append(_SITE.pack(int(key), since[int(key)], lost.get(key, -1), len(offsets)))
        parts.append(np.asarray(offsets, dtype="<i8").tobytes())
        parts.append(np.asarray(totals, dtype="<i8").tobytes())
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> tuple[TagIndex, dict[int, int]]:
    """The index and each listed site's ``since``; raises ``ValueError`` for anything that is not
    a whole, intact snapshot of this version."""
    if len(data) < _HEADER.size + _CRC.size:
        raise ValueError("tag index snapshot: too short")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    if zlib.crc32(body) != crc:
        raise ValueError("tag index snapshot: checksum mismatch")
    magic, version, covers, oldest, base, count = _HEADER.unpack_from(body)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"tag index snapshot: not a version {_VERSION} snapshot")
    at = _HEADER.size
    sites: dict[str, list[int]] = {}
    totals: dict[str, list[int]] = {}
    since: dict[int, int] = {}
    lost: dict[str, int] = {}
    for _ in range(count):
        if at + _SITE.size > len(body):
            raise ValueError("tag index snapshot: truncated")
        number, site_since, site_lost, records = _SITE.unpack_from(body, at)
        at += _SITE.size
        end = at + 16 * records
        if end > len(body):
            raise ValueError("tag index snapshot: truncated")
        listed = np.frombuffer(body, dtype="<i8", count=records, offset=at)
        running = np.frombuffer(body, dtype="<i8", count=records, offset=at + 8 * records)
        if records and (int(listed[-1]) > covers or int(listed[0]) < 0):
            raise ValueError(f"tag index snapshot: site {number} lists records beyond covers")
        if records and (int(running[0]) <= 0 or bool((np.diff(running) <= 0).any())):
            raise ValueError(f"tag index snapshot: site {number} has totals that do not grow")
        sites[str(number)], totals[str(number)] = listed.tolist(), running.tolist()
        since[number] = site_since
        if site_lost >= 0:
            lost[str(number)] = site_lost
        at = end
    if at != len(body):
        raise ValueError("tag index snapshot: trailing bytes")
    index = TagIndex.restore(
        {
            "covers": covers,
            "oldest": oldest,
            "base": base,
            "lost": lost,
            "sites": sites,
            "totals": totals,
        }
    )
    return index, since
