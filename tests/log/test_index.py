"""The dense offset index: append, growth, truncation, sealing, and the file helpers."""

from __future__ import annotations

import numpy as np
import pytest

from tidelog.log.index import (
    ENTRY_SIZE,
    INDEX_DTYPE,
    Index,
    read_index_file,
    write_index_file,
)

PREALLOCATE = 20 * 64  # the smallest step LogConfig allows: 64 entries


def entries(first_rel: int, count: int, *, position: int = 0, size: int = 40) -> np.ndarray:
    out = np.zeros(count, dtype=INDEX_DTYPE)
    out["rel"] = np.arange(first_rel, first_rel + count)
    out["timestamp"] = 1_000 + np.arange(first_rel, first_rel + count) * 10
    out["position"] = position + np.arange(count) * size
    out["size"] = size
    return out


def as_list(array: np.ndarray) -> list[tuple[int, int, int, int]]:
    return [tuple(int(x) for x in row) for row in array.tolist()]


@pytest.fixture
def index(tmp_path):
    idx = Index(tmp_path / "0.index", 0, writable=True, preallocate_bytes=PREALLOCATE)
    yield idx
    idx.close()


def test_a_new_active_index_is_preallocated_and_empty(index, tmp_path):
    assert index.count == 0 and len(index.entries) == 0
    assert (tmp_path / "0.index").stat().st_size == PREALLOCATE


def test_preallocation_is_rounded_down_to_whole_entries(tmp_path):
    idx = Index(tmp_path / "odd.index", 0, writable=True, preallocate_bytes=PREALLOCATE + 7)
    try:
        assert (tmp_path / "odd.index").stat().st_size == PREALLOCATE
    finally:
        idx.close()


def test_append_stores_entries_in_order(index, tmp_path):
    index.append(entries(0, 3))
    index.append(entries(5, 2, position=120))
    assert index.count == 5
    expected = as_list(np.concatenate([entries(0, 3), entries(5, 2, position=120)]))
    assert as_list(index.entries) == expected
    assert as_list(read_index_file(tmp_path / "0.index")[:5]) == expected


def test_append_grows_the_file_past_its_preallocation(index, tmp_path):
    first = entries(0, 60)
    index.append(first)
    more = entries(60, 100, position=60 * 40)
    index.append(more)
    assert index.count == 160
    size = (tmp_path / "0.index").stat().st_size
    assert size >= 160 * ENTRY_SIZE and size % ENTRY_SIZE == 0
    assert as_list(index.entries) == as_list(np.concatenate([first, more]))
    # Slots after the entries stay zero: recovery relies on that to find the end.
    tail = read_index_file(tmp_path / "0.index")[160:]
    assert len(tail) and not tail.tobytes().strip(b"\0")


def test_truncate_forgets_and_zeroes_entries(index, tmp_path):
    index.append(entries(0, 10))
    index.truncate(4)
    assert index.count == 4
    assert as_list(index.entries) == as_list(entries(0, 4))
    assert not read_index_file(tmp_path / "0.index")[4:10].tobytes().strip(b"\0")
    index.truncate(8)  # not a way to bring entries back
    assert index.count == 4
    index.append(entries(20, 2, position=160))
    assert as_list(index.entries) == as_list(
        np.concatenate([entries(0, 4), entries(20, 2, position=160)])
    )


def test_seal_trims_the_file_and_maps_it_read_only(index, tmp_path):
    index.append(entries(0, 7))
    index.sync()
    index.seal()
    assert not index.writable
    assert (tmp_path / "0.index").stat().st_size == 7 * ENTRY_SIZE
    assert as_list(index.entries) == as_list(entries(0, 7))
    index.seal()  # idempotent
    assert (tmp_path / "0.index").stat().st_size == 7 * ENTRY_SIZE


def test_a_sealed_index_reopens_read_only_with_its_entries(index, tmp_path):
    index.append(entries(0, 7))
    index.seal()
    index.close()
    reopened = Index(tmp_path / "0.index", 7, writable=False, preallocate_bytes=PREALLOCATE)
    try:
        assert as_list(reopened.entries) == as_list(entries(0, 7))
    finally:
        reopened.close()


def test_an_empty_sealed_index_has_no_entries(tmp_path):
    (tmp_path / "e.index").write_bytes(b"")
    idx = Index(tmp_path / "e.index", 0, writable=False, preallocate_bytes=PREALLOCATE)
    try:
        assert len(idx.entries) == 0
    finally:
        idx.close()


def test_reopening_writable_keeps_entries_and_appends_after_them(index, tmp_path):
    index.append(entries(0, 5))
    index.seal()
    index.close()
    reopened = Index(tmp_path / "0.index", 5, writable=True, preallocate_bytes=PREALLOCATE)
    try:
        reopened.append(entries(5, 3, position=200))
        assert as_list(reopened.entries) == as_list(
            np.concatenate([entries(0, 5), entries(5, 3, position=200)])
        )
    finally:
        reopened.close()


def test_read_index_file_ignores_a_partial_trailing_entry_and_missing_files(tmp_path):
    path = tmp_path / "p.index"
    path.write_bytes(entries(0, 3).tobytes() + b"\x01\x02\x03")
    assert as_list(read_index_file(path)) == as_list(entries(0, 3))
    assert len(read_index_file(tmp_path / "missing.index")) == 0


def test_write_index_file_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "w.index"
    path.write_bytes(b"\xff" * 100)
    write_index_file(path, entries(3, 4))
    assert as_list(read_index_file(path)) == as_list(entries(3, 4))
    assert path.stat().st_size == 4 * ENTRY_SIZE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.index"]
