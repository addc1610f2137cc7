"""The sink side: entries from other sites applied exactly once into receive queues.

Each (client name, source site) has a receive queue, the internal stream
``__lrq_recv.<client>.<source>``; its records are the payloads, each with a ``__position``
header (the entry's position in the source's delta queue, 8 bytes big-endian). Batches from a
source go through that source's :class:`~tidelog.sites.windows.ApplyWindow`: applied when
nothing is missing before them, early ones kept, duplicates dropped. A window that holds nothing
from its source starts at the ``prev`` of the first delta batch of a stream, where the sender
starts (``windows.py``: a site declared after the source stored entries is sent none from before
its ``since``).

Exactly once. Entries are applied in position order, consecutive entries of one client as one
append (laid out as columns: ``HeaderedValues``, no object per entry), and each append is synced
before the next (``durable``), so what is on disk is always a prefix of the source's order. The
receive queues are therefore the sink's progress: at open, the last position applied from a
source is the highest ``__position`` among its receive queues' newest records, and everything
before it was applied. An ack is sent only for what is synced. A failed append (a full disk)
resets the source's window to what the queues hold, so the source's resend fills the gap and
nothing is applied twice. A batch that reaches further past what was applied than the window
can account for is refused whole (``PositionJump``, ``windows.py``): one forged entry far
ahead must not make the sink drop every real entry below it.

Snapshots. A snapshot from a source replaces what the sink application holds from it: its start
frame puts a ``snapshot_start`` record (``__kind`` header) in each of the source's receive queues,
its entries go to their clients' queues as ``snapshot_entry`` records (a client seen for the
first time gets its start record first), and its end frame puts a ``snapshot_end`` record in
every queue that got a start. Each of these records carries the snapshot's covered position as
its ``__position``, so a listener delivers start, entries, end, then the deltas after it. The
sink persists, per source, the snapshot it saw start and the one it applied whole, with its
covered position (the document ``sink`` of ``site_state.py``: ``sites_sink.json`` in the data
directory, replaced atomically, or a record of the cluster's ``__lrq_state``, before the ack):
negotiation reads them (``negotiation.py``). A transfer that broke leaves a start without
an end; the next negotiation asks for a new snapshot, whose start tells the listener to begin
again. Entries are written as they arrive, so *transferred* and *applied* are one step here.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Final

import numpy as np

from tidelog.broker import (
    Broker,
    HeaderedValues,
    NewRecord,
    Stream,
    StreamConfig,
)
from tidelog.errors import InvalidArgument, PositionJump, echo
from tidelog.sites.negotiation import NONE, SinkProgress
from tidelog.sites.registry import validate_site_id
from tidelog.sites.routed import RoutedColumns, RoutedEntry
from tidelog.sites.site_state import SINK, SiteFiles, SiteState
from tidelog.sites.windows import RECORD_POSITIONS, WINDOW_RECORDS, ApplyWindow, Framed
from tidelog.wire import KIND_HEADER, POSITION_HEADER, RECEIVE_QUEUE_PREFIX, SNAPSHOT_HEADER

_POSITION = struct.Struct(">q")
_POSITIONS = np.dtype(">i8")
START: Final = b"snapshot_start"
ENTRY: Final = b"snapshot_entry"
END: Final = b"snapshot_end"


@dataclass(frozen=True, slots=True)
class SnapshotFrame:
    """A piece of a snapshot as it arrives: the start, entries, or the end."""

    snapshot: int
    covered: int
    start: bool = False
    end: bool = False
    entries: Sequence[tuple[str, bytes]] = ()
    """(client name, payload)"""


@dataclass(slots=True)
class _Snapshots:
    """What the sink persisted about one source's snapshots."""

    started: int = NONE
    applied: int = NONE
    covered: int = NONE
    """The applied snapshot's covered position."""


@dataclass(slots=True)
class _Transfer:
    snapshot: int
    covered: int
    started: set[str] = field(default_factory=set)
    """Receive queues that got the start record."""


def receive_queue(client: str, source: str) -> str:
    return f"{RECEIVE_QUEUE_PREFIX}{client}.{source}"


Batch = Framed[Sequence[RoutedEntry]] | Framed[RoutedColumns]
"""A batch as it arrives: its entries as :class:`RoutedColumns` (the fast path, what the
service hands over) or any sequence of :class:`RoutedEntry`."""


StreamSource = Callable[[str, StreamConfig], Awaitable[Stream]]
"""Gives the internal stream of a name, created with the config if absent: the broker's own
(:func:`local_streams`), or a cluster's replicated one."""


def local_streams(broker: Broker) -> StreamSource:
    async def stream(name: str, config: StreamConfig) -> Stream:
        return broker.internal_stream(name, config)

    return stream


class Sink:
    def __init__(
        self,
        broker: Broker,
        local_site: str,
        *,
        state: SiteState | None = None,
        streams: StreamSource | None = None,
        max_jump: int = WINDOW_RECORDS * RECORD_POSITIONS,
    ) -> None:
        """``state``: where the snapshots' progress is kept (default: the broker's data
        directory); ``streams``: where the receive queues come from (default: the broker's
        own internal streams); ``max_jump``: how far past what it applied from a source a
        batch may reach (``windows.py``)."""
        self.broker = broker
        self.max_jump = max_jump
        self.local_site = validate_site_id(local_site)
        self._windows: dict[str, ApplyWindow[RoutedColumns]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        """One apply at a time per source: two streams from one source (a reconnect while the
        old stream lingers) must not interleave their appends."""
        self._streams = streams or local_streams(broker)
        self._state: SiteState = state or SiteFiles(broker.data_dir)
        self._snapshots = self._load()
        self._transfers: dict[str, _Transfer] = {}
        self._starts: dict[str, int] = {}
        """Source -> where its sender said it starts (the ``prev`` of its first batch on a
        stream, taken while nothing from it was applied): a window reopened after a failed
        append starts there again, not at ``NONE``."""

    def use_state(self, state: SiteState) -> None:
        """Keep the snapshots' progress in ``state`` from now on (and read it from there)."""
        self._state = state
        self._snapshots = self._load()
        self._windows.clear()
        self._starts.clear()

    def _load(self) -> dict[str, _Snapshots]:
        data = self._state.load(SINK) or {}
        return {source: _Snapshots(**fields) for source, fields in data.items()}

    async def _save(self, source: str, snapshots: _Snapshots) -> None:
        """Persist ``snapshots`` for ``source`` (the memory changes only once it is kept)."""
        data = {s: asdict(p) for s, p in self._snapshots.items()}
        data[source] = asdict(snapshots)
        await self._state.save(SINK, data)
        self._snapshots[source] = snapshots

    async def _queue(self, client: str, source: str) -> Stream:
        return await self._streams(receive_queue(client, source), StreamConfig(partitions=1))

    def last_processed(self, source: str) -> int:
        """The position of the last entry applied from ``source`` (``NONE``: nothing yet)."""
        return self._window(source).last_applied

    def progress(self, source: str) -> SinkProgress:
        """What negotiation needs to know about ``source``."""
        snapshots = self._snapshots.get(source, _Snapshots())
        return SinkProgress(
            snapshot_started=snapshots.started,
            snapshot_transferred=snapshots.applied,
            snapshot_applied=snapshots.applied,
            last_processed=self.last_processed(source),
        )

    def _window(self, source: str) -> ApplyWindow[RoutedColumns]:
        window = self._windows.get(source)
        if window is None:
            window = self._windows[source] = self._new_window(self._recovered(source))
        return window

    def _new_window(self, last_applied: int) -> ApplyWindow[RoutedColumns]:
        return ApplyWindow(last_applied, max_jump=self.max_jump)

    def _recovered(self, source: str) -> int:
        """The highest position held by ``source``'s receive queues (reads one record each),
        or the applied snapshot's covered position if higher."""
        snapshots = self._snapshots.get(source)
        last = snapshots.covered if snapshots is not None else NONE
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

    async def receive(self, source: str, batch: Batch, *, opening: bool = False) -> int:
        """Apply what ``batch`` brings from ``source``, exactly once; returns the cumulative ack
        (the last position applied and synced). ``opening``: the batch is the first delta batch
        of its stream, so its ``prev`` is where the sender starts; when nothing from ``source``
        is applied yet, the window starts there (``ApplyWindow.open_at``: a site declared after
        the source stored entries is sent none from before its ``since``)."""
        columns = Framed(batch.prev, batch.current, RoutedColumns.from_entries(batch.entries))
        _check(source, self.local_site, columns)
        async with self._locks.setdefault(source, asyncio.Lock()):
            window = self._window(source)
            if window.too_far(columns):
                raise PositionJump(source, columns.current, window.last_applied, self.max_jump)
            if opening and window.open_at(columns.prev):
                self._starts[source] = columns.prev
            try:
                for ready in window.offer(columns):
                    await self._apply(source, ready.batch.entries.after(ready.skip_through))
            except BaseException:
                # The window counted the batch applied; the queues say what really is.
                self._windows[source] = self._reopened(source, window.capacity)
                raise
            return window.last_applied

    def _reopened(self, source: str, capacity: int) -> ApplyWindow[RoutedColumns]:
        """A window at what the receive queues hold, or where the source's sender said it
        starts if they hold nothing from it yet."""
        window: ApplyWindow[RoutedColumns] = ApplyWindow(
            self._recovered(source), capacity, self.max_jump
        )
        start = self._starts.get(source)
        if start is not None:
            window.open_at(start)
        return window

    async def receive_snapshot(self, source: str, frame: SnapshotFrame) -> int | None:
        """Apply a piece of a snapshot from ``source``; at its end, the snapshot's id once it
        is applied whole and synced (None before)."""
        validate_site_id(source)
        if source == self.local_site:
            raise InvalidArgument(
                f"{echo(source)} is this site: a site does not replicate to itself"
            )
        for client, _ in frame.entries:
            validate_site_id(client)
        async with self._locks.setdefault(source, asyncio.Lock()):
            transfer = self._transfers.get(source)
            if frame.start:
                previous = self._snapshots.get(source, _Snapshots())
                await self._save(
                    source, _Snapshots(frame.snapshot, previous.applied, previous.covered)
                )
                transfer = self._transfers[source] = _Transfer(frame.snapshot, frame.covered)
                for stream in self._queues_of(source):
                    await self._mark(stream, transfer, START, durable=False)
            elif transfer is None or transfer.snapshot != frame.snapshot:
                raise InvalidArgument(
                    f"snapshot {frame.snapshot} was not started on this stream: a snapshot "
                    f"begins with its start frame"
                )
            await self._snapshot_entries(source, transfer, frame.entries)
            if not frame.end:
                return None
            for name in sorted(transfer.started):
                stream = await self._streams(name, StreamConfig(partitions=1))
                await self._mark(stream, transfer, END, durable=True)
            await self._save(
                source, _Snapshots(transfer.snapshot, transfer.snapshot, transfer.covered)
            )
            del self._transfers[source]
            self._windows[source] = self._new_window(transfer.covered)
            return transfer.snapshot

    async def _snapshot_entries(
        self, source: str, transfer: _Transfer, entries: Sequence[tuple[str, bytes]]
    ) -> None:
        by_client: dict[str, list[bytes]] = {}
        for client, payload in entries:
            by_client.setdefault(client, []).append(payload)
        headers = _marks(transfer, ENTRY)
        for client, payloads in by_client.items():
            stream = await self._queue(client, source)
            if stream.name not in transfer.started:
                await self._mark(stream, transfer, START, durable=False)
            await stream.partitions[0].publish([NewRecord(p, headers=headers) for p in payloads])

    async def _mark(
        self, stream: Stream, transfer: _Transfer, kind: bytes, *, durable: bool
    ) -> None:
        await stream.partitions[0].publish(
            [NewRecord(b"", headers=_marks(transfer, kind))], durable=durable
        )
        transfer.started.add(stream.name)

    async def _apply(self, source: str, entries: RoutedColumns) -> None:
        """One synced append per run of one client's entries, each payload with its
        ``__position`` header, laid out as columns."""
        for client, start, end in entries.runs():
            stream = await self._queue(client, source)
            blob, sizes = entries.span(start, end)
            positions = entries.positions[start:end].astype(_POSITIONS).tobytes()
            records = HeaderedValues(blob, sizes, POSITION_HEADER, positions, _POSITION.size)
            await stream.partitions[0].publish(records, durable=True)


def _marks(transfer: _Transfer, kind: bytes) -> dict[str, bytes]:
    return {
        POSITION_HEADER: _POSITION.pack(transfer.covered),
        KIND_HEADER: kind,
        SNAPSHOT_HEADER: _POSITION.pack(transfer.snapshot),
    }


def _check(source: str, local_site: str, batch: Framed[RoutedColumns]) -> None:
    validate_site_id(source)
    if source == local_site:
        raise InvalidArgument(f"{echo(source)} is this site: a site does not replicate to itself")
    entries = batch.entries
    try:
        entries.checked()
    except ValueError as error:
        raise InvalidArgument(f"a malformed delta batch: {error}") from None
    positions = entries.positions
    if len(positions):
        steps = np.diff(positions, prepend=batch.prev)
        if int(steps.min()) <= 0:
            at = int(np.argmax(steps <= 0))
            previous = batch.prev if at == 0 else int(positions[at - 1])
            raise InvalidArgument(
                f"entries of a batch must follow ({batch.prev}, {batch.current}] in order; "
                f"got position {int(positions[at])} after {previous}"
            )
    for client in entries.clients:
        validate_site_id(client)
    # A batch without entries is a sender's step over positions with nothing for this site.
    if len(positions) and int(positions[-1]) != batch.current:
        raise InvalidArgument(
            f"a batch ({batch.prev}, {batch.current}] must end with the entry at {batch.current}"
        )
