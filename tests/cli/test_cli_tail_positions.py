"""``tidelog tail`` of a receive queue: ``__position`` and ``__snapshot`` (8 bytes, big-endian,
``tidelog.wire``) are printed as the numbers they hold, in text and in ``--json``; the same names
on any other stream are headers like the rest."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.cli.clitools import Cli
from tests.support.server import served

import tidelog
from tidelog.cli.tail_command import human, message_json
from tidelog.client import ReceivedMessage
from tidelog.wire import POSITION_HEADER, RECEIVE_QUEUE_PREFIX, SNAPSHOT_HEADER

QUEUE = f"{RECEIVE_QUEUE_PREFIX}orders.a"


def received(stream: str, headers: dict[str, bytes]) -> ReceivedMessage:
    return ReceivedMessage(4, 1_700_000_000_000_000_000, None, b"hello", headers, 0, stream)


def be8(number: int) -> bytes:
    return number.to_bytes(8, "big", signed=True)


@pytest.mark.parametrize("position", [0, 1, 65_536, 3 * 65_536 + 7, 2**63 - 1])
def test_a_receive_queue_position_is_shown_as_its_number(position: int) -> None:
    m = received(QUEUE, {POSITION_HEADER: be8(position)})
    assert f" {POSITION_HEADER}={position}\t" in human(m, merged=False)
    assert json.loads(message_json(m))["headers"] == {POSITION_HEADER: position}


def test_a_snapshot_record_shows_its_position_and_snapshot_id_as_numbers() -> None:
    headers = {"__kind": b"snapshot_entry", SNAPSHOT_HEADER: be8(12), POSITION_HEADER: be8(70_000)}
    m = received(QUEUE, headers)
    line = human(m, merged=False)
    assert " __kind=snapshot_entry __snapshot=12 __position=70000\t" in line
    assert json.loads(message_json(m))["headers"] == {
        "__kind": "snapshot_entry",
        SNAPSHOT_HEADER: 12,
        POSITION_HEADER: 70_000,
    }


def test_the_same_names_elsewhere_are_plain_headers() -> None:
    """Another stream's ``__position`` is an application's header: shown as given. So is a
    receive queue's one that is not 8 bytes (no sink writes one)."""
    mine = received("orders", {POSITION_HEADER: b"12345678"})
    assert f" {POSITION_HEADER}=12345678\t" in human(mine, merged=False)
    assert json.loads(message_json(mine))["headers"] == {POSITION_HEADER: "12345678"}
    short = received(QUEUE, {POSITION_HEADER: b"\xff\x01"})
    assert json.loads(message_json(short))["headers"] == {POSITION_HEADER: "base64:/wE="}


@pytest.mark.slow
def test_tail_of_a_real_receive_queue_prints_the_source_positions(tmp_path: Path) -> None:
    with (
        served(tmp_path / "a", "--site-id", "a") as a,
        served(tmp_path / "b", "--site-id", "b") as b,
    ):
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
            sent = [client.transmit("orders", b"one", ["b"])]
            sent += client.transmit_many("orders", [(b"two", ["b"]), (b"three", ["b"])])
        assert sent[1] > 0xFFFF, "the positions hold bytes that are not text (0x00, 0x01)"
        sink = Cli(b.address)
        deadline = time.monotonic() + 30
        while True:
            done = sink("tail", QUEUE, "--json")
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            if len(lines) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(x["value"], x["headers"][POSITION_HEADER]) for x in lines] == [
            ("one", sent[0]),
            ("two", sent[1]),
            ("three", sent[2]),
        ], done.stderr
        text = sink("tail", QUEUE)
        assert text.returncode == 0, text.stderr
        shown = [line.split("\t") for line in text.stdout.splitlines()]
        assert [(fields[1].split()[-1], fields[2]) for fields in shown] == [
            (f"{POSITION_HEADER}={p}", v)
            for p, v in zip(sent, ("one", "two", "three"), strict=True)
        ]
