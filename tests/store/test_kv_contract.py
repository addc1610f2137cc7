"""The KeyValueStore contract, run against every backend (``conftest.kv_backend``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tidelog.store import StoreClosed

KEYS = [b"", b"\x00", b"1", b"11", b"13", b"2", b"a", b"a\x00", b"ab", b"\xff", b"\xff\x01"]


@pytest.fixture
def store(kv_backend: Any) -> Any:
    store = kv_backend()
    store.put_all((k, b"v" + k) for k in KEYS)
    return store


def pairs(keys: list[bytes]) -> list[tuple[bytes, bytes]]:
    return [(k, b"v" + k) for k in keys]


def test_get_put_delete(kv_backend: Any) -> None:
    store = kv_backend()
    assert store.get(b"k") is None
    store.put(b"k", b"1")
    store.put(b"k", b"2")
    assert store.get(b"k") == b"2"
    assert store.delete(b"k") == b"2"
    assert store.delete(b"k") is None
    store.put(b"k", b"3")
    store.put(b"k", None)  # None deletes, as in Kafka
    assert store.get(b"k") is None
    assert list(store.all()) == []


def test_put_all_applies_in_order_and_none_deletes(kv_backend: Any) -> None:
    store = kv_backend()
    store.put_all([(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"b", None)])
    assert list(store.all()) == [(b"a", b"3")]


def test_all_is_unsigned_byte_order(store: Any) -> None:
    assert list(store.all()) == pairs(sorted(KEYS))
    assert list(store.reverse_all()) == pairs(sorted(KEYS, reverse=True))
    assert store.approximate_num_entries() > 0


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        (b"1", b"2"),
        (b"11", b"11"),
        (b"10", b"12"),
        (None, b"1"),
        (b"a", None),
        (None, None),
        (b"\x00", b"\x00"),
        (b"zz", None),
    ],
)
def test_range_bounds_inclusive_none_open(store: Any, lower: Any, upper: Any) -> None:
    expected = [
        k for k in sorted(KEYS) if (lower is None or k >= lower) and (upper is None or k <= upper)
    ]
    assert list(store.range(lower, upper)) == pairs(expected)
    assert list(store.reverse_range(lower, upper)) == pairs(expected[::-1])


@pytest.mark.parametrize("method", ["range", "reverse_range"])
def test_from_greater_than_to_is_empty_with_warning(
    store: Any, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tidelog.store"):
        assert list(getattr(store, method)(b"2", b"1")) == []
    assert [r.name for r in caplog.records] == ["tidelog.store"]
    assert method in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b"1", [b"1", b"11", b"13"]),
        (b"11", [b"11"]),
        (b"a", [b"a", b"a\x00", b"ab"]),
        (b"\xff", [b"\xff", b"\xff\x01"]),
        (b"\xff\xff", []),
        (b"", sorted(KEYS)),
        (b"\x00", [b"\x00"]),
        (b"3", []),
    ],
)
def test_prefix_scan_is_half_open_by_bytes(store: Any, prefix: bytes, expected: Any) -> None:
    assert list(store.prefix_scan(prefix)) == pairs(expected)


def test_prefix_scan_does_not_match_following_prefix(kv_backend: Any) -> None:
    store = kv_backend()
    store.put_all([(b"1", b"x"), (b"11", b"y"), (b"2", b"z")])
    assert [k for k, _ in store.prefix_scan(b"1")] == [b"1", b"11"]


def test_writes_while_iterator_open(store: Any, kv_backend: Any, direction: str) -> None:
    forward = direction == "forward"
    it = store.all() if forward else store.reverse_all()
    first = next(it)
    present = [k for k in sorted(KEYS, reverse=not forward) if k != first[0]]
    store.put(b"new-after", b"n")  # may or may not be seen (memory); never seen (RocksDB)
    store.put(first[0], None)  # behind the cursor
    store.put(b"11", b"changed")
    rest = list(it)
    keys = [k for k, _ in rest]
    assert len(keys) == len(set(keys))
    assert [k for k in keys if k != b"new-after"] == present  # none skipped, none repeated
    if kv_backend.durable:  # a snapshot: the changes are invisible
        assert rest == pairs(present)


def test_closed_iterator_is_exhausted(store: Any) -> None:
    it = store.all()
    next(it)
    it.close()
    it.close()
    assert list(it) == []
    with store.reverse_range(None, None) as it2:
        assert next(it2) == (b"\xff\x01", b"v\xff\x01")
    assert list(it2) == []


def test_closed_store_raises(store: Any) -> None:
    it = store.all()
    next(it)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosed):
        next(it)
    for call in (
        lambda: store.get(b"1"),
        lambda: store.put(b"1", b"x"),
        lambda: store.range(None, None),
        lambda: store.approximate_num_entries(),
        lambda: store.flush(),
    ):
        with pytest.raises(StoreClosed, match="closed"):
            call()


def test_context_manager_closes(kv_backend: Any) -> None:
    with kv_backend() as store:
        store.put(b"a", b"1")
        store.flush()
    with pytest.raises(StoreClosed):
        store.get(b"a")


@pytest.mark.parametrize("kv_backend", ["rocksdb"], indirect=True)  # only RocksDB survives a close
def test_reopen_keeps_data(kv_backend: Any) -> None:
    store = kv_backend()
    store.put_all([(b"a", b"1"), (b"b", b"2")])
    store.put(b"c", b"3")
    store.flush()
    store = kv_backend.reopen(store)
    assert list(store.all()) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
