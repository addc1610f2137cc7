"""The WindowStore contract, run against every backend (``conftest.window_backend``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tidelog.store import StoreClosed, StoreLayoutMismatch

Entry = tuple[bytes, int, bytes]


def fill(store: Any, entries: list[Entry]) -> None:
    for key, start, value in entries:
        store.put(key, value, start)


def forward_and_backward(store: Any, forward: str, backward: str, *args: Any) -> list[Entry]:
    """The forward result, after checking that the backward twin is its exact reverse."""
    ahead = list(getattr(store, forward)(*args))
    behind = list(getattr(store, backward)(*args))
    assert behind == ahead[::-1], f"{backward}{args} is not the reverse of {forward}{args}"
    return ahead


def test_put_replaces_and_none_deletes(window_backend: Any) -> None:
    store = window_backend()
    store.put(b"k", b"1", 10)
    store.put(b"k", b"2", 10)
    store.put(b"k", b"3", 20)
    assert list(store.fetch(b"k", None, None)) == [(b"k", 10, b"2"), (b"k", 20, b"3")]
    store.put(b"k", None, 10)
    assert list(store.all()) == [(b"k", 20, b"3")]


def test_duplicates_keep_insertion_order_and_ignore_none(window_backend: Any) -> None:
    store = window_backend(retain_duplicates=True)
    fill(store, [(b"k", 5, b"a"), (b"k", 5, b"b"), (b"k", 1, b"c"), (b"k", 5, b"d")])
    store.put(b"k", None, 5)  # ignored, as in Kafka
    assert forward_and_backward(store, "fetch", "backward_fetch", b"k", None, None) == [
        (b"k", 1, b"c"),
        (b"k", 5, b"a"),
        (b"k", 5, b"b"),
        (b"k", 5, b"d"),
    ]


def test_kafka_13264_shared_window_start_reverses_exactly(window_backend: Any) -> None:
    """Several keys and records in one window: backward_fetch_all/backward_all are the exact
    reverse (Kafka's in-memory store reversed segments but not the records inside them)."""
    store = window_backend(retain_duplicates=True)
    fill(store, [(b"a", 0, b"1"), (b"b", 0, b"2"), (b"c", 0, b"3"), (b"a", 0, b"4")])
    fill(store, [(b"b", 10, b"5"), (b"a", 10, b"6")])
    ordered = [
        (b"a", 0, b"1"),
        (b"a", 0, b"4"),
        (b"a", 10, b"6"),
        (b"b", 0, b"2"),
        (b"b", 10, b"5"),
        (b"c", 0, b"3"),
    ]
    assert forward_and_backward(store, "all", "backward_all") == ordered
    assert forward_and_backward(store, "fetch_all", "backward_fetch_all", 0, 0) == [
        e for e in ordered if e[1] == 0
    ]
    assert forward_and_backward(store, "fetch_all", "backward_fetch_all", None, None) == ordered
    assert list(store.backward_fetch_all(0, 0)) == [
        (b"c", 0, b"3"),
        (b"b", 0, b"2"),
        (b"a", 0, b"4"),
        (b"a", 0, b"1"),
    ]


ENTRIES = [
    (k, t, k + b"@" + str(t).encode())
    for k in [b"", b"a", b"a\x00", b"a\x00\x00", b"ab", b"b", b"\xff"]
    for t in [-100, -1, 0, 1, 50, 100]
]


@pytest.fixture
def filled(window_backend: Any) -> Any:
    store = window_backend()
    fill(store, ENTRIES)
    return store


@pytest.mark.parametrize("time_range", [(None, None), (0, 50), (-1, -1), (None, 0), (1, None)])
@pytest.mark.parametrize(
    "key_range", [(None, None), (b"a", b"a"), (b"a", b"ab"), (None, b"a\x00"), (b"a\x00", None)]
)
def test_fetch_range_bounds(filled: Any, key_range: Any, time_range: Any) -> None:
    (kf, kt), (tf, tt) = key_range, time_range
    expected = sorted(
        e
        for e in ENTRIES
        if (kf is None or e[0] >= kf)
        and (kt is None or e[0] <= kt)
        and (tf is None or e[1] >= tf)
        and (tt is None or e[1] <= tt)
    )
    got = forward_and_backward(filled, "fetch_range", "backward_fetch_range", kf, kt, tf, tt)
    assert got == expected
    if kf is not None and kf == kt:
        assert forward_and_backward(filled, "fetch", "backward_fetch", kf, tf, tt) == expected
    if kf is None and kt is None:
        assert forward_and_backward(filled, "fetch_all", "backward_fetch_all", tf, tt) == expected


def test_keys_never_interleave(filled: Any) -> None:
    """b"a" and b"a\\x00" are different keys: a per-key fetch never returns the other."""
    assert {e[0] for e in filled.fetch(b"a", None, None)} == {b"a"}
    assert {e[0] for e in filled.backward_fetch(b"a\x00", None, None)} == {b"a\x00"}


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("fetch", (b"a", 5, 4)),
        ("backward_fetch", (b"a", 5, 4)),
        ("fetch_range", (b"b", b"a", None, None)),
        ("backward_fetch_range", (b"b", b"a", 0, 1)),
        ("fetch_range", (b"a", b"b", 1, 0)),
        ("fetch_all", (1, 0)),
        ("backward_fetch_all", (1, 0)),
    ],
)
def test_from_greater_than_to_is_empty_with_warning(
    filled: Any, method: str, args: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tidelog.store"):
        assert list(getattr(filled, method)(*args)) == []
    assert len(caplog.records) == 1
    assert caplog.records[0].name == "tidelog.store"


def test_retention_expires_and_drops(window_backend: Any) -> None:
    store = window_backend(retention_ms=100, retain_duplicates=True)
    fill(store, [(b"a", 0, b"0"), (b"a", 1, b"1"), (b"b", 50, b"50"), (b"a", 100, b"100")])
    assert [e[1] for e in store.all()] == [1, 100, 50]  # 0 <= 100 - 100: expired
    store.put(b"c", b"150", 150)  # observed 150: starts <= 50 expire
    assert list(store.all()) == [(b"a", 100, b"100"), (b"c", 150, b"150")]
    assert list(store.backward_fetch_all(None, None)) == [(b"c", 150, b"150"), (b"a", 100, b"100")]
    assert list(store.fetch(b"b", None, None)) == []
    store.put(b"b", b"late", 50)  # into an expired window: dropped
    store.put(b"b", b"live", 51)
    assert list(store.fetch(b"b", 0, 200)) == [(b"b", 51, b"live")]
    assert store.approximate_num_entries() <= 4


def test_retention_must_be_positive(window_backend: Any) -> None:
    with pytest.raises(ValueError, match="retention_ms"):
        window_backend(retention_ms=0)


def test_negative_times_order_before_positive(window_backend: Any) -> None:
    store = window_backend()
    fill(store, [(b"k", 3, b"c"), (b"k", -3, b"a"), (b"k", 0, b"b")])
    assert [e[1] for e in store.fetch(b"k", None, None)] == [-3, 0, 3]
    assert [e[1] for e in store.backward_fetch(b"k", -3, 0)] == [0, -3]
    with pytest.raises(ValueError, match="64-bit"):
        store.put(b"k", b"x", 1 << 63)


def test_writes_while_iterator_open(window_backend: Any, direction: str) -> None:
    store = window_backend(retain_duplicates=True)
    fill(store, [(b"k", t, str(t).encode()) for t in range(100)])
    it = store.fetch(b"k", None, None) if direction == "forward" else store.backward_all()
    seen = [next(it) for _ in range(30)]
    for t in range(100):
        store.put(b"k", b"dup", t)
    store.put(b"j", b"x", 0)
    seen += list(it)
    originals = [e for e in seen if e[2] != b"dup" and e[0] == b"k"]
    expected = [(b"k", t, str(t).encode()) for t in range(100)]
    assert originals == (expected if direction == "forward" else expected[::-1])
    if window_backend.durable:
        assert len(seen) == 100


def test_closed_store_and_iterators(window_backend: Any) -> None:
    store = window_backend()
    fill(store, [(b"k", 0, b"a"), (b"k", 1, b"b")])
    it = store.backward_fetch(b"k", None, None)
    assert next(it) == (b"k", 1, b"b")
    with store.fetch(b"k", None, None) as early:
        next(early)
    assert list(early) == []
    store.close()
    with pytest.raises(StoreClosed):
        next(it)
    with pytest.raises(StoreClosed):
        store.put(b"k", b"c", 2)


@pytest.mark.parametrize(
    "window_backend", ["rocksdb"], indirect=True
)  # only RocksDB survives a close
def test_reopen_keeps_duplicate_order_and_retention(window_backend: Any) -> None:
    store = window_backend(retention_ms=1000, retain_duplicates=True)
    fill(store, [(b"k", 10, b"1"), (b"k", 10, b"2"), (b"k", 2000, b"x")])
    store = window_backend.reopen(store)
    fill(store, [(b"k", 2000, b"y"), (b"k", 1500, b"z"), (b"k", 999, b"expired")])
    store.put(b"k", b"3", 1001)
    assert list(store.all()) == [
        (b"k", 1001, b"3"),
        (b"k", 1500, b"z"),
        (b"k", 2000, b"x"),
        (b"k", 2000, b"y"),
    ]
    store = window_backend.reopen(store, retention_ms=600, retain_duplicates=True)
    assert [e[1] for e in store.all()] == [1500, 2000, 2000]  # swept on open
    with pytest.raises(StoreLayoutMismatch, match="retain_duplicates"):
        window_backend.reopen(store, retain_duplicates=False)


@pytest.mark.parametrize("time_range", [(5, 5), (0, 5), (5, 10), (4, 6)])
def test_duplicates_at_the_time_bounds(window_backend: Any, time_range: Any) -> None:
    """Windows just outside the range on both sides make both directions seek; every duplicate
    at the bound must survive the seek."""
    store = window_backend(retain_duplicates=True)
    for key in (b"j", b"k", b"l"):
        fill(store, [(key, t, key + str(i).encode()) for i, t in enumerate([0, 5, 5, 5, 10, -1])])
    tf, tt = time_range
    expected = sorted(
        (k, t, k + str(i).encode())
        for k in (b"j", b"k", b"l")
        for i, t in enumerate([0, 5, 5, 5, 10, -1])
        if tf <= t <= tt
    )
    assert forward_and_backward(store, "fetch_all", "backward_fetch_all", tf, tt) == expected
    assert forward_and_backward(store, "fetch", "backward_fetch", b"k", tf, tt) == [
        e for e in expected if e[0] == b"k"
    ]


@pytest.mark.parametrize("duplicates", [False, True])
def test_put_all_equals_the_puts_one_by_one(window_backend: Any, duplicates: bool) -> None:
    entries = [
        (b"a", b"1", 0),
        (b"a", b"2", 0),
        (b"b", b"3", 20),
        (b"a", None, 0),
        (b"c", b"4", 250),
        (b"b", b"5", 100),  # expired by then (observed 250, retention 200)
        (b"d", b"6", 300),
    ]
    one_by_one = window_backend(retention_ms=200, retain_duplicates=duplicates)
    for key, value, start in entries:
        one_by_one.put(key, value, start)
    at_once = window_backend(retention_ms=200, retain_duplicates=duplicates)
    at_once.put_all(entries)
    assert list(at_once.all()) == list(one_by_one.all())
    assert list(at_once.backward_all()) == list(one_by_one.backward_all())


def test_a_window_written_with_the_sweep_that_follows_it_is_swept_later(
    window_backend: Any,
) -> None:
    """A put that moves observed time far ahead sweeps everything stored; the window it writes
    itself must still be swept once it expires (storage, not only reads)."""
    store = window_backend(retention_ms=100, retain_duplicates=True)
    store.put(b"a", b"old", 0)
    store.put(b"b", b"far", 1000)  # sweeps 0; stores 1000
    store.put(b"c", b"further", 5000)  # must sweep 1000
    assert list(store.all()) == [(b"c", 5000, b"further")]
    assert store.approximate_num_entries() <= 2
    store.put_all([(b"d", b"x", 9000), (b"e", b"y", 9001)])
    store.put(b"f", b"z", 20000)
    assert list(store.all()) == [(b"f", 20000, b"z")]
