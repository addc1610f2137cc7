"""``tidelog publish`` and ``tidelog tail`` against a server."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.cli.clitools import Cli, LineReader, at_terminal, clean_env, words
from tests.support.server import ServerProcess

from tidelog.client import Client

JSON_KEYS = {"offset", "timestamp", "key", "value", "headers", "partition"}


def tail_json(cli: Cli, stream: str, *args: str) -> list[dict[str, object]]:
    done = cli("tail", stream, "--json", *args)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    for line in lines:
        assert set(line) == JSON_KEYS
    return lines


def offsets(lines: list[dict[str, object]]) -> list[object]:
    return [line["offset"] for line in lines]


@pytest.fixture
def ten(cli: Cli, server: ServerProcess, stream: str) -> list[int]:
    """``stream`` with values v0..v9 (50 ms between v4 and v5); their timestamps."""
    assert cli("stream", "create", stream).returncode == 0
    with Client(server.address) as client:
        for i in range(10):
            client.publish(stream, f"v{i}".encode())
            if i == 4:
                time.sleep(0.05)
        return [m.timestamp for m in client.subscribe(stream, start="earliest", stop="latest")]


@pytest.mark.slow
def test_publish_a_value_with_key_headers_and_partition(cli: Cli, stream: str) -> None:
    assert cli("stream", "create", stream, "-p", "3").returncode == 0
    explicit = cli(
        "publish", stream, "hello", "--key", "k1", "--header", "a=1", "-H", "eq=x=y",
        "--partition", "1", "--json",
    )  # fmt: skip
    assert explicit.returncode == 0, explicit.stderr
    assert json.loads(explicit.stdout) == {"stream": stream, "partition": 1, "offset": 0}

    key = next(k for k in (f"user-{i}" for i in range(100)) if zlib.crc32(k.encode()) % 3 == 2)
    by_key = cli("publish", stream, "keyed", "--key", key)
    assert by_key.returncode == 0, by_key.stderr
    assert words(by_key.stdout) == f"published to {stream}/2 at offset 0"  # CRC-32 % 3
    plain = cli("publish", stream, "plain", "--json")
    assert json.loads(plain.stdout)["partition"] == 0

    (got,) = tail_json(cli, stream, "--partition", "1", "--from", "earliest")
    assert got["offset"] == 0
    assert (got["key"], got["value"], got["partition"]) == ("k1", "hello", 1)
    assert got["headers"] == {"a": "1", "eq": "x=y"}
    assert isinstance(got["timestamp"], int)
    assert abs(got["timestamp"] - time.time_ns()) < 600 * 10**9
    (keyed,) = tail_json(cli, stream, "--partition", "2", "--from", "earliest")
    assert (keyed["key"], keyed["value"]) == (key, "keyed")
    first = tail_json(cli, stream, "--partition", "0", "--from", "earliest")
    assert first[0]["key"] is None  # published without a key
    assert first[0]["headers"] == {}
    # Without --partition, tail reads every partition merged in publish (timestamp) order.
    merged = tail_json(cli, stream, "--from", "earliest")
    assert [(m["partition"], m["value"]) for m in merged] == [
        (1, "hello"),
        (2, "keyed"),
        (0, "plain"),
    ]


def test_publish_a_file_and_stdin(cli: Cli, stream: str, tmp_path: Path) -> None:
    assert cli("stream", "create", stream).returncode == 0
    lines = [f"line {i}" for i in range(2500)]  # more than one request of 1,000
    source = tmp_path / "messages.txt"
    source.write_text("\n".join(lines) + "\n")
    from_file = cli("publish", stream, "--file", str(source), "--key", "k", "-H", "src=file")
    assert from_file.returncode == 0, from_file.stderr
    assert words(from_file.stdout) == f"published 2500 messages to {stream}"

    crlf = "first\r\nsecond\r\n\xff-not-utf8\n"
    from_stdin = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "publish", stream, "-f", "-", "--json",
         "--server", cli.address],
        input=crlf.encode("latin-1"),
        capture_output=True,
        env=clean_env(),
        timeout=60,
    )  # fmt: skip
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert json.loads(from_stdin.stdout) == {"stream": stream, "published": 3}

    got = tail_json(cli, stream, "--from", "earliest")
    assert offsets(got) == list(range(2503))
    assert [g["value"] for g in got[:2500]] == lines
    assert {(g["key"], g["headers"]["src"]) for g in got[:2500]} == {("k", "file")}
    assert [g["value"] for g in got[2500:]] == [
        "first",
        "second",
        "base64:" + base64.b64encode(b"\xff-not-utf8").decode(),
    ]
    assert [g["key"] for g in got[2500:]] == [None] * 3


@pytest.mark.slow
def test_tail_positions(cli: Cli, stream: str, ten: list[int]) -> None:
    between = datetime.fromtimestamp((ten[4] + ten[5]) / 2 / 1e9, tz=UTC).isoformat()
    calls = {
        "default": (),
        "earliest": ("--from", "earliest"),
        "latest": ("--from", "latest"),
        "offset": ("--from", "offset:7"),
        "offset_n": ("--from", "offset:2", "-n", "3"),
        "time": ("--from", f"time:{between}"),
        "last_n": ("-n", "3"),
        "reverse": ("--reverse",),
        "reverse_n": ("--reverse", "-n", "2"),
        "reverse_from": ("--reverse", "--from", "offset:2"),
        "reverse_time": ("--reverse", "--from", f"time:{between}"),
    }
    results = cli.many(*((("tail", stream, "--json", *args)) for args in calls.values()))
    got = {}
    for name, done in zip(calls, results, strict=True):
        assert done.returncode == 0, (name, done.stderr)
        got[name] = [json.loads(line)["offset"] for line in done.stdout.splitlines()]
    assert got == {
        "default": list(range(10)),
        "earliest": list(range(10)),
        "latest": [9],
        "offset": [7, 8, 9],
        "offset_n": [2, 3, 4],
        "time": [5, 6, 7, 8, 9],
        "last_n": [7, 8, 9],
        "reverse": list(range(9, -1, -1)),
        "reverse_n": [9, 8],
        "reverse_from": [2, 1, 0],
        "reverse_time": [4, 3, 2, 1, 0],
    }


def test_tail_human_format(cli: Cli, stream: str, ten: list[int]) -> None:
    done = cli("tail", stream, "-n", "2")
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [(r[0], r[-1]) for r in rows] == [("8", "v8"), ("9", "v9")]
    stamp = datetime.fromisoformat(rows[1][1])
    assert abs(stamp.timestamp() - ten[9] / 1e9) < 0.002


def test_tail_of_nothing_new_prints_nothing(cli: Cli, stream: str, ten: list[int]) -> None:
    """Without --follow, tail prints what is there and exits: nothing is newer than the newest
    message, and -n 0 asks for nothing."""
    for args in (("--from", "new"), ("-n", "0")):
        done = cli("tail", stream, *args)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), args


def test_tail_of_an_empty_stream_prints_nothing(cli: Cli, stream: str) -> None:
    assert cli("stream", "create", stream).returncode == 0
    for args in ((), ("--from", "earliest"), ("--reverse",), ("-n", "5")):
        done = cli("tail", stream, *args)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), args


def test_tail_follow_prints_new_messages_until_interrupted(
    cli: Cli, server: ServerProcess, stream: str
) -> None:
    assert cli("stream", "create", stream).returncode == 0
    with Client(server.address) as client:
        client.publish_batch(stream, [b"old-0", b"old-1"])
        follow = subprocess.Popen(
            at_terminal("tail", stream, "--follow", "--json", "--from", "earliest",
                        "--server", server.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )  # fmt: skip
        try:
            reader = LineReader(follow)
            old = [json.loads(line) for line in reader.take(2)]
            assert [(m["offset"], m["value"]) for m in old] == [(0, "old-0"), (1, "old-1")], (
                follow.poll()
            )
            client.publish(stream, b"new-2", key=b"k")
            client.publish_batch(stream, [b"new-3", b"new-4"])
            new = [json.loads(line) for line in reader.take(3)]
            assert [(m["offset"], m["value"]) for m in new] == [
                (2, "new-2"),
                (3, "new-3"),
                (4, "new-4"),
            ]
            assert new[0]["key"] == "k"
            assert follow.poll() is None, "tail --follow ended by itself"
            follow.send_signal(signal.SIGINT)  # Ctrl-C, by PID
            code = follow.wait(15)
            assert code == 0, follow.stderr.read() if follow.stderr else code
            assert follow.stderr is not None
            assert "Traceback" not in follow.stderr.read()
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(10)
