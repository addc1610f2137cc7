"""``tidelog view`` (declare, drop, list materialised views) and ``tidelog query`` (ask them).

Keys are given as text (UTF-8) or as ``base64:...``; times as ms since the Unix epoch, an ISO 8601
time, ``now``, or an offset back from now such as ``-5m`` (units ``ms``, ``s``, ``m``, ``h``,
``d``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from datetime import datetime
from typing import Annotated, Final

import typer
from rich.table import Table

from tidelog.cli.common import (
    PLAINTEXT,
    ServerOption,
    client_command,
    fail,
    guarded,
    out,
    printable,
)
from tidelog.client import DEFAULT_SERVER, ClientTls, View, ViewEntry

view_app = typer.Typer(help="Declare, drop and list materialised views.", no_args_is_help=True)
query_app = typer.Typer(
    help="Query materialised views: tables by key, window views by key and time.",
    no_args_is_help=True,
)

_RELATIVE: Final = re.compile(r"-(\d+)(ms|s|m|h|d)")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

JsonOption = Annotated[bool, typer.Option("--json", help="one JSON object per entry")]


def parse_key(text: str) -> bytes:
    if text.startswith("base64:"):
        try:
            return base64.b64decode(text[7:], validate=True)
        except binascii.Error:
            fail(f"not valid base64: {text!r}", 2)
    return text.encode()


def parse_time(text: str, now_ms: int | None = None) -> int:
    """ms since the epoch from ``1700000000000``, ``2026-11-22T10:00:00``, ``now`` or ``-5m``."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if text == "now":
        return now
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now - int(relative.group(1)) * _UNIT_MS[relative.group(2)]
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        fail(f"not a time: {text!r} (use ms since the epoch, ISO 8601, 'now' or '-5m')", 2)


def entry_json(entry: ViewEntry) -> str:
    data: dict[str, object] = {
        "key": printable(entry.key),
        "value": printable(entry.value),
        "partition": entry.partition,
        "offset": entry.offset,
        "timestamp": entry.timestamp,
    }
    if entry.window_start_ms:
        data["window_start_ms"] = entry.window_start_ms
    return json.dumps(data)


def show(entries: list[ViewEntry], as_json: bool, *, windows: bool = False) -> None:
    if as_json:
        for entry in entries:
            print(entry_json(entry))
        return
    columns = ["key", "value", "partition", "offset", "time"]
    if windows:
        columns.insert(2, "window start")
    table = Table(*columns)
    for e in entries:
        row = [printable(e.key) or "", printable(e.value) or "", str(e.partition), str(e.offset)]
        row.append(e.time.isoformat(timespec="milliseconds"))
        if windows:
            start = datetime.fromtimestamp(e.window_start_ms / 1000).astimezone()
            row.insert(2, start.isoformat(timespec="milliseconds"))
        table.add_row(*row)
    out.print(table)
    out.print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")


def parse_view(spec: str) -> View:
    """``NAME`` → table; ``NAME:SIZE_MS`` or ``NAME:SIZE_MS:RETENTION_MS`` → window view."""
    name, *numbers = spec.split(":")
    try:
        sizes = [int(n) for n in numbers]
    except ValueError:
        fail(f"view {spec!r}: window size and retention are integers (ms)", 2)
    if not sizes:
        return View.table(name)
    if len(sizes) > 2:
        fail(f"view {spec!r}: use NAME, NAME:SIZE_MS or NAME:SIZE_MS:RETENTION_MS", 2)
    return View.window(name, *sizes)


# -- tidelog view ----------------------------------------------------------------------------------


@view_app.command("declare")
@client_command
def view_declare(
    stream: str,
    name: str,
    server: ServerOption = DEFAULT_SERVER,
    window: Annotated[
        int | None, typer.Option(help="a window view with windows of this many ms")
    ] = None,
    retention: Annotated[
        int, typer.Option(help="window views: drop windows older than this (ms); 0 keeps all")
    ] = 0,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Declare a view on a stream: a table (latest value per key), or with --window a window
    index. It is built from the stream's oldest message and follows every publish."""
    view = View.table(name) if window is None else View.window(name, window, retention)
    with guarded(server, credentials) as client:
        client.declare_view(stream, view)
    out.print(f"declared {view.kind} view [bold]{name}[/bold] on {stream}")


@view_app.command("drop")
@client_command
def view_drop(
    stream: str,
    name: str,
    server: ServerOption = DEFAULT_SERVER,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Drop a view and its data (the stream is untouched)."""
    with guarded(server, credentials) as client:
        client.drop_view(stream, name)
    out.print(f"dropped view [bold]{name}[/bold] of {stream}")


@view_app.command("list")
@client_command
def view_list(
    stream: str,
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """List a stream's views and how far each has applied the log."""
    with guarded(server, credentials) as client:
        views = client.list_views(stream)
    if as_json:
        for status in views:
            v = status.view
            record = {
                "name": v.name,
                "kind": v.kind,
                "window_size_ms": v.window_size_ms,
                "retention_ms": v.retention_ms,
                "applied_offsets": list(status.applied_offsets),
                "entries": status.entries,
            }
            print(json.dumps(record))
        return
    table = Table("view", "kind", "window ms", "retention ms", "applied (per partition)", "entries")
    for status in views:
        v = status.view
        table.add_row(
            v.name,
            v.kind,
            str(v.window_size_ms or "-"),
            str(v.retention_ms or "-"),
            ",".join(map(str, status.applied_offsets)),
            str(status.entries),
        )
    out.print(table)


# -- tidelog query ---------------------------------------------------------------------------------


@query_app.command("get")
@client_command
def query_get(
    stream: str,
    view: str,
    key: str,
    server: ServerOption = DEFAULT_SERVER,
    as_json: JsonOption = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """The latest value of KEY in a table view (exit code 1 when absent)."""
    with guarded(server, credentials) as client:
        found = client.view_get(stream, view, parse_key(key))
    if found is None:
        fail(f"key {key!r} is not in view {view!r} of {stream!r}")
    show([found], as_json)


@query_app.command("range")
@client_command
def query_range(
    stream: str,
    view: str,
    server: ServerOption = DEFAULT_SERVER,
    from_key: Annotated[str | None, typer.Option("--from", help="first key (inclusive)")] = None,
    to_key: Annotated[str | None, typer.Option("--to", help="last key (inclusive)")] = None,
    reverse: Annotated[bool, typer.Option(help="descending keys")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    partition: Annotated[int | None, typer.Option("--partition", "-p")] = None,
    as_json: JsonOption = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """A key range of a table view, ascending or (--reverse) descending."""
    with guarded(server, credentials) as client:
        entries = client.view_range(
            stream,
            view,
            None if from_key is None else parse_key(from_key),
            None if to_key is None else parse_key(to_key),
            reverse=reverse,
            limit=limit,
            partition=partition,
        )
    show(entries, as_json)


@query_app.command("window")
@client_command
def query_window(
    stream: str,
    view: str,
    key: str,
    server: ServerOption = DEFAULT_SERVER,
    time_from: Annotated[
        str | None, typer.Option("--from", help="earliest timestamp (inclusive), e.g. -5m")
    ] = None,
    time_to: Annotated[
        str | None, typer.Option("--to", help="latest timestamp (inclusive)")
    ] = None,
    last: Annotated[int | None, typer.Option(min=1, help="the last N values, newest first")] = None,
    backward: Annotated[bool, typer.Option(help="newest first")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: JsonOption = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Values of KEY in a window view with timestamps in [--from, --to]; --last N gives the
    newest N (one backward fetch)."""
    now = int(time.time() * 1000)
    start = None if time_from is None else parse_time(time_from, now)
    end = None if time_to is None else parse_time(time_to, now)
    with guarded(server, credentials) as client:
        entries = client.window_fetch(
            stream,
            view,
            parse_key(key),
            start,
            end,
            backward=backward or last is not None,
            limit=last or limit,
        )
    show(entries, as_json, windows=True)
