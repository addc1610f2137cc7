"""Pages of a stream's messages for the console, all read with the server's ``Browse``.

The server merges the partitions in timestamp order (ties by partition, then offset), newest or
oldest first, applies the filters and hands back a continuation token. On top of it:

- **older** (newest first) or **later** (oldest first) is the token of the page shown;
- **newer** (the messages just above the top row) is an oldest-first browse from the top row's
  time, dropping what sorts at or below the top row, reversed to show newest first;
- **jump to an offset** reads that one message of its partition for its time, then browses newest
  first from that time (the message is the first row at or below its time);
- **live tail** polls the same oldest-first browse from the newest row seen, every
  :data:`TAIL_POLL_S`, so its filters are evaluated on the server as the page's are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tidelog.client import AsyncClient, ReceivedMessage, StreamEmpty
from tidelog.console.query import MessageQuery, parse_time

TAIL_POLL_S = 0.5
TAIL_BATCH = 200
NEWER_SLACK = 64
"""A newer page asks for this many more than it shows: messages sharing the top row's
timestamp come back too and are dropped."""

Position = tuple[int, int, int]
"""(timestamp ns, partition, offset): the merge order of messages."""


def position(m: ReceivedMessage) -> Position:
    return (m.timestamp, m.partition, m.offset)


def time_of(timestamp_ns: int, *, round_up: bool = False) -> datetime:
    """A datetime (microseconds) for a ns timestamp: rounded down, or up with ``round_up``."""
    micros = -(-timestamp_ns // 1000) if round_up else timestamp_ns // 1000
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True)
class Page:
    messages: Sequence[ReceivedMessage]
    """in display order"""
    older_token: str | None
    """continue in the page's direction (older for newest first)"""
    scanned: int
    budget_exhausted: bool
    reached_timestamp: int | None
    focus: Position | None = None
    """the row a jump to an offset landed on"""


class NoSuchOffset(LookupError):
    pass


async def message_at(
    client: AsyncClient, stream: str, partition: int, offset: int
) -> ReceivedMessage | None:
    """The message at ``offset`` of one partition, or None when the partition has no such
    offset (before its oldest, after its newest, or removed by retention)."""
    info = await client.stream_info(stream)
    if not any(p.partition == partition for p in info.partitions):
        return None
    newest = next(p.newest_offset for p in info.partitions if p.partition == partition)
    if offset > newest:
        return None
    messages = client.subscribe(stream, partition, start=offset, stop=offset)
    try:
        async for m in messages:
            return m if m.offset == offset else None
    except StreamEmpty:
        return None
    finally:
        await messages.aclose()  # type: ignore[attr-defined]
    return None


async def read_page(client: AsyncClient, stream: str, query: MessageQuery) -> Page:
    """The page ``query`` describes: from now, a token, a time, or an offset."""
    filters = query.browse_filters()
    start: datetime | None = None
    focus: Position | None = None
    if query.offset:
        partition = (query.partitions() or [0])[0]
        target = await message_at(client, stream, partition, int(query.offset))
        if target is None:
            raise NoSuchOffset(
                f"partition {partition} of {stream!r} holds no message at offset {query.offset}"
            )
        focus = position(target)
        start = time_of(target.timestamp, round_up=True)
    elif query.at:
        start = parse_time(query.at, "at", end=query.newest_first)
    page = await client.browse(
        stream,
        limit=query.limit,
        newest_first=query.newest_first,
        start=None if query.token else start,
        token=query.token or None,
        **filters,
    )
    return Page(
        page.messages,
        page.next_token,
        page.scanned,
        page.budget_exhausted,
        page.reached_timestamp,
        focus,
    )


async def read_newer(
    client: AsyncClient, stream: str, query: MessageQuery, top: Position
) -> list[ReceivedMessage]:
    """Up to ``query.limit`` messages sorting just above ``top``, newest first."""
    page = await client.browse(
        stream,
        limit=min(query.limit + NEWER_SLACK, 1000),
        newest_first=False,
        start=time_of(top[0]),
        **query.browse_filters(),
    )
    above = [m for m in page.messages if position(m) > top][: query.limit]
    return above[::-1]


async def tail(
    client: AsyncClient,
    stream: str,
    query: MessageQuery,
    after: Position,
    poll_s: float,
    stop: asyncio.Event,
) -> AsyncIterator[list[ReceivedMessage]]:
    """Batches of messages newer than ``after`` as they arrive, each newest first; an empty
    batch every poll with nothing new (the caller's chance to notice a closed page). Ends when
    ``stop`` is set (the console is shutting down)."""
    filters: dict[str, Any] = query.browse_filters()
    while not stop.is_set():
        page = await client.browse(
            stream,
            limit=TAIL_BATCH,
            newest_first=False,
            start=time_of(after[0]),
            **filters,
        )
        new = [m for m in page.messages if position(m) > after]
        if new:
            after = position(new[-1])
        yield new[::-1]
        if len(page.messages) < TAIL_BATCH:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)


def parse_position(text: str) -> Position | None:
    """``ts:partition:offset`` as a position, or None."""
    try:
        ts, partition, offset = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return (ts, partition, offset)


def format_position(p: Position) -> str:
    return f"{p[0]}:{p[1]}:{p[2]}"
