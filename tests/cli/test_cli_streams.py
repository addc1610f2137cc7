"""``tidelog stream create|list|info|delete`` and ``tidelog cursor get|set`` against a server."""

from __future__ import annotations

import json

import pytest
from tests.cli.clitools import Cli, clean_env, error_text, words
from tests.support.server import ServerProcess


@pytest.mark.slow
def test_stream_create_list_info_delete_in_text_and_json(cli: Cli, stream: str) -> None:
    created = cli("stream", "create", stream, "--partitions", "3")
    assert created.returncode == 0, created.stderr
    assert words(created.stdout) == f"created stream {stream} with 3 partition(s)"
    assert cli("publish", stream, "x", "--partition", "2").returncode == 0

    listed, listed_json, info, info_json = cli.many(
        ("stream", "list"),
        ("stream", "list", "--json"),
        ("stream", "info", stream),
        ("stream", "info", stream, "--json"),
    )
    for done in (listed, listed_json, info, info_json):
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""

    objects = [json.loads(line) for line in listed_json.stdout.splitlines()]
    by_name = {o["name"]: o for o in objects}
    assert {"__cursors", stream} <= set(by_name)
    mine = by_name[stream]
    assert mine["subject"] == stream
    assert mine["created"] > 0
    assert [p["partition"] for p in mine["partitions"]] == [0, 1, 2]
    assert [(p["high_watermark"], p["newest_offset"]) for p in mine["partitions"]] == [
        (-1, -1),
        (-1, -1),
        (0, 0),
    ]
    assert all(p["leader"] and not p["paused"] and not p["readonly"] for p in mine["partitions"])
    assert json.loads(info_json.stdout) == mine  # one object, the same as in the list

    # The tables name the stream and show its partitions (rich renders them for people).
    assert "__cursors" in listed.stdout
    assert stream[:8] in listed.stdout
    assert "partition" in info.stdout
    rows = [line.strip("│ ") for line in info.stdout.splitlines()]
    assert [row[0] for row in rows if row[:1].isdigit()] == ["0", "1", "2"]

    deleted = cli("stream", "delete", stream)
    assert deleted.returncode == 0, deleted.stderr
    assert words(deleted.stdout) == f"deleted stream {stream}"
    gone = cli("stream", "info", stream)
    assert gone.returncode == 1
    assert "no such stream" in error_text(gone)
    after = cli("stream", "list", "--json")
    assert stream not in {json.loads(line)["name"] for line in after.stdout.splitlines()}


@pytest.mark.slow
def test_server_address_from_the_environment(server: ServerProcess, stream: str) -> None:
    cli = Cli(server.address)
    env = clean_env(TIDELOG_SERVER=server.address)
    created = cli("stream", "create", stream, env=env, server=False)
    assert created.returncode == 0, created.stderr
    info = cli("stream", "info", stream, "--json", env=env, server=False)
    assert json.loads(info.stdout)["name"] == stream
    # --server wins over the environment.
    wrong = clean_env(TIDELOG_SERVER="127.0.0.1:1")
    assert cli("stream", "info", stream, env=wrong).returncode == 0
    unreachable = cli("stream", "info", stream, env=wrong, server=False)
    assert unreachable.returncode == 1
    assert "cannot reach the tidelog server" in error_text(unreachable)


@pytest.mark.slow
def test_cursor_get_and_set(cli: Cli, stream: str) -> None:
    assert cli("stream", "create", stream, "-p", "2").returncode == 0
    unknown = cli("cursor", "get", "reader", stream)
    assert (unknown.returncode, unknown.stdout.strip()) == (0, "-1")

    stored = cli("cursor", "set", "reader", stream, "41")
    assert stored.returncode == 0, stored.stderr
    assert words(stored.stdout) == f"cursor reader on {stream}/0 = 41"
    assert cli("cursor", "set", "reader", stream, "7", "-p", "1").returncode == 0

    mine, other_partition, as_json = cli.many(
        ("cursor", "get", "reader", stream),
        ("cursor", "get", "reader", stream, "--partition", "1"),
        ("cursor", "get", "other", stream, "--json"),
    )
    assert mine.stdout.strip() == "41"
    assert other_partition.stdout.strip() == "7"
    assert json.loads(as_json.stdout) == {
        "cursor": "other",
        "stream": stream,
        "partition": 0,
        "offset": -1,
    }
    lowered = cli("cursor", "set", "reader", stream, "3")
    assert lowered.returncode == 0
    assert cli("cursor", "get", "reader", stream).stdout.strip() == "3"  # the last write wins


@pytest.mark.slow
def test_a_replication_factor_a_single_broker_cannot_keep_is_one_clear_error(
    cli: Cli, stream: str
) -> None:
    refused = cli("stream", "create", stream, "--replication-factor", "3", "--min-isr", "2")
    assert refused.returncode == 1
    assert "replication factor 3 exceeds the cluster size" in error_text(refused)
    assert cli("stream", "info", stream).returncode == 1  # nothing was created
    every = cli("stream", "create", stream, "--replication-factor", "-1")
    assert every.returncode == 0, every.stderr
    created = f"created stream {stream} with 1 partition(s), replication factor -1"
    assert words(every.stdout) == created
