"""Tables on stdout (``stream list|info``, ``site list|status``): piped, every cell is whole.

Rich lays a table out at the console's width, which is 80 columns (or ``COLUMNS``) when stdout is
not a terminal, and cuts cells to fit (``…``). A pipe or a file gets the table at the width its
cells need; the tests say ``COLUMNS=80`` so they check that whatever runs them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.clitools import Cli, clean_env
from tests.support.server import served

NARROW = clean_env(COLUMNS="80")
LONG_SITE = "a-remote-site-whose-id-is-sixty-three-characters-long-012345678"
LONG_STREAM = "a-stream-whose-name-alone-is-wider-than-the-eighty-columns-of-a-pipe-0123456789"


@pytest.fixture(scope="module")
def site_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    data = Path(tmp_path_factory.mktemp("cli-tables")) / "data"
    with served(data, "--site-id", "home") as process:
        yield Cli(process.address)


def piped(cli: Cli, *args: str) -> str:
    done = cli(*args, env=NARROW, input="")
    assert done.returncode == 0, (args, done.stderr)
    assert "…" not in done.stdout, (args, done.stdout)
    return done.stdout


def one_line_holding(table: str, *cells: str) -> str:
    """The table's line that holds every one of ``cells`` whole."""
    lines = [line for line in table.splitlines() if all(cell in line for cell in cells)]
    assert len(lines) == 1, (cells, table)
    return lines[0]


def test_site_tables_are_whole_when_piped(site_cli: Cli) -> None:
    assert len(LONG_SITE) == 63
    assert site_cli("site", "add", LONG_SITE, "127.0.0.1:9").returncode == 0
    assert site_cli("site", "transmit", "orders", LONG_SITE, "hello").returncode == 0
    status = site_cli("site", "status", "--json")
    assert status.returncode == 0, status.stderr
    (state,) = [json.loads(line) for line in status.stdout.splitlines()]
    assert state["reason"] and not state["caught_up"]

    table = piped(site_cli, "site", "status")
    one_line_holding(table, "site", "state", "acked", "lag (entries)", "lag (s)", "reason")
    one_line_holding(table, LONG_SITE, state["state"], str(state["lag_entries"]), state["reason"])
    listed = piped(site_cli, "site", "list")
    one_line_holding(listed, LONG_SITE, "127.0.0.1:9")


def test_stream_tables_are_whole_when_piped(site_cli: Cli) -> None:
    assert site_cli("stream", "create", LONG_STREAM, "-p", "2").returncode == 0
    listed = piped(site_cli, "stream", "list")
    one_line_holding(listed, "stream", "partitions", "messages (newest+1)", "paused", "readonly")
    one_line_holding(listed, LONG_STREAM, " 2 ")
    info = piped(site_cli, "stream", "info", LONG_STREAM)
    one_line_holding(info, f"stream {LONG_STREAM} (subject {LONG_STREAM})")
    one_line_holding(info, "partition", "high watermark", "newest offset", "leader")
