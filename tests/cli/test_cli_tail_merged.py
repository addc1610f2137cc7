"""``tidelog tail`` over every partition merged, and its server-side filters."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from tests.cli.clitools import Cli, LineReader, at_terminal, clean_env, one_error_line
from tests.support.server import ServerProcess

from tidelog.client import Client

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture
def twelve(cli: Cli, server: ServerProcess, stream: str) -> list[int]:
    """``stream`` with 3 partitions and m0..m11 published one at a time to partition i % 3,
    keys ``a``/``b`` alternating, header ``kind`` = ``x`` for every third; their timestamps."""
    assert cli("stream", "create", stream, "-p", "3").returncode == 0
    stamps = []
    with Client(server.address) as client:
        for i in range(12):
            client.publish(
                stream,
                f"m{i}".encode(),
                key=b"ab"[i % 2 : i % 2 + 1],
                headers={"kind": b"x" if i % 3 == 0 else b"y"},
                partition=i % 3,
            )
        for p in range(3):
            stamps += [
                m.timestamp for m in client.subscribe(stream, p, start="earliest", stop="latest")
            ]
    return sorted(stamps)


def values(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["value"] for line in done.stdout.splitlines()]


def iso(timestamp_ns: int, *, up: bool = False) -> str:
    """The time as ISO 8601 in microseconds, rounded down (or ``up``) so that it includes it."""
    micros = -(-timestamp_ns // 1000) if up else timestamp_ns // 1000
    return (EPOCH + timedelta(microseconds=micros)).isoformat()


def test_merged_order_and_filters(cli: Cli, stream: str, twelve: list[int]) -> None:
    calls = {
        "all": (),
        "reverse": ("--reverse",),
        "reverse_n": ("--reverse", "-n", "4"),
        "last_n": ("-n", "4"),
        "latest": ("--from", "latest"),
        "reverse_earliest": ("--reverse", "--from", "earliest"),
        "one_partition": ("--partition", "1"),
        "key": ("--key", "a"),
        "header": ("--header", "kind=x"),
        "two_headers": ("-H", "kind=x", "-H", "nope=1"),
        "grep": ("--grep", "1"),
        "grep_reverse_n": ("--grep", "1", "--reverse", "-n", "2"),
        "since": ("--since", iso(twelve[8])),
        "until": ("--until", iso(twelve[2], up=True)),
        "window": ("--since", iso(twelve[3]), "--until", iso(twelve[5], up=True), "--key", "b"),
        "offset": ("--from", "offset:3"),
    }
    results = cli.many(*(("tail", stream, "--json", *args) for args in calls.values()))
    got = {name: values(done) for name, done in zip(calls, results, strict=True)}
    everything = [f"m{i}" for i in range(12)]
    assert got == {
        "all": everything,
        "reverse": everything[::-1],
        "reverse_n": everything[::-1][:4],
        "last_n": everything[-4:],
        "latest": ["m11"],
        "reverse_earliest": ["m0"],
        "one_partition": ["m1", "m4", "m7", "m10"],
        "key": [f"m{i}" for i in range(0, 12, 2)],
        "header": [f"m{i}" for i in range(0, 12, 3)],
        "two_headers": [],
        "grep": ["m1", "m10", "m11"],
        "grep_reverse_n": ["m11", "m10"],
        "since": everything[8:],
        "until": everything[:3],
        "window": ["m3", "m5"],
        "offset": ["m9", "m10", "m11"],  # offset 3 of each partition
    }


def test_human_lines_name_the_partition_when_merged(
    cli: Cli, stream: str, twelve: list[int]
) -> None:
    merged = cli("tail", stream, "-n", "2")
    assert merged.returncode == 0, merged.stderr
    rows = [line.split("\t") for line in merged.stdout.splitlines()]
    assert [(r[0], r[-1]) for r in rows] == [("3", "m10"), ("3", "m11")]
    assert " partition=1 key=a " in rows[0][1] and " partition=2 key=b " in rows[1][1]
    single = cli("tail", stream, "-n", "1", "--partition", "2")
    assert "partition=" not in single.stdout


def test_bad_filters_exit_2(cli: Cli, stream: str, twelve: list[int]) -> None:
    cases = {
        ("--header", "novalue"): "--header takes name=value",
        ("--header", "=v"): "--header takes name=value",
        ("--since", "yesterday"): "not an ISO 8601 time",
        ("--until", "soon"): "not an ISO 8601 time",
    }
    for args, done in zip(cases, cli.many(*(("tail", stream, *a) for a in cases)), strict=True):
        assert done.returncode == 2, (args, done.stderr)
        assert cases[args] in one_error_line(done), args
    swapped = cli("tail", stream, "--since", iso(twelve[5]), "--until", iso(twelve[1]))
    assert swapped.returncode == 1
    assert "is after until" in one_error_line(swapped)


def test_follow_merges_live_partitions(cli: Cli, server: ServerProcess, stream: str) -> None:
    assert cli("stream", "create", stream, "-p", "3").returncode == 0
    with Client(server.address) as client:
        client.publish(stream, b"old", partition=2)
        follow = subprocess.Popen(
            at_terminal("tail", stream, "--follow", "--json", "--grep", "keep",
                        "--server", server.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )  # fmt: skip
        try:
            reader = LineReader(follow)
            time.sleep(1.5)  # started, and waiting at the live end
            for i, partition in enumerate([1, 0, 2, 1]):
                client.publish(stream, f"keep-{i}".encode(), partition=partition)
                client.publish(stream, b"drop", partition=partition)
            got = [json.loads(line) for line in reader.take(4)]
            assert [(m["partition"], m["value"]) for m in got] == [
                (1, "keep-0"),
                (0, "keep-1"),
                (2, "keep-2"),
                (1, "keep-3"),
            ]
            assert reader.take(1, timeout=0.5) == []  # "drop" never matches --grep
            follow.send_signal(signal.SIGINT)
            assert follow.wait(15) == 0
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(10)


def test_tail_reads_past_a_page_cut_short_by_its_byte_bound(
    cli: Cli, server: ServerProcess, stream: str
) -> None:
    """A page ends at 16 MiB of messages, well before 1,000 of 100 KB: tail goes on regardless."""
    assert cli("stream", "create", stream, "-p", "2").returncode == 0
    with Client(server.address) as client:
        for partition in (0, 1):
            client.publish_batch(
                stream, [b"%03d" % i + b"." * 100_000 for i in range(90)], partition=partition
            )
    done = cli("tail", stream, "--json")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 180
