"""The sink side: entries from other sites applied exactly once into receive queues.

Each (client name, source site) has a receive queue, the internal stream
``__lrq_recv.<client>.<source>``; its records are the payloads, each with a ``__position``
header (the entry's position in the source's delta queue, 8 bytes big-endian). Batches from a
source go through that source's :class:`~tidelog.sites.windows.ApplyWindow`: applied when
nothing is missing before them, early ones kept, duplicates dropped.

Exactly once. Entries are applied in position order, consecutive entries of one client as one
append, and each append is synced before the next (``durable``), so what is on disk is always a
prefix of the source's order. The receive queues are therefore the sink's progress: at open,
the last position applied from a source is the highest ``__position`` among its receive queues'
newest records, and everything before it was applied. An ack is sent only for what is synced. A
failed append (a full disk) resets the source's window to what the queues hold, so the source's
resend fills the gap and nothing is applied twice.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from tidelog.broker import Broker, NewRecord, Stream, StreamConfig
from tidelog.errors import InvalidArgument, echo
from tidelog.sites.envelope import RoutedEntry
from tidelog.sites.negotiation import NONE
from tidelog.sites.registry import validate_site_id
from tidelog.sites.windows import ApplyWindow, Framed
from tidelog.wire import POSITION_HEADER, RECEIVE_QUEUE_PREFIX

_POSITION = struct.Struct(">q")


def receive_queue(client: str, source: str) -> str:
    return f"{RECEIVE_QUEUE_PREFIX}{client}.{source}"


Batch = Framed[Sequence[RoutedEntry]]


class Sink:
    def __init__(self, broker: Broker, local_site: str) -> None:
        self.broker = broker
        self.local_site = validate_site_id(local_site)
        self._windows: dict[str, ApplyWindow[Sequence[RoutedEntry]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        """One apply at a time per source: two streams from one source (a reconnect while the
        old stream lingers) must not interleave their appends."""

    def last_processed(self, source: str) -> int:
        """The position of the last entry applied from ``source`` (``NONE``: nothing yet)."""
        return self._window(source).last_applied

    def _window(self, source: str) -> ApplyWindow[Sequence[RoutedEntry]]:
        window = self._windows.get(source)
        if window is None:
            window = self._windows[source] = ApplyWindow(self._recovered(source))
        return window

    def _recovered(self, source: str) -> int:
        """The highest position held by ``source``'s receive queues (reads one record each)."""
        last = NONE
        for stream in self._queues_of(source):
            log = stream.partitions[0].log
            if log.high_watermark < 0:
                continue
            for batch in log.reverse_reader(log.high_watermark, stop_offset=log.high_watermark):
                for headers in batch.headers():
                    found = headers.get(POSITION_HEADER)
                    if found is not None:
                        last = max(last, _POSITION.unpack(found)[0])
        return last

    def _queues_of(self, source: str) -> list[Stream]:
        suffix = f".{source}"
        return [
            s
            for s in self.broker.list_streams()
            if s.name.startswith(RECEIVE_QUEUE_PREFIX) and s.name.endswith(suffix)
        ]

    async def receive(self, source: str, batch: Batch) -> int:
        """Apply what ``batch`` brings from ``source``, exactly once; returns the cumulative ack
        (the last position applied and synced)."""
        _check(source, self.local_site, batch)
        async with self._locks.setdefault(source, asyncio.Lock()):
            window = self._window(source)
            try:
                for ready in window.offer(batch):
                    fresh = [e for e in ready.batch.entries if e.position > ready.skip_through]
                    await self._apply(source, fresh)
            except BaseException:
                # The window counted the batch applied; the queues say what really is.
                self._windows[source] = ApplyWindow(self._recovered(source), window.capacity)
                raise
            return window.last_applied

    async def _apply(self, source: str, entries: Sequence[RoutedEntry]) -> None:
        start = 0
        while start < len(entries):
            client = entries[start].client
            end = start
            while end < len(entries) and entries[end].client == client:
                end += 1
            stream = self.broker.internal_stream(
                receive_queue(client, source), StreamConfig(partitions=1)
            )
            records = [
                NewRecord(e.payload, headers={POSITION_HEADER: _POSITION.pack(e.position)})
                for e in entries[start:end]
            ]
            await stream.partitions[0].publish(records, durable=True)
            start = end


def _check(source: str, local_site: str, batch: Batch) -> None:
    validate_site_id(source)
    if source == local_site:
        raise InvalidArgument(f"{echo(source)} is this site: a site does not replicate to itself")
    previous = batch.prev
    for entry in batch.entries:
        if entry.position <= previous:
            raise InvalidArgument(
                f"entries of a batch must follow ({batch.prev}, {batch.current}] in order; "
                f"got position {entry.position} after {previous}"
            )
        validate_site_id(entry.client)
        previous = entry.position
    if not batch.entries or previous != batch.current:
        raise InvalidArgument(
            f"a batch ({batch.prev}, {batch.current}] must end with the entry at {batch.current}"
        )
