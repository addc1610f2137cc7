"""Consumer cursors kept in the internal stream ``__cursors``.

A cursor is an opaque offset a consumer stores under ``(cursor id, stream, partition)``. Each
``set`` appends one record keyed ``<cursor id>,<stream>,<partition>`` (value: the offset, 8
bytes big-endian) to the cursor partition chosen by CRC-32 (IEEE) of the key, as Liftbridge does.
``fetch`` answers from each cursor partition's :class:`CursorIndex` (the latest record per key,
materialised from the partition and restored at start), so its cost does not depend on how many
updates the partition holds, for a known or an unknown cursor. The value is treated as opaque:
clients differ on whether they store the last offset processed or the next one.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Final

from tidelog.broker.cursor_index import VALUE, CursorIndex, write_snapshot
from tidelog.broker.partition import Partition
from tidelog.broker.stream import Stream
from tidelog.errors import InvalidArgument
from tidelog.log import NewRecord

NO_CURSOR: Final = -1


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


class CursorStore:
    def __init__(self, stream: Stream, resume: Callable[[Partition], None]) -> None:
        self.stream = stream
        self._resume = resume
        """The broker's resume (honours ``resume_all``, saves the stream's metadata)."""
        self._indexes: dict[int, CursorIndex] = {}
        self._in_flight = 0

    def restore(self) -> None:
        """Materialise every cursor partition's index (snapshot plus the records after it)."""
        for partition in self.stream.partitions:
            if partition.paused:
                self._resume(partition)
            self._indexes[partition.number] = CursorIndex.restore(
                partition.log, partition.directory
            )

    async def save(self) -> None:
        """Snapshot the indexes that changed (on close and by maintenance).

        Skipped while a set is between its append and its index update: a snapshot then could
        claim an offset whose record it does not hold yet. The snapshot is taken on the event
        loop (which updates the index) and written in a thread.
        """
        if self._in_flight:
            return
        for number, index in self._indexes.items():
            data = index.snapshot()
            if data is not None:
                directory = self.stream.partitions[number].directory
                await asyncio.to_thread(write_snapshot, directory, data)

    def _partition_for(self, key: bytes) -> int:
        return zlib.crc32(key) % len(self.stream.partitions)

    def rebuild(self, number: int) -> int:
        """Rebuild partition ``number``'s index from its whole log (a replica that has just
        become its leader; followers' indexes do not follow the records they copy). Runs on the
        event loop, so no set interleaves; returns the records read."""
        index = CursorIndex.rebuild(self.stream.partitions[number].log)
        self._indexes[number] = index
        return index.replayed

    @staticmethod
    def _check(cursor_id: str, stream: str) -> None:
        if not cursor_id:
            raise InvalidArgument("cursor id must not be empty")
        if not stream:
            raise InvalidArgument("cursor stream must not be empty")

    async def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        self._check(cursor_id, stream)
        key = cursor_key(cursor_id, stream, partition)
        number = self._partition_for(key)
        target = self.stream.partition(number)
        if target.paused:
            self._resume(target)
        value = VALUE.pack(offset)
        self._in_flight += 1
        try:
            stored = await target.publish([NewRecord(value, key=key)], durable=True)
            # Concurrent sets finish their syncs in any order: the index keeps the record
            # appended last, as a restart would.
            self._indexes[number].apply(stored.offsets.start, key, value)
        finally:
            self._in_flight -= 1

    async def fetch(self, cursor_id: str, stream: str, partition: int) -> int:
        """The stored value, or -1 for a cursor never set: one dictionary lookup either way."""
        self._check(cursor_id, stream)
        key = cursor_key(cursor_id, stream, partition)
        number = self._partition_for(key)
        role = self.stream.partitions[number].role
        if role is not None:
            role.check_read(False)  # in a cluster only the leader's index follows the records
        found = self._indexes[number].get(key)
        return NO_CURSOR if found is None else found
