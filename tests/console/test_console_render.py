"""How the console shows values and exports them: text, JSON, hex, previews, CSV and JSON lines."""

from __future__ import annotations

import base64
import csv
import io
import json

from tidelog.client import ReceivedMessage
from tidelog.console import render


def message(value: bytes, key: bytes | None = b"k", offset: int = 0) -> ReceivedMessage:
    return ReceivedMessage(offset, 1_795_600_000_123_456_789, key, value, {"h": b"v"}, 1, "s")


def test_text_json_and_hex_views() -> None:
    assert render.as_text("héllo".encode()) == "héllo"
    assert render.as_text(b"\xff\x00") is None
    assert render.pretty_json(b'{"a":[1,2]}') == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert render.pretty_json(b"42") is None  # a bare scalar is not worth a JSON view
    assert render.pretty_json(b"{broken") is None
    dump = render.hex_dump(bytes(range(20)))
    first, second = dump.splitlines()
    assert first.startswith("00000000  00 01 02") and first.endswith("................")
    assert second.startswith("00000010  10 11 12 13")


def test_a_preview_is_one_line_and_says_when_it_was_cut() -> None:
    assert render.preview(b"a\nb\tc") == ("a b c", False)
    text, cut = render.preview(b"x" * 500, limit=100)
    assert (len(text), cut) == (100, True)
    hexed, cut = render.preview(b"\xff" * 10)
    assert hexed.startswith("ff ff") and not cut
    assert render.preview(None) == ("", False)


def test_printable_keys_and_times() -> None:
    assert render.printable(b"key") == "key"
    assert render.printable(b"\xff\x01") == "hex:ff01"
    assert render.format_ns(1_795_600_000_123_456_789) == "2026-11-25 09:46:40.123"
    assert render.format_bytes(100_000) == "97.7 KiB"
    assert render.format_bytes(10) == "10 B"
    assert render.format_duration(7 * 86400) == "7 d"
    assert render.format_duration(36 * 3600) == "36 h"
    assert render.format_duration(90 * 60) == "90 min"
    assert render.format_duration(45) == "45 s" and render.format_duration(0.5) == "0.5 s"


def test_exports_keep_text_as_text_and_binary_as_base64() -> None:
    messages = [message(b'{"n": 1}', offset=3), message(b"\xff\xfe", key=None, offset=4)]
    lines = [json.loads(line) for line in render.export_jsonl("s", messages).splitlines()]
    assert lines[0]["value"] == '{"n": 1}' and lines[0]["key"] == "k"
    assert lines[0]["headers"] == {"h": "v"} and lines[0]["timestamp_ns"] == messages[0].timestamp
    assert lines[1]["key"] is None
    assert base64.b64decode(lines[1]["value_base64"]) == b"\xff\xfe"
    rows = list(csv.DictReader(io.StringIO(render.export_csv("s", messages))))
    assert [(r["partition"], r["offset"]) for r in rows] == [("1", "3"), ("1", "4")]
    assert rows[0]["value"] == '{"n": 1}' and rows[0]["value_base64"] == ""
    assert rows[1]["value"] == "" and base64.b64decode(rows[1]["value_base64"]) == b"\xff\xfe"


def test_a_sparkline_scales_to_its_box() -> None:
    assert render.sparkline_points([5.0]) == ""
    points = [
        tuple(map(float, p.split(",")))
        for p in render.sparkline_points([0, 10, 5], 100, 22).split()
    ]
    assert [x for x, _ in points] == [0.0, 50.0, 100.0]
    assert points[0][1] == 21.0 and points[1][1] == 1.0  # zero at the bottom, the top at the top


def test_a_filter_form_finds_exactly_the_bytes_shown() -> None:
    assert render.filter_form(b"user-7") == "user-7"
    assert render.filter_form(b"\xff\xfe") == "hex:fffe"
    assert render.filter_form(b"0xdead") == "text:0xdead"  # a text key that reads like hex
    assert render.filter_form(b"hex:00") == "text:hex:00"
    assert render.filter_form(b"text:a") == "text:text:a"
    assert (
        render.is_binary(b"\xff") and not render.is_binary(b"0xff") and not render.is_binary(None)
    )
    assert render.cell(b"k" * 100, limit=80) == ("k" * 80, True)
    assert render.cell(b"\xff", limit=80) == ("hex:ff", False)


def test_csv_cells_that_a_spreadsheet_would_run_get_a_leading_quote() -> None:
    risky = ["=1+2", "+1", "-5", "@SUM(A1)", "\tx", "\rx"]
    messages = [message(v.encode(), key=v.encode(), offset=i) for i, v in enumerate(risky)]
    messages.append(message(b"plain", key=b"a-b", offset=9))
    rows = list(csv.DictReader(io.StringIO(render.export_csv("=s", messages), newline="")))
    assert [r["value"] for r in rows] == ["'" + v for v in risky] + ["plain"]
    assert [r["key"] for r in rows] == ["'" + v for v in risky] + ["a-b"]
    assert {r["stream"] for r in rows} == {"'=s"}
    lines = [json.loads(line) for line in render.export_jsonl("s", messages).splitlines()]
    assert [line["value"] for line in lines[:-1]] == risky  # JSON lines keeps them as they are


def test_exports_tell_a_text_that_reads_like_hex_from_the_bytes_it_names() -> None:
    as_text = ReceivedMessage(1, 1, b"hex:00ff", b"v", {"h": b"hex:00ff"}, 0, "s")
    as_bytes = ReceivedMessage(2, 1, b"\x00\xff", b"v", {"h": b"\x00\xff"}, 0, "s")
    rows = list(csv.DictReader(io.StringIO(render.export_csv("s", [as_text, as_bytes]))))
    assert [r["key"] for r in rows] == ["text:hex:00ff", "hex:00ff"]
    assert [json.loads(r["headers"])["h"] for r in rows] == ["text:hex:00ff", "hex:00ff"]
    lines = [json.loads(x) for x in render.export_jsonl("s", [as_text, as_bytes]).splitlines()]
    assert [line["headers"]["h"] for line in lines] == ["text:hex:00ff", "hex:00ff"]
    assert lines[0]["key"] == "hex:00ff" and "key" not in lines[1]  # apart by field already


def test_a_base64_value_that_starts_like_a_formula_gets_a_leading_quote() -> None:
    value = base64.b64decode("+/8=")  # not UTF-8; its base64 starts with "+"
    rows = list(csv.DictReader(io.StringIO(render.export_csv("s", [message(value)]))))
    assert rows[0]["value_base64"] == "'+/8="
