"""Consumer cursors kept in the internal stream ``__cursors``.

A cursor is an opaque offset a consumer stores under ``(cursor id, stream, partition)``. Each
``set`` appends one record keyed ``<cursor id>,<stream>,<partition>`` (value: the offset, 8
bytes big-endian) to the cursor partition chosen by CRC-32 (IEEE) of the key, as Liftbridge does.
``fetch`` answers from each cursor partition's :class:`CursorIndex` (the latest record per key,
materialised from the partition and restored at start), so its cost does not depend on how many
updates the partition holds, for a known or an unknown cursor. The value is treated as opaque:
clients differ on whether they store the last offset processed or the next one.

Bounds. Every update stores its key again and the index keeps every key in memory, so a set is
refused before anything is written when its cursor id is empty or longer than
``MAX_CURSOR_ID_BYTES`` (``InvalidArgument``), when its stream or partition does not exist
(``StreamNotFound``, ``PartitionNotFound``: a cursor names a partition that can be read), and
when it would give its stream more than ``max_cursors_per_stream`` cursor ids (``LimitReached``).
The ids per stream are counted from the indexes at restore and kept up to date by each set.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Final

from tidelog.broker.config import DEFAULT_MAX_CURSORS_PER_STREAM, MAX_CURSOR_ID_BYTES
from tidelog.broker.cursor_index import VALUE, CursorIndex, write_snapshot
from tidelog.broker.partition import Partition
from tidelog.broker.stream import Stream
from tidelog.errors import InvalidArgument, LimitReached, echo
from tidelog.log import NewRecord

NO_CURSOR: Final = -1


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


def split_key(key: bytes) -> tuple[str, str] | None:
    """(cursor id, stream) of a key (a cursor id may hold commas; a stream name never does);
    None for a key no set wrote."""
    parts = key.decode(errors="replace").rsplit(",", 2)
    return (parts[0], parts[1]) if len(parts) == 3 else None


def _no_check(stream: str, partition: int) -> None:
    return None


class CursorStore:
    def __init__(
        self,
        stream: Stream,
        resume: Callable[[Partition], None],
        *,
        check_target: Callable[[str, int], None] = _no_check,
        max_per_stream: int = DEFAULT_MAX_CURSORS_PER_STREAM,
    ) -> None:
        """``check_target(stream, partition)`` raises ``StreamNotFound`` or
        ``PartitionNotFound`` when a cursor may not name that partition (the broker's, which
        knows a cluster's streams too)."""
        self.stream = stream
        self._resume = resume
        """The broker's resume (honours ``resume_all``, saves the stream's metadata)."""
        self._check_target = check_target
        self.max_per_stream = max_per_stream
        self._indexes: dict[int, CursorIndex] = {}
        self._in_flight = 0
        self._ids: dict[str, set[str]] = {}
        """Stream -> the cursor ids it has (``max_per_stream`` bounds each set)."""
        self._unstored: dict[tuple[str, str], int] = {}
        """(stream, id) counted in ``_ids`` while no set of it has stored anything yet -> the
        sets of it in flight. The id leaves ``_ids`` when the last of them fails, and this map
        when one stores: so two first sets at once count it once, whichever fails."""

    def _count_ids(self) -> None:
        ids: dict[str, set[str]] = {}
        for index in self._indexes.values():
            for key in index.entries:
                found = split_key(key)
                if found is not None:
                    ids.setdefault(found[1], set()).add(found[0])
        self._ids = ids

    def cursor_ids(self, stream: str) -> int:
        """How many cursor ids ``stream`` has."""
        return len(self._ids.get(stream, ()))

    def restore(self) -> None:
        """Materialise every cursor partition's index (snapshot plus the records after it)."""
        for partition in self.stream.partitions:
            if partition.paused:
                self._resume(partition)
            self._indexes[partition.number] = CursorIndex.restore(
                partition.log, partition.directory
            )
        self._count_ids()

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

    def partition_of(self, cursor_id: str, stream: str, partition: int) -> int:
        """The cursor partition that holds the cursor (in a cluster, whose leader takes its
        sets and fetches)."""
        return self._partition_for(cursor_key(cursor_id, stream, partition))

    def rebuild(self, number: int) -> int:
        """Rebuild partition ``number``'s index from its whole log (a replica that has just
        become its leader; followers' indexes do not follow the records they copy). Runs on the
        event loop, so no set interleaves; returns the records read."""
        index = CursorIndex.rebuild(self.stream.partitions[number].log)
        self._indexes[number] = index
        self._count_ids()
        return index.replayed

    @staticmethod
    def _check(cursor_id: str, stream: str) -> None:
        if not cursor_id:
            raise InvalidArgument("cursor id must not be empty")
        size = len(cursor_id.encode(errors="replace"))
        if size > MAX_CURSOR_ID_BYTES:
            raise InvalidArgument(
                f"cursor id {echo(cursor_id, 40)} is {size} bytes: at most "
                f"{MAX_CURSOR_ID_BYTES} (UTF-8)"
            )
        if not stream:
            raise InvalidArgument("cursor stream must not be empty")

    def _count_new(self, cursor_id: str, stream: str) -> bool:
        """Count ``cursor_id`` for ``stream``; True when no set of it has stored anything yet
        (the caller settles it with :meth:`_settle`). ``LimitReached`` when the stream has all
        the ids it may have."""
        ids = self._ids.setdefault(stream, set())
        if cursor_id in ids:
            pending = self._unstored.get((stream, cursor_id))
            if pending is None:
                return False
            self._unstored[(stream, cursor_id)] = pending + 1
            return True
        if len(ids) >= self.max_per_stream:
            raise LimitReached(
                "max_cursors_per_stream",
                f"stream {echo(stream)} has {len(ids)} cursor ids, the most it may have: reuse "
                f"an id, or raise the limit",
            )
        ids.add(cursor_id)
        self._unstored[(stream, cursor_id)] = 1
        return True

    def _settle(self, cursor_id: str, stream: str, *, stored: bool) -> None:
        """One set of an id :meth:`_count_new` counted as unstored ended."""
        key = (stream, cursor_id)
        pending = self._unstored.get(key)
        if pending is None:  # another set of it stored it
            return
        if stored:
            del self._unstored[key]
        elif pending > 1:
            self._unstored[key] = pending - 1
        else:
            del self._unstored[key]
            self._ids.get(stream, set()).discard(cursor_id)

    async def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        self._check(cursor_id, stream)
        self._check_target(stream, partition)  # nothing is stored for what does not exist
        key = cursor_key(cursor_id, stream, partition)
        number = self._partition_for(key)
        target = self.stream.partition(number)
        if target.paused:
            self._resume(target)
        value = VALUE.pack(offset)
        new = self._count_new(cursor_id, stream)
        self._in_flight += 1
        try:
            stored = await target.publish([NewRecord(value, key=key)], durable=True)
            # Concurrent sets finish their syncs in any order: the index keeps the record
            # appended last, as a restart would.
            self._indexes[number].apply(stored.offsets.start, key, value)
        except BaseException:
            if new:
                self._settle(cursor_id, stream, stored=False)
            raise
        else:
            if new:
                self._settle(cursor_id, stream, stored=True)
        finally:
            self._in_flight -= 1

    async def fetch(self, cursor_id: str, stream: str, partition: int) -> int:
        """The stored value, or -1 for a cursor never set: one dictionary lookup either way."""
        found = await self.stored(cursor_id, stream, partition)
        return NO_CURSOR if found is None else found

    async def stored(self, cursor_id: str, stream: str, partition: int) -> int | None:
        """The stored value, or None for a cursor never set (:meth:`fetch` answers -1 for both
        that and a cursor set to -1; the Kafka front, whose -1 means "no offset", needs them
        apart)."""
        self._check(cursor_id, stream)
        key = cursor_key(cursor_id, stream, partition)
        number = self._partition_for(key)
        role = self.stream.partitions[number].role
        if role is not None:
            role.check_read(False)  # in a cluster only the leader's index follows the records
        return self._indexes[number].get(key)
