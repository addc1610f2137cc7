"""``tidelog view declare|drop|list`` and ``tidelog query get|range|window`` against a server."""

from __future__ import annotations

import json

import pytest
import typer
from tests.cli.clitools import Cli, error_text, words

from tidelog.cli.view_commands import parse_key, parse_time, parse_view
from tidelog.client import View


@pytest.mark.slow
def test_views_from_stream_create_and_queries_in_text_and_json(cli: Cli, stream: str) -> None:
    created = cli("stream", "create", stream, "--view", "latest", "--view", "recent:60000")
    assert created.returncode == 0, created.stderr
    lines = "\n".join(f"v{i}" for i in range(6))
    for key in ("a", "b"):
        done = cli("publish", stream, "--key", key, "--file", "-", input=lines)
        assert done.returncode == 0, done.stderr

    get, get_json, range_json, last_json, listed = cli.many(
        ("query", "get", stream, "latest", "a"),
        ("query", "get", stream, "latest", "b", "--json"),
        ("query", "range", stream, "latest", "--reverse", "--json"),
        ("query", "window", stream, "recent", "a", "--last", "2", "--from", "-1h", "--json"),
        ("view", "list", stream, "--json"),
    )
    for done in (get, get_json, range_json, last_json, listed):
        assert done.returncode == 0, done.stderr
    assert "v5" in get.stdout and "1 entry" in words(get.stdout)
    assert json.loads(get_json.stdout)["value"] == "v5"
    assert [json.loads(line)["key"] for line in range_json.stdout.splitlines()] == ["b", "a"]
    last = [json.loads(line) for line in last_json.stdout.splitlines()]
    assert [e["value"] for e in last] == ["v5", "v4"]
    assert all(e["window_start_ms"] % 60000 == 0 for e in last)
    views = {v["name"]: v for v in map(json.loads, listed.stdout.splitlines())}
    assert views["latest"]["kind"] == "table"
    assert views["recent"]["window_size_ms"] == 60000
    assert views["recent"]["applied_offsets"] == [12]


def test_view_declare_drop_and_errors(cli: Cli, stream: str) -> None:
    assert cli("stream", "create", stream).returncode == 0
    declared = cli("view", "declare", stream, "w", "--window", "1000", "--retention", "60000")
    assert declared.returncode == 0, declared.stderr
    assert words(declared.stdout) == f"declared window view w on {stream}"
    missing, wrong_kind, bad_range = cli.many(
        ("query", "get", stream, "nope", "k"),
        ("query", "get", stream, "w", "k"),
        ("query", "window", stream, "w", "k", "--from", "10", "--to", "5"),
    )
    assert missing.returncode == 1 and "no such view" in error_text(missing)
    assert wrong_kind.returncode == 1 and "window view" in error_text(wrong_kind)
    assert bad_range.returncode == 1 and "is after" in error_text(bad_range)
    dropped = cli("view", "drop", stream, "w")
    assert dropped.returncode == 0, dropped.stderr
    again = cli("view", "drop", stream, "w")
    assert again.returncode == 1 and "no such view" in error_text(again)


def test_argument_parsers() -> None:
    assert parse_key("plain") == b"plain"
    assert parse_key("base64:AP8=") == b"\x00\xff"
    assert parse_time("now", 1_000_000) == 1_000_000
    assert parse_time("-5m", 1_000_000) == 700_000
    assert parse_time("-250ms", 1_000) == 750
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("1970-01-01T00:00:01+00:00") == 1000
    assert parse_view("t") == View.table("t")
    assert parse_view("w:500") == View.window("w", 500)
    assert parse_view("w:500:9000") == View.window("w", 500, 9000)
    for bad in ("w:x", "w:1:2:3"):
        with pytest.raises(typer.Exit):
            parse_view(bad)
