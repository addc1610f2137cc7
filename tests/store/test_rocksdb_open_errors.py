"""Opening a RocksDB store: the failures a caller can act on come out as their own errors
(RocksDB's binding raises a plain ``Exception`` with the system's words)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.errors import DiskFull, OutOfDescriptors
from tidelog.store import _rocksdb


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("IO error: While open a file for appending: x/LOG: Too many open files", OutOfDescriptors),
        ("IO error: While appending to file: x/000003.log: No space left on device", DiskFull),
        ("IO error: While appending to file: x/000003.log: Disk quota exceeded", DiskFull),
    ],
)
def test_a_known_failure_to_open_is_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, kind: type[Exception]
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise Exception(text)

    monkeypatch.setattr(_rocksdb, "Rdict", refuse)
    with pytest.raises(kind) as raised:
        _rocksdb._open(str(tmp_path / "store"), _rocksdb._options(), {})
    assert str(tmp_path / "store") in str(raised.value)


def test_another_failure_is_raised_as_it_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise Exception("Corruption: bad block")

    monkeypatch.setattr(_rocksdb, "Rdict", refuse)
    with pytest.raises(Exception, match="Corruption"):
        _rocksdb._open(str(tmp_path / "store"), _rocksdb._options(), {})
