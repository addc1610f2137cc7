"""``tidelog site add|remove|list|transmit|resync`` against a server started with a site id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.clitools import Cli, one_error_line
from tests.support.server import ServerProcess, served


@pytest.fixture(scope="module")
def site_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    data = Path(tmp_path_factory.mktemp("cli-site")) / "data"
    with served(data, "--site-id", "home") as process:
        yield Cli(process.address)


def test_site_add_list_transmit_remove(site_cli: Cli) -> None:
    added = site_cli("site", "add", "b", "127.0.0.1:9301")
    assert added.returncode == 0, added.stderr
    assert "added site b at 127.0.0.1:9301" in added.stdout
    listed = site_cli("site", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["site_id"] for line in listed.stdout.splitlines()] == ["b"]
    table = site_cli("site", "list")
    assert "remote sites of home" in table.stdout and "127.0.0.1:9301" in table.stdout

    one = site_cli("site", "transmit", "orders", "b", "hello")
    assert one.returncode == 0, one.stderr
    assert "transmitted 1 payloads to b" in one.stdout
    lines = site_cli("site", "transmit", "orders", "b", "--file", "-", input="x\ny\nz\n")
    assert "transmitted 3 payloads" in lines.stdout, lines.stderr

    status = site_cli("site", "status", "--json")
    assert status.returncode == 0, status.stderr
    (state,) = [json.loads(line) for line in status.stdout.splitlines()]
    # Nothing listens at b's address: 4 entries outstanding, never acknowledged.
    assert (state["site_id"], state["lag_entries"], state["stalled"]) == ("b", 4, True)
    assert "STALLED" in site_cli("site", "status").stdout

    resync = site_cli("site", "resync", "b")
    assert resync.returncode == 0, resync.stderr
    assert "snapshot sync of site b requested" in resync.stdout
    nowhere = site_cli("site", "resync", "elsewhere")
    assert nowhere.returncode == 1 and "unknown site 'elsewhere'" in one_error_line(nowhere)

    unknown = site_cli("site", "transmit", "orders", "b,elsewhere", "v")
    assert unknown.returncode == 1
    assert "unknown site 'elsewhere'" in one_error_line(unknown)
    removed = site_cli("site", "remove", "b")
    assert removed.returncode == 0, removed.stderr
    again = site_cli("site", "remove", "b")
    assert again.returncode == 1 and "unknown site 'b'" in one_error_line(again)


def test_site_commands_on_a_server_without_a_site_id(cli: Cli, server: ServerProcess) -> None:
    done = cli("site", "list")
    assert done.returncode == 1
    assert "--site-id" in one_error_line(done)
