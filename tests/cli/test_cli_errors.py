"""Exit codes and error messages: 1 (one line on stderr) when the server refuses, 2 for bad
usage (docs/api.md, CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.cli.clitools import Cli, error_text, free_port, one_error_line


def test_server_errors_exit_1_with_one_line(cli: Cli) -> None:
    stream = "errs"  # short: these messages stay under 80 columns (see the next test)
    assert cli("stream", "create", stream).returncode == 0
    cases = {
        ("stream", "info", "nope"): "no such stream",
        ("stream", "delete", "nope"): "no such stream",
        ("stream", "create", stream): "already exists",
        ("publish", "nope", "v"): "no such stream",
        ("publish", stream, "v", "--partition", "5"): "no such partition",
        ("tail", "nope"): "no such stream",
        ("tail", stream, "--partition", "3"): "no partition 3",
    }
    for args, done in zip(cases, cli.many(*cases), strict=True):
        assert done.returncode == 1, (args, done.stderr)
        assert done.stdout == "", args
        assert cases[args] in one_error_line(done), args


def test_long_server_errors_stay_on_one_line(cli: Cli) -> None:
    """Scripts read the one error line; it must not depend on the terminal width (these
    messages are 100 to 160 characters long)."""
    long_name = "a-stream-whose-name-is-long-enough-to-push-the-message-past-eighty-columns"
    unknown = cli("stream", "info", long_name)
    assert unknown.returncode == 1
    assert long_name in one_error_line(unknown)
    invalid = cli("stream", "create", "bad/name")
    assert invalid.returncode == 1
    assert "invalid stream name" in one_error_line(invalid)
    nobody = Cli(f"127.0.0.1:{free_port()}")("stream", "list")
    assert nobody.returncode == 1
    assert "cannot reach the tidelog server" in one_error_line(nobody)


@pytest.mark.slow
def test_bad_usage_exits_2(cli: Cli, stream: str, tmp_path: Path) -> None:
    cases = {
        ("tail", stream, "--from", "bogus"): "--from takes earliest",
        ("tail", stream, "--from", "offset:x"): "--from takes earliest",
        ("tail", stream, "--from", "offset:-1"): "--from takes earliest",
        ("tail", stream, "--from", "time:yesterday"): "not an ISO 8601 time",
        ("tail", stream, "--reverse", "--follow"): "cannot --follow",
        ("tail", stream, "-n", "-1"): "",
        ("publish", stream): "either a VALUE or --file",
        ("publish", stream, "v", "--file", str(tmp_path / "f")): "either a VALUE or --file",
        ("publish", stream, "v", "--header", "novalue"): "--header takes name=value",
        ("publish", stream, "v", "--header", "=x"): "--header takes name=value",
        ("publish", stream, "--file", str(tmp_path / "missing.txt")): "no such file",
        ("stream", "create"): "",
        ("stream", "create", stream, "--partitions", "0"): "",
        ("stream", "frobnicate"): "",
        ("cursor", "set", "c", stream, "not-a-number"): "",
    }
    for args, done in zip(cases, cli.many(*cases), strict=True):
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert done.stdout == "", args
        assert "Traceback" not in done.stderr, args
        if cases[args]:
            assert cases[args] in error_text(done), args
    # Nothing reached the server: the stream was never created.
    assert cli("stream", "info", stream).returncode == 1
