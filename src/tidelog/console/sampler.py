"""The console's reads of stream metadata and cursors, and the sampler that keeps their history.

Cursors live in the internal stream ``__cursors``: each ``set`` appends a record keyed
``<cursor id>,<stream>,<partition>`` whose value is the offset (8 bytes, big-endian). The console
reads that stream through the client like any other, keeping the latest record per key, and
reads each cursor partition incrementally (only the records since its last read), so a sample
costs what was set since the last one. At most :data:`MAX_CURSORS` cursors are tracked.

Lag is the partition's newest offset minus the cursor's offset, never below zero: clients differ
on whether a cursor holds the last offset processed or the next one, so a caught-up consumer's
cursor is the newest offset or one past it, and both show a lag of 0.

A consumer group's positions are the cursor ``__group:<group id>`` (one per stream and
partition); a group's lag (:func:`group_lag`) sums, per member, the lag of the partitions
assigned to it, and names the member furthest behind. A group with positions but no tidelog
membership (a Kafka consumer group: the Kafka listener keeps its members) is listed by its
positions alone (:func:`position_groups`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidelog.access import GROUP_CURSOR_PREFIX
from tidelog.client import AsyncClient, ClientError, GroupInfo, StreamEmpty, StreamInfo
from tidelog.client.models import Start
from tidelog.console.history import ConsumerState, SeriesStore, consumer_state
from tidelog.wire import CURSORS_STREAM

LOG = logging.getLogger("tidelog.console")

MAX_CURSORS = 10_000
DEFAULT_SAMPLE_INTERVAL_S = 5.0
DEFAULT_STALL_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class CursorKey:
    cursor_id: str
    stream: str
    partition: int


@dataclass(frozen=True, slots=True)
class CursorRow:
    key: CursorKey
    offset: int
    newest_offset: int | None
    """the partition's newest offset; None when the stream or partition is gone"""
    lag: int | None
    state: ConsumerState


def parse_cursor_key(raw: bytes | None) -> CursorKey | None:
    if raw is None:
        return None
    try:
        cursor_id, stream, partition = raw.decode().rsplit(",", 2)
        return CursorKey(cursor_id, stream, int(partition))
    except ValueError:
        return None


def lag_of(newest_offset: int, cursor_offset: int) -> int:
    return max(newest_offset - cursor_offset, 0)


@dataclass(frozen=True, slots=True)
class MemberLag:
    consumer_id: str
    lag: int
    """summed over its assigned partitions that have a committed position"""
    unknown: int
    """assigned partitions with no committed position yet (or gone), not in ``lag``"""


@dataclass(frozen=True, slots=True)
class GroupLag:
    total: int
    """the sum of its members' lag"""
    worst: MemberLag | None
    """the member with the most lag (None: no member)"""
    unknown: int
    members: tuple[MemberLag, ...]


def group_lag(
    group: GroupInfo,
    positions: Mapping[CursorKey, int],
    newest: Mapping[tuple[str, int], int],
    shown: Callable[[str], bool] = lambda stream: True,
) -> GroupLag:
    """``group``'s lag: per member, the sum over its assigned partitions of the partition's
    newest offset minus the group's committed position there (:func:`lag_of`); a partition
    with no position, or gone, is counted in ``unknown`` instead. Partitions of a stream
    ``shown`` refuses (one the visitor may not see) are left out, neither lag nor unknown."""
    cursor_id = GROUP_CURSOR_PREFIX + group.group_id
    members = []
    for member in group.members:
        lag = unknown = 0
        for stream, partitions in group.assignments.get(member.consumer_id, {}).items():
            if not shown(stream):
                continue
            for partition in partitions:
                at = positions.get(CursorKey(cursor_id, stream, partition))
                end = newest.get((stream, partition))
                if at is None or end is None:
                    unknown += 1
                else:
                    lag += lag_of(end, at)
        members.append(MemberLag(member.consumer_id, lag, unknown))
    worst = max(members, key=lambda m: (m.lag, m.unknown), default=None)
    return GroupLag(
        sum(m.lag for m in members), worst, sum(m.unknown for m in members), tuple(members)
    )


@dataclass(frozen=True, slots=True)
class PositionGroup:
    """A group known only by its committed positions: no tidelog group of that id has members
    (a Kafka consumer group's membership lives in the Kafka listener; its offsets are the cursor
    ``__group:<group id>`` all the same)."""

    group_id: str
    lag: int
    """the sum over its partitions of the partition's newest offset minus its position"""
    partitions: int
    """partitions with a committed position (and a known newest offset)"""
    unknown: int
    """positions on partitions gone or not sampled, not in ``lag``"""


def position_groups(
    positions: Mapping[CursorKey, int],
    newest: Mapping[tuple[str, int], int],
    known: set[str],
    shown: Callable[[str], bool] = lambda stream: True,
) -> list[PositionGroup]:
    """The groups with positions (``__group:<id>`` cursors) whose id is not in ``known`` (the
    tidelog groups, shown with their members), sorted by id, each with its lag. Partitions of a
    stream ``shown`` refuses are left out, as in :func:`group_lag`."""
    found: dict[str, tuple[int, int, int]] = {}
    for key, at in positions.items():
        if not key.cursor_id.startswith(GROUP_CURSOR_PREFIX) or not shown(key.stream):
            continue
        group_id = key.cursor_id.removeprefix(GROUP_CURSOR_PREFIX)
        if group_id in known:
            continue
        lag, partitions, unknown = found.get(group_id, (0, 0, 0))
        end = newest.get((key.stream, key.partition))
        if end is None:
            found[group_id] = (lag, partitions, unknown + 1)
        else:
            found[group_id] = (lag + lag_of(end, at), partitions + 1, unknown)
    return [PositionGroup(g, *found[g]) for g in sorted(found)]


def newest_offsets(streams: list[StreamInfo]) -> dict[tuple[str, int], int]:
    """(stream, partition) -> its newest offset."""
    return {(s.name, p.partition): p.newest_offset for s in streams for p in s.partitions}


def stream_total(info: StreamInfo) -> int:
    """Messages appended to the stream so far (newest offset + 1, summed over partitions)."""
    return sum(p.newest_offset + 1 for p in info.partitions)


class Sampler:
    """Reads metadata and cursors; keeps publish-rate and lag series (``history``)."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.stall_after_s = stall_after_s
        self.clock = clock
        self.totals = SeriesStore()
        """stream name -> messages appended, per sample"""
        self.cursor_offsets = SeriesStore()
        self.cursor_lags = SeriesStore()
        self.cursors: dict[CursorKey, int] = {}
        self._read_to: dict[int, int] = {}
        """cursor partition -> the newest offset read so far"""
        self._lock = asyncio.Lock()
        self.last_error: str | None = None

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled; a failed sample is logged and retried."""
        while True:
            try:
                await self.sample()
                self.last_error = None
            except ClientError as error:
                self.last_error = str(error)
                LOG.debug("console sample failed: %s", error)
            await asyncio.sleep(self.interval_s)

    async def sample(self) -> list[StreamInfo]:
        """One sample now: stream totals and cursor lags. Returns the streams read."""
        async with self._lock:
            streams = await self.client.list_streams()
            now = self.clock()
            for info in streams:
                self.totals.add(info.name, now, stream_total(info))
            await self._read_cursors(streams)
            newest = {(s.name, p.partition): p.newest_offset for s in streams for p in s.partitions}
            for key, offset in self.cursors.items():
                self.cursor_offsets.add(key, now, offset)
                partition_newest = newest.get((key.stream, key.partition))
                if partition_newest is not None:
                    self.cursor_lags.add(key, now, lag_of(partition_newest, offset))
            return streams

    async def _read_cursors(self, streams: list[StreamInfo]) -> None:
        info = next((s for s in streams if s.name == CURSORS_STREAM), None)
        if info is None:
            return
        for p in info.partitions:
            read_to = self._read_to.get(p.partition, -1)
            if p.newest_offset <= read_to:
                if p.newest_offset < read_to:  # the stream was recreated: read it again
                    self._read_to[p.partition] = -1
                continue
            start: Start = read_to + 1 if read_to >= 0 else "earliest"
            try:
                async for m in self.client.subscribe(
                    CURSORS_STREAM, p.partition, start=start, stop=p.newest_offset
                ):
                    key = parse_cursor_key(m.key)
                    tracked = key in self.cursors or len(self.cursors) < MAX_CURSORS
                    if key is not None and len(m.value) == 8 and tracked:
                        self.cursors[key] = int.from_bytes(m.value, "big", signed=True)
                    self._read_to[p.partition] = m.offset
            except StreamEmpty:
                continue

    def rates(self, stream: str) -> list[float]:
        series = self.totals.get(stream)
        return [s.value for s in series.rates()] if series is not None else []

    def cursor_rows(self, streams: list[StreamInfo]) -> list[CursorRow]:
        newest = {(s.name, p.partition): p.newest_offset for s in streams for p in s.partitions}
        now = self.clock()
        rows = []
        for key in sorted(self.cursors, key=lambda k: (k.cursor_id, k.stream, k.partition)):
            offset = self.cursors[key]
            partition_newest = newest.get((key.stream, key.partition))
            offsets = self.cursor_offsets.get(key)
            lags = self.cursor_lags.get(key)
            state = consumer_state(
                list(offsets.samples) if offsets else [],
                list(lags.samples) if lags else [],
                now,
                self.stall_after_s,
            )
            rows.append(
                CursorRow(
                    key,
                    offset,
                    partition_newest,
                    None if partition_newest is None else lag_of(partition_newest, offset),
                    state,
                )
            )
        return rows

    def lag_chart(self, cursor_id: str) -> dict[str, list[float]]:
        """The summed lag of one cursor over its partitions, per sample time: ``{"t": [...],
        "lag": [...]}`` (what uPlot draws)."""
        by_time: dict[float, float] = {}
        for key in self.cursors:
            if key.cursor_id != cursor_id:
                continue
            series = self.cursor_lags.get(key)
            for s in series.samples if series else ():
                by_time[s.time_s] = by_time.get(s.time_s, 0.0) + s.value
        times = sorted(by_time)
        return {"t": times, "lag": [by_time[t] for t in times]}
