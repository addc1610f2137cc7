"""The SessionStore contract, run against every backend (``conftest.session_backend``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tidelog.store import StoreClosed

Session = tuple[bytes, int, int, bytes]


def fill(store: Any, sessions: list[Session]) -> None:
    for key, start, end, value in sessions:
        store.put(key, start, end, value)


def forward_and_backward(store: Any, forward: str, backward: str, *args: Any) -> list[Session]:
    ahead = list(getattr(store, forward)(*args))
    behind = list(getattr(store, backward)(*args))
    assert behind == ahead[::-1], f"{backward}{args} is not the reverse of {forward}{args}"
    return ahead


def by_key_end_start(sessions: list[Session]) -> list[Session]:
    return sorted(sessions, key=lambda s: (s[0], s[2], s[1]))


SESSIONS = [
    (b"a", 0, 0, b"a0"),
    (b"a", 0, 10, b"a0-10"),
    (b"a", 5, 10, b"a5-10"),
    (b"a", 20, 30, b"a20-30"),
    (b"a\x00", 0, 10, b"z0-10"),
    (b"b", -10, 100, b"b-10-100"),
    (b"b", 5, 10, b"b5-10"),
    (b"c", 40, 40, b"c40"),
]


@pytest.fixture
def filled(session_backend: Any) -> Any:
    store = session_backend()
    fill(store, SESSIONS)
    return store


def test_put_fetch_remove(session_backend: Any) -> None:
    store = session_backend()
    store.put(b"k", 1, 5, b"x")
    assert store.fetch_session(b"k", 1, 5) == b"x"
    assert store.fetch_session(b"k", 1, 6) is None
    store.put(b"k", 1, 5, b"y")
    assert list(store.fetch(b"k")) == [(b"k", 1, 5, b"y")]
    store.remove(b"k", 1, 5)
    assert store.fetch_session(b"k", 1, 5) is None
    store.put(b"k", 2, 3, b"z")
    store.put(b"k", 2, 3, None)
    assert list(store.fetch(b"k")) == []
    with pytest.raises(ValueError, match="start"):
        store.put(b"k", 5, 1, b"bad")


def test_order_is_key_end_start(filled: Any) -> None:
    expected = by_key_end_start(SESSIONS)
    assert forward_and_backward(filled, "fetch_range", "backward_fetch_range", None, None) == (
        expected
    )
    assert forward_and_backward(filled, "fetch", "backward_fetch", b"a") == [
        s for s in expected if s[0] == b"a"
    ]


def test_kafka_13309_key_range_with_shared_session_window(session_backend: Any) -> None:
    """Sessions of several keys in one window: backward key-range fetches are the exact reverse
    (Kafka's in-memory store got the order of records in the same session window wrong)."""
    store = session_backend()
    fill(store, [(b"a", 0, 10, b"1"), (b"b", 0, 10, b"2"), (b"a", 5, 10, b"3")])
    fill(store, [(b"c", 0, 10, b"4"), (b"b", 0, 5, b"5")])
    expected = [
        (b"a", 0, 10, b"1"),
        (b"a", 5, 10, b"3"),
        (b"b", 0, 5, b"5"),
        (b"b", 0, 10, b"2"),
        (b"c", 0, 10, b"4"),
    ]
    assert forward_and_backward(store, "fetch_range", "backward_fetch_range", b"a", b"c") == (
        expected
    )
    assert forward_and_backward(
        store, "find_sessions_range", "backward_find_sessions_range", b"a", b"c", 10, 0
    ) == [s for s in expected if s[2] >= 10 and s[1] <= 0]


@pytest.mark.parametrize(
    "times", [(None, None), (10, 10), (0, 5), (11, 40), (30, 0), (None, 4), (35, None), (200, 300)]
)
@pytest.mark.parametrize("keys", [(None, None), (b"a", b"a"), (b"a", b"b"), (b"a\x00", None)])
def test_find_sessions_bounds(filled: Any, keys: Any, times: Any) -> None:
    (kf, kt), (earliest_end, latest_start) = keys, times
    expected = by_key_end_start(
        [
            s
            for s in SESSIONS
            if (kf is None or s[0] >= kf)
            and (kt is None or s[0] <= kt)
            and (earliest_end is None or s[2] >= earliest_end)
            and (latest_start is None or s[1] <= latest_start)
        ]
    )
    args = (kf, kt, earliest_end, latest_start)
    got = forward_and_backward(filled, "find_sessions_range", "backward_find_sessions_range", *args)
    assert got == expected
    if kf is not None and kf == kt:
        assert (
            forward_and_backward(
                filled, "find_sessions", "backward_find_sessions", kf, earliest_end, latest_start
            )
            == expected
        )


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("fetch_range", (b"b", b"a")),
        ("backward_fetch_range", (b"b", b"a")),
        ("find_sessions_range", (b"b", b"a", 0, 10)),
        ("backward_find_sessions_range", (b"b", b"a", None, None)),
    ],
)
def test_key_from_greater_than_to_is_empty_with_warning(
    filled: Any, method: str, args: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tidelog.store"):
        assert list(getattr(filled, method)(*args)) == []
    assert [r.name for r in caplog.records] == ["tidelog.store"]


def test_earliest_end_after_latest_start_is_a_query_not_a_swap(
    filled: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """end >= 50 and start <= 0: the sessions spanning [0, 50]; no warning."""
    with caplog.at_level(logging.WARNING, logger="tidelog.store"):
        assert list(filled.find_sessions(b"b", 50, 0)) == [(b"b", -10, 100, b"b-10-100")]
    assert caplog.records == []


def test_writes_while_iterator_open(session_backend: Any, direction: str) -> None:
    store = session_backend()
    fill(store, [(b"k", t, t + 1, b"v") for t in range(50)])
    it = store.fetch(b"k") if direction == "forward" else store.backward_fetch(b"k")
    seen = [next(it) for _ in range(10)]
    for t in range(50):
        store.put(b"k", t, t + 2, b"new")
    seen += list(it)
    originals = [s for s in seen if s[3] == b"v"]
    expected = [(b"k", t, t + 1, b"v") for t in range(50)]
    assert originals == (expected if direction == "forward" else expected[::-1])


def test_closed_store(filled: Any) -> None:
    it = filled.backward_fetch(b"a")
    next(it)
    filled.close()
    with pytest.raises(StoreClosed):
        next(it)
    with pytest.raises(StoreClosed):
        filled.fetch_session(b"a", 0, 0)


@pytest.mark.parametrize(
    "session_backend", ["rocksdb"], indirect=True
)  # only RocksDB survives a close
def test_reopen_keeps_sessions_and_longest(session_backend: Any) -> None:
    store = session_backend()
    fill(store, SESSIONS)
    store.flush()
    store = session_backend.reopen(store)
    assert list(store.fetch_range(None, None)) == by_key_end_start(SESSIONS)
    # Needs the persisted longest session (110 ms) to scan far enough past latest_start.
    assert list(store.find_sessions(b"b", 90, -5)) == [(b"b", -10, 100, b"b-10-100")]
