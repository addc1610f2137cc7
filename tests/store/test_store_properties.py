"""Properties, for random stores and any bounds (None, equal, swapped, duplicates included):
every forward query equals a plain sorted-list model, and every backward query is exactly the
reversed forward query. Each example runs on both backends."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.store import (
    InMemoryKeyValueStore,
    InMemorySessionStore,
    InMemoryWindowStore,
    RocksDBKeyValueStore,
    RocksDBSessionStore,
    RocksDBWindowStore,
)

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Few distinct keys and times, so that keys share windows and bounds land on stored entries;
# b"a" / b"a\x00" / b"\x00\x00" test the prefix-free encoding.
keys = st.sampled_from([b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"ab", b"b", b"\xff"])
times = st.integers(-4, 4)
opt_keys = st.none() | keys
opt_times = st.none() | times
values = st.binary(min_size=1, max_size=3)


@contextmanager
def both_backends(
    memory: Callable[..., Any], rocksdb: Callable[..., Any], **kwargs: Any
) -> Iterator[list[Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        stores = [memory(**kwargs), rocksdb(Path(tmp) / "db", **kwargs)]
        try:
            yield stores
        finally:
            for store in stores:
                store.close()


def within(value: Any, lower: Any, upper: Any) -> bool:
    return (lower is None or value >= lower) and (upper is None or value <= upper)


def swapped(lower: Any, upper: Any) -> bool:
    return lower is not None and upper is not None and lower > upper


def check(
    store: Any, forward: str, backward: str, args: tuple[Any, ...], expected: list[Any]
) -> None:
    ahead = list(getattr(store, forward)(*args))
    assert ahead == expected, (type(store).__name__, forward, args)
    assert list(getattr(store, backward)(*args)) == ahead[::-1], (type(store).__name__, backward)


@SETTINGS
@given(
    ops=st.lists(st.tuples(keys, st.none() | values), max_size=30),
    queries=st.lists(st.tuples(opt_keys, opt_keys, keys), min_size=1, max_size=8),
)
def test_key_value_store_matches_model(ops: Any, queries: Any) -> None:
    model: dict[bytes, bytes] = {}
    for key, value in ops:
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    with both_backends(InMemoryKeyValueStore, RocksDBKeyValueStore) as stores:
        for store in stores:
            store.put_all(ops[: len(ops) // 2])
            for key, value in ops[len(ops) // 2 :]:
                store.put(key, value)
            ordered = sorted(model.items())
            check(store, "all", "reverse_all", (), ordered)
            for lower, upper, prefix in queries:
                expected = (
                    []
                    if swapped(lower, upper)
                    else [kv for kv in ordered if within(kv[0], lower, upper)]
                )
                check(store, "range", "reverse_range", (lower, upper), expected)
                assert list(store.prefix_scan(prefix)) == [
                    kv for kv in ordered if kv[0].startswith(prefix)
                ]


@SETTINGS
@given(
    retain_duplicates=st.booleans(),
    retention_ms=st.none() | st.integers(1, 8),
    ops=st.lists(st.tuples(keys, times, st.none() | values), max_size=30),
    queries=st.lists(st.tuples(opt_keys, opt_keys, opt_times, opt_times), min_size=1, max_size=8),
)
def test_window_store_matches_model(
    retain_duplicates: bool, retention_ms: int | None, ops: Any, queries: Any
) -> None:
    model: dict[tuple[bytes, int, int], bytes] = {}
    observed: int | None = None
    for seq, (key, start, value) in enumerate(ops):
        live_from = (
            None if retention_ms is None or observed is None else observed - retention_ms + 1
        )
        if live_from is not None and start < live_from:
            continue  # a put into an expired window is dropped
        if observed is None or start > observed:
            observed = start  # every other put advances observed time, even a None one
        if retain_duplicates:
            if value is not None:
                model[(key, start, seq)] = value
        elif value is None:
            model.pop((key, start, 0), None)
        else:
            model[(key, start, 0)] = value
    live_from = None if retention_ms is None or observed is None else observed - retention_ms + 1
    ordered = [
        (k, t, v) for (k, t, _), v in sorted(model.items()) if live_from is None or t >= live_from
    ]
    with both_backends(
        InMemoryWindowStore,
        RocksDBWindowStore,
        retention_ms=retention_ms,
        retain_duplicates=retain_duplicates,
    ) as stores:
        for store in stores:
            for key, start, value in ops:
                store.put(key, value, start)
            check(store, "all", "backward_all", (), ordered)
            for key_from, key_to, time_from, time_to in queries:
                empty = swapped(key_from, key_to) or swapped(time_from, time_to)
                expected = (
                    []
                    if empty
                    else [
                        e
                        for e in ordered
                        if within(e[0], key_from, key_to) and within(e[1], time_from, time_to)
                    ]
                )
                check(
                    store,
                    "fetch_range",
                    "backward_fetch_range",
                    (key_from, key_to, time_from, time_to),
                    expected,
                )
                check(
                    store,
                    "fetch_all",
                    "backward_fetch_all",
                    (time_from, time_to),
                    [e for e in ordered if within(e[1], time_from, time_to)]
                    if not swapped(time_from, time_to)
                    else [],
                )
                if key_from is not None:
                    check(
                        store,
                        "fetch",
                        "backward_fetch",
                        (key_from, time_from, time_to),
                        [
                            e
                            for e in ordered
                            if e[0] == key_from and within(e[1], time_from, time_to)
                        ]
                        if not swapped(time_from, time_to)
                        else [],
                    )


sessions = st.tuples(keys, times, st.integers(0, 12), st.none() | values).map(
    lambda s: (s[0], s[1], s[1] + s[2], s[3])
)


@SETTINGS
@given(
    ops=st.lists(sessions, max_size=30),
    queries=st.lists(st.tuples(opt_keys, opt_keys, opt_times, opt_times), min_size=1, max_size=8),
)
def test_session_store_matches_model(ops: Any, queries: Any) -> None:
    model: dict[tuple[bytes, int, int], bytes] = {}
    for key, start, end, value in ops:
        if value is None:
            model.pop((key, end, start), None)
        else:
            model[(key, end, start)] = value
    ordered = [(k, start, end, v) for (k, end, start), v in sorted(model.items())]
    with both_backends(InMemorySessionStore, RocksDBSessionStore) as stores:
        for store in stores:
            for key, start, end, value in ops:
                store.put(key, start, end, value)
            for key_from, key_to, earliest_end, latest_start in queries:
                in_keys = (
                    []
                    if swapped(key_from, key_to)
                    else [s for s in ordered if within(s[0], key_from, key_to)]
                )
                check(store, "fetch_range", "backward_fetch_range", (key_from, key_to), in_keys)
                found = [
                    s
                    for s in in_keys
                    if within(s[2], earliest_end, None) and within(s[1], None, latest_start)
                ]
                check(
                    store,
                    "find_sessions_range",
                    "backward_find_sessions_range",
                    (key_from, key_to, earliest_end, latest_start),
                    found,
                )
                if key_from is not None:
                    of_key = [s for s in ordered if s[0] == key_from]
                    check(store, "fetch", "backward_fetch", (key_from,), of_key)
                    check(
                        store,
                        "find_sessions",
                        "backward_find_sessions",
                        (key_from, earliest_end, latest_start),
                        [
                            s
                            for s in of_key
                            if within(s[2], earliest_end, None) and within(s[1], None, latest_start)
                        ],
                    )
