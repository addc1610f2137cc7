"""Consumer cursors kept in the internal stream ``__cursors``.

A cursor is an opaque offset a consumer stores under ``(cursor id, stream, partition)``. Each
``set`` appends one record keyed ``<cursor id>,<stream>,<partition>`` (value: the offset, 8
bytes big-endian) to the cursor partition chosen by CRC-32 (IEEE) of the key, as Liftbridge does.
``fetch`` answers from a cache kept by this broker (write-through on ``set``, negative entries
too); on a miss it reads the cursor partition backwards and stops at the newest record for the
key, in a thread. The value is treated as opaque: clients differ on whether they store the last
offset processed or the next one.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from typing import Final

from tidelog.broker.partition import Partition
from tidelog.broker.stream import Stream
from tidelog.errors import InvalidArgument
from tidelog.log import Message, SegmentedLog

_VALUE: Final = struct.Struct(">q")
NO_CURSOR: Final = -1


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


def _scan_backwards(log: SegmentedLog, key: bytes) -> tuple[int, int]:
    """(offset of the newest record for ``key``, its value), or (-1, -1) when there is none."""
    for batch in log.reverse_reader():
        for record_offset, found, value in zip(
            batch.offsets.tolist(), batch.keys(), batch.values(), strict=True
        ):
            if found == key and len(value) == _VALUE.size:
                return record_offset, int(_VALUE.unpack(value)[0])
    return -1, NO_CURSOR


class CursorStore:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        # key -> (offset of the record that stored it, value): concurrent sets finish their
        # syncs in any order, and the record appended last must win, as it does after a restart.
        self._cache: dict[bytes, tuple[int, int]] = {}

    def _partition_for(self, key: bytes) -> int:
        return zlib.crc32(key) % len(self.stream.partitions)

    @staticmethod
    def _check(cursor_id: str, stream: str) -> None:
        if not cursor_id:
            raise InvalidArgument("cursor id must not be empty")
        if not stream:
            raise InvalidArgument("cursor stream must not be empty")

    async def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        self._check(cursor_id, stream)
        key = cursor_key(cursor_id, stream, partition)
        target = self.stream.partition(self._partition_for(key))
        if target.paused:
            self._resume(target)
        stored = await target.publish([Message(_VALUE.pack(offset), key=key)], durable=True)
        known = self._cache.get(key)
        if known is None or known[0] < stored.start:
            self._cache[key] = (stored.start, offset)

    async def fetch(self, cursor_id: str, stream: str, partition: int) -> int:
        self._check(cursor_id, stream)
        key = cursor_key(cursor_id, stream, partition)
        cached = self._cache.get(key)
        if cached is not None:
            return cached[1]
        target = self.stream.partition(self._partition_for(key))
        if target.paused:
            self._resume(target)
        position, offset = await asyncio.to_thread(_scan_backwards, target.log, key)
        # A set that finished during the scan is newer than anything the scan found.
        self._cache.setdefault(key, (position, offset))
        return self._cache[key][1]

    def _resume(self, partition: Partition) -> None:
        partition.resume()
        self.stream.save()
