"""``tidelog tail``: a stream's messages merged across its partitions, filtered on the server.

Everything goes through the client's ``browse`` (pages in timestamp order, ties by partition then
offset). The modes, each a walk of pages:

- forward (``--from earliest|time:T|offset:N``, or none): oldest-first pages until caught up;
- last N (``-n N``, or ``--from latest`` = the last one): one newest-first walk of N messages,
  printed oldest first;
- ``--reverse``: newest-first pages from now (or the ``--from`` point) back to the oldest;
- ``--follow``: after the backlog, oldest-first pages from where it ended, polled while nothing is
  new, merging every partition's new messages.

``--json`` prints each page from its columns (``ReceivedBatch``: offsets, timestamps, keys,
values, headers, partitions), without a message object per line; the human form reads messages.

An offset names a message of one partition, so ``--from offset:N`` starts *each* partition read
at its offset N (with one partition, exactly the old behaviour). Filters (``--key``, ``--header``,
``--grep``, ``--since``, ``--until``) are data sent to the server, which scans within its budget;
the command keeps paging until the walk is done.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Annotated, Any

import typer

from tidelog.cli.common import PLAINTEXT, ServerOption, client_command, fail, guarded, printable
from tidelog.client import DEFAULT_SERVER, Client, ClientTls, ReceivedBatch, ReceivedMessage
from tidelog.wire import POSITION_HEADER, RECEIVE_QUEUE_PREFIX, SNAPSHOT_HEADER
from tidelog.wire.browse_token import BrowsePosition, encode_token

FOLLOW_POLL_S = 0.2
"""How long ``--follow`` waits before asking again when nothing new arrived."""
PAGE = 1000
"""Messages per page of a forward or reverse walk."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NUMBER_HEADERS = frozenset({POSITION_HEADER, SNAPSHOT_HEADER})
"""Headers of a receive queue's records that hold a number, 8 bytes big-endian (``tidelog.wire``):
shown as that number. On any other stream these names are an application's, shown as given."""


def parse_from(spec: str) -> str | int | datetime:
    """``earliest``, ``latest``, ``new``, ``offset:N`` or ``time:ISO8601``."""
    if spec in ("earliest", "latest", "new"):
        return spec
    kind, sep, rest = spec.partition(":")
    if sep and kind == "offset" and rest.isdigit():
        return int(rest)
    if sep and kind == "time":
        return parse_time(rest, "--from time:")
    fail(f"--from takes earliest, latest, new, offset:N or time:ISO8601, not {spec!r}", 2)


def parse_time(text: str, flag: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{flag}{text}: not an ISO 8601 time (e.g. 2026-11-21T10:00:00+00:00)", 2)
    return moment if moment.tzinfo else moment.astimezone()


def parse_headers(pairs: list[str]) -> dict[str, bytes]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"--header takes name=value, got {pair!r}", 2)
        headers[name] = value.encode()
    return headers


def header_value(m: ReceivedMessage, name: str) -> int | str | None:
    """Header ``name`` of ``m`` as shown: a receive queue's position or snapshot id as its number,
    anything else as text (``printable``)."""
    return shown_header(m.stream, name, m.headers[name])


def shown_header(stream: str, name: str, value: bytes) -> int | str | None:
    if name in NUMBER_HEADERS and len(value) == 8 and stream.startswith(RECEIVE_QUEUE_PREFIX):
        return int.from_bytes(value, "big", signed=True)
    return printable(value)


def message_json(m: ReceivedMessage) -> str:
    return json.dumps(
        {
            "offset": m.offset,
            "timestamp": m.timestamp,
            "key": printable(m.key),
            "value": printable(m.value),
            "headers": {k: header_value(m, k) for k in m.headers},
            "partition": m.partition,
        }
    )


def batch_json(batch: ReceivedBatch, limit: int | None = None) -> list[str]:
    """What :func:`message_json` prints for each of the first ``limit`` messages of ``batch``,
    made from its columns (no message object each)."""
    n = len(batch) if limit is None else min(limit, len(batch))
    keys = batch.keys
    stream = batch.stream
    return [
        json.dumps(
            {
                "offset": offset,
                "timestamp": stamp,
                "key": printable(key),
                "value": printable(value),
                "headers": {k: shown_header(stream, k, v) for k, v in headers.items()},
                "partition": partition,
            }
        )
        for offset, stamp, key, value, headers, partition in zip(
            batch.offsets[:n].tolist(),
            batch.timestamps[:n].tolist(),
            repeat(None, n) if keys is None else keys[:n],
            batch.values[:n],
            batch.headers[:n],
            batch.partitions[:n].tolist(),
            strict=True,
        )
    ]


def human(m: ReceivedMessage, merged: bool) -> str:
    where = f" partition={m.partition}" if merged else ""
    key = "" if m.key is None else f" key={printable(m.key)}"
    headers = "".join(f" {k}={header_value(m, k)}" for k in m.headers)
    when = m.time.isoformat(timespec="milliseconds")
    return f"{m.offset}\t{when}{where}{key}{headers}\t{printable(m.value)}"


@dataclass
class Walk:
    """One tail's calls to ``browse``: the stream, partitions and filters every page shares."""

    client: Client
    stream: str
    partitions: list[int] | None
    filters: dict[str, Any] = field(default_factory=dict)

    def page(self, **how: Any) -> Any:
        return self.client.browse(self.stream, partitions=self.partitions, **self.filters, **how)

    def pages(
        self, *, newest_first: bool, start: datetime | None, token: str | None
    ) -> Iterator[tuple[Sequence[ReceivedMessage], str | None]]:
        """Every page until the walk ends: newest first, the oldest message passed; oldest
        first, caught up with what is there (the token then continues with what comes)."""
        while True:
            page = self.page(limit=PAGE, newest_first=newest_first, start=start, token=token)
            yield page.messages, page.next_token
            if page.next_token is None:
                return
            token = page.next_token
            # Oldest first, a page may end short of PAGE for its byte bound: only an empty page
            # that did not stop at its budget says the walk caught up.
            if not newest_first and not page.messages and not page.budget_exhausted:
                return

    def newest(self, count: int) -> list[ReceivedMessage]:
        """The newest ``count`` messages, oldest first."""
        got: list[ReceivedMessage] = []
        token = None
        while len(got) < count:
            page = self.page(limit=min(count - len(got), 10_000), token=token)
            got += page.messages
            token = page.next_token
            if token is None:
                break
        return got[::-1]

    def after(
        self, last: tuple[int, int, int]
    ) -> Iterator[tuple[Sequence[ReceivedMessage], str | None]]:
        """Oldest-first pages of what follows the message at ``last`` (its merge key) in merged
        order (up to what is there), anchored at its position: the messages sharing its
        timestamp are told apart."""
        page = self.page(limit=PAGE, newest_first=False, anchor=last)
        yield page.messages, page.next_token
        if page.next_token is not None and (page.messages or page.budget_exhausted):
            yield from self.pages(newest_first=False, start=None, token=page.next_token)

    def live_end(self) -> str | None:
        """A token at the live end: what comes after now."""
        page = self.page(limit=1, newest_first=False, start=datetime.now(UTC) + timedelta(days=1))
        token: str | None = page.next_token
        return token


@client_command
def tail(
    stream: str,
    server: ServerOption = DEFAULT_SERVER,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", help="only this partition [all, merged]")
    ] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="earliest|latest|new|offset:N|time:ISO8601")
    ] = None,
    reverse: Annotated[bool, typer.Option("--reverse", "-r", help="newest to oldest")] = False,
    count: Annotated[int | None, typer.Option("-n", help="stop after N messages", min=0)] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep waiting for new messages")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    key: Annotated[str | None, typer.Option("--key", help="only messages with this key")] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", help="only messages with this header: name=value"),
    ] = None,
    grep: Annotated[
        str | None, typer.Option("--grep", help="only messages whose value holds this text")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="only messages at or after this ISO 8601 time")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="only messages at or before this ISO 8601 time")
    ] = None,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Print a stream's messages, all partitions merged in timestamp order.

    Without --follow it prints what is there and exits: forward from --from (default: the last
    -n messages, or everything), or with --reverse newest first. --follow keeps waiting, merging
    every partition's new messages. --partition reads one partition only; the filters are
    applied by the server.
    """
    if reverse and follow:
        fail("--reverse reads back to the oldest message and ends; it cannot --follow", 2)
    begin = parse_from(start) if start is not None else None
    filters: dict[str, Any] = {}
    if key is not None:
        filters["key"] = key
    if header:
        filters["headers"] = parse_headers(header)
    if grep is not None:
        filters["contains"] = grep
    if since is not None:
        filters["since"] = parse_time(since, "--since ")
    if until is not None:
        filters["until"] = parse_time(until, "--until ")
    with guarded(server, credentials) as client:
        if count == 0:
            return
        info = client.stream_info(stream)
        numbers = list(range(len(info.partitions)))
        if partition is not None:
            if not 0 <= partition < len(info.partitions):
                fail(f"stream {stream!r} has no partition {partition}")
            numbers = [partition]
        walk = Walk(client, stream, None if partition is None else numbers, filters)
        printer = _Printer(as_json, merged=len(numbers) > 1, follow=follow, count=count)
        with contextlib.suppress(KeyboardInterrupt, _Enough):
            _run(walk, printer, begin, numbers, reverse=reverse, follow=follow, count=count)


class _Enough(Exception):
    """-n messages were printed."""


@dataclass
class _Printer:
    as_json: bool
    merged: bool
    follow: bool
    count: int | None
    shown: int = 0
    last: tuple[int, int, int] | None = None
    """The merge key of the last message shown."""

    def __call__(self, messages: Sequence[ReceivedMessage]) -> None:
        if self.as_json and isinstance(messages, ReceivedBatch):
            self._columns(messages)
            return
        for m in messages:
            print(message_json(m) if self.as_json else human(m, self.merged), flush=self.follow)
            self.last = m.merge_key
            self.shown += 1
            if self.count is not None and self.shown >= self.count:
                raise _Enough

    def _columns(self, batch: ReceivedBatch) -> None:
        """``--json`` of a page: its lines made from the columns, printed in one write."""
        room = None if self.count is None else self.count - self.shown
        lines = batch_json(batch, room)
        if not lines:
            return
        print("\n".join(lines), flush=self.follow)
        at = len(lines) - 1
        self.last = (
            int(batch.timestamps[at]),
            int(batch.partitions[at]),
            int(batch.offsets[at]),
        )
        self.shown += len(lines)
        if self.count is not None and self.shown >= self.count:
            raise _Enough


def _offset_token(stream: str, numbers: list[int], offset: int, newest_first: bool) -> str:
    """A token that starts every partition read at ``offset`` (``tidelog.wire.browse_token``)."""
    return encode_token(BrowsePosition(stream, newest_first, tuple((n, offset) for n in numbers)))


def _run(
    walk: Walk,
    show: _Printer,
    begin: str | int | datetime | None,
    numbers: list[int],
    *,
    reverse: bool,
    follow: bool,
    count: int | None,
) -> None:
    token: str | None = None
    start = begin if isinstance(begin, datetime) else None
    if isinstance(begin, int):
        token = _offset_token(walk.stream, numbers, begin, newest_first=reverse)
    if reverse:
        if begin == "new":
            return
        if begin == "earliest":  # newest first from the oldest message: that one alone
            show(walk.page(limit=1, newest_first=False).messages)
            return
        for messages, _ in walk.pages(newest_first=True, start=start, token=token):
            show(messages)
        return
    if (begin is None and count is not None) or begin == "latest":
        newest = walk.newest(1 if begin == "latest" else count or 0)
        show(newest)
        if not follow:
            return
        live = walk.live_end() if show.last is None else None
        if show.last is not None:
            for messages, next_token in walk.after(show.last):
                show(messages)
                live = next_token
    elif begin == "new" or (begin is None and follow):
        if not follow:
            return
        live = walk.live_end()
    else:
        live = token
        for messages, next_token in walk.pages(newest_first=False, start=start, token=token):
            show(messages)
            live = next_token
    while follow and live is not None:
        page = walk.page(limit=PAGE, newest_first=False, token=live)
        show(page.messages)
        live = page.next_token
        if not page.messages and not page.budget_exhausted:
            time.sleep(FOLLOW_POLL_S)
