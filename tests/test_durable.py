"""Atomic replacement of a state file (``tidelog.durable``): the new content whole, or, when a
write or a sync fails, the old file untouched and no temp file left behind. The log's own writes
through the same helpers are tested with the log (``tests/log/test_write_faults.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.durable import SYNC, WRITE, faults, replace_bytes, replace_json
from tidelog.errors import DiskFull


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    faults.clear()
    yield
    faults.clear()


def test_replace_json_writes_a_new_file_and_replaces_an_old_one(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    replace_json(path, {"a": 1})
    replace_json(path, {"b": [2, 3]}, indent=1, sort_keys=True)
    assert json.loads(path.read_text()) == {"b": [2, 3]}
    assert path.read_text() == json.dumps({"b": [2, 3]}, indent=1, sort_keys=True)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_replace_bytes_writes_exactly_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "index.bin"
    replace_bytes(path, b"\x00old")
    replace_bytes(path, b"\x01new\xff")
    assert path.read_bytes() == b"\x01new\xff"


@pytest.mark.parametrize("op", [WRITE, SYNC])
def test_a_failed_replacement_keeps_the_old_file_and_no_temp_file(tmp_path: Path, op: str) -> None:
    path = tmp_path / "state.json"
    replace_json(path, {"kept": True})
    faults.fail("state.json", op=op)
    with pytest.raises(DiskFull):
        replace_json(path, {"kept": False})
    assert faults.hits, "the fault was never reached"
    assert json.loads(path.read_text()) == {"kept": True}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
