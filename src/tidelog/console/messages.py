"""Pages of a stream's messages for the console, all read with the server's ``Browse``.

The server merges the partitions in timestamp order (ties by partition, then offset), newest or
oldest first, applies the filters and hands back a continuation token. Every continuation from a
row is by its *position* (timestamp, partition, offset; ``Browse``'s anchor), never by its time
alone: a ``publish_batch`` gives one timestamp to a whole request, and a time cannot tell its
messages apart. On top of ``Browse``:

- **older** (newest first) or **later** (oldest first) is the token of the page shown;
- **newer** (the messages just above the top row) is an oldest-first browse anchored just past
  the top row, reversed to show newest first;
- **jump to an offset** reads that one message of its partition for its time, then browses newest
  first anchored at it, itself included: it is the first row;
- **live tail** starts oldest first just past the newest row shown (or at the live end when none
  is), then follows the server's token: each poll goes on from where the last one ended, so a
  full poll always moves on and an empty one waits :data:`TAIL_POLL_S`. The token is each event's
  id, so a reconnecting browser goes on from the last rows it received; while the server cannot
  be reached the tail says so and tries again every :data:`TAIL_RETRY_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidelog.client import AsyncClient, ReceivedMessage, StreamEmpty, Unavailable
from tidelog.console.query import BadQuery, MessageQuery, parse_time

Position = tuple[int, int, int]
"""(timestamp ns, partition, offset): the merge order of messages."""

TAIL_POLL_S = 0.5
TAIL_RETRY_S = 1.0
"""How long a tail waits before asking again a server it could not reach."""
TAIL_BATCH = 200
LIVE_END: Position = (2**63 - 1, 2**31 - 1, 2**63 - 1)
"""An anchor past every message: oldest first from it is the live end."""


def position(m: ReceivedMessage) -> Position:
    return (m.timestamp, m.partition, m.offset)


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
    if query.offset and not query.token:
        partition = (query.partitions() or [0])[0]
        target = await message_at(client, stream, partition, int(query.offset))
        if target is None:
            raise NoSuchOffset(
                f"partition {partition} of {stream!r} holds no message at offset {query.offset}"
            )
        focus = position(target)
    elif query.at:
        start = parse_time(query.at, "at", end=query.newest_first)
    page = await client.browse(
        stream,
        limit=query.limit,
        newest_first=query.newest_first,
        start=None if query.token else start,
        anchor=focus,
        include_anchor=True,
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
        limit=query.limit,
        newest_first=False,
        anchor=top,
        **query.browse_filters(),
    )
    return list(page.messages[::-1])


@dataclass(frozen=True, slots=True)
class TailStep:
    """One poll of a live tail."""

    messages: list[ReceivedMessage]
    """new messages, newest first (empty: nothing new, or the server is out of reach)"""
    cursor: str | None
    """the token the next poll goes on from (None until the first poll answered)"""
    trouble: str | None = None
    """why the poll failed, when the server could not be reached (the tail tries again)"""
    ended: bool = False
    """the last step: nothing can come any more (past ``until``); ``cursor`` is then the token
    this step was read from, which must not be handed out to go on from (it would read these
    messages again)"""


async def tail(
    client: AsyncClient,
    stream: str,
    query: MessageQuery,
    start: Position | str | None,
    poll_s: float,
    stop: asyncio.Event,
) -> AsyncIterator[TailStep]:
    """The messages that follow ``start`` as they arrive: after a row's position, from a cursor
    (a token of an earlier step), or from the live end (None). A step per poll; an empty one
    when nothing is new (the caller's chance to notice a closed page). Ends when ``stop`` is set
    (the console is shutting down) or nothing can come any more (past ``until``)."""
    filters: dict[str, Any] = query.browse_filters()
    cursor = start if isinstance(start, str) else None
    anchor = LIVE_END if start is None else start if not isinstance(start, str) else None
    while not stop.is_set():
        wait = poll_s
        try:
            page = await client.browse(
                stream,
                limit=TAIL_BATCH,
                newest_first=False,
                token=cursor,
                anchor=None if cursor else anchor,
                **filters,
            )
        except Unavailable as error:
            yield TailStep([], cursor, str(error))
            wait = TAIL_RETRY_S
        else:
            if page.next_token is None:
                yield TailStep(list(page.messages[::-1]), cursor, ended=True)
                return
            cursor = page.next_token
            yield TailStep(list(page.messages[::-1]), cursor)
            if len(page.messages) == TAIL_BATCH or page.budget_exhausted:
                continue  # more is waiting: the token has moved past what this poll read
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


POSITION_BOUNDS = (
    ("timestamp", 0, 2**63 - 1),
    ("partition", 0, 2**31 - 1),
    ("offset", 0, 2**63 - 1),
)
"""What each number of a position may be (the wire's int64 time, int32 partition, int64 offset)."""


def parse_position(text: str, field: str) -> Position | None:
    """``ts:partition:offset`` (as a page writes a row's position) as a position; None when
    ``text`` is empty. Anything else, or a number out of :data:`POSITION_BOUNDS`, is a
    :class:`BadQuery` naming ``field``."""
    if not text.strip():
        return None
    parts = text.strip().split(":")
    try:
        numbers = [int(x) for x in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 3:
        raise BadQuery(f"{field}: {text!r} is not a position; write it timestamp:partition:offset")
    for number, (name, low, high) in zip(numbers, POSITION_BOUNDS, strict=True):
        if not low <= number <= high:
            raise BadQuery(
                f"{field}: the {name} of {text!r} is out of range; it lies between {low} and {high}"
            )
    return (numbers[0], numbers[1], numbers[2])


def format_position(p: Position) -> str:
    return f"{p[0]}:{p[1]}:{p[2]}"
