"""The scan logic shared by window and session stores, over composite keys (key, t1, t2).

Both stores keep their entries sorted by a composite ``(key, t1, t2)`` of bytes and two ints:
window stores by (key, window start, insertion sequence), session stores by (key, end, start).
A query is a key range, an inclusive range of ``t1`` that can be sought (skip-scan) and, for
sessions, an upper bound on ``t2`` that can only be filtered. :func:`composite_step` is that query
as a step function (``tidelog.store._base``); the memory backend runs it on the tuples, the
RocksDB backend on decoded keys, with its seek targets encoded back (``encoding.py``).

Seek targets just outside the time range, :func:`before_key` and :func:`after_key`, sort before
and after every entry of a key; the RocksDB encoding maps them to the key's own prefix and to the
first byte string after all of that key's entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from tidelog.store._base import TIME_MAX, TIME_MIN, Seek, Step

T = TypeVar("T")

Composite = tuple[bytes, int, int]


def before_key(key: bytes) -> Composite:
    """Sorts before every entry of ``key`` and after every entry of smaller keys."""
    return (key, TIME_MIN - 1, 0)


def after_key(key: bytes) -> Composite:
    """Sorts after every entry of ``key`` and before every entry of greater keys."""
    return (key, TIME_MAX + 1, 0)


def composite_bounds(
    key_from: bytes | None, key_to: bytes | None, t1_from: int, t1_to: int
) -> tuple[Composite | None, Composite | None]:
    """Inclusive scan bounds: from (key_from, t1_from) to (key_to, t1_to); None keys are open."""
    lower = None if key_from is None else (key_from, t1_from, TIME_MIN)
    upper = None if key_to is None else (key_to, t1_to, TIME_MAX)
    return lower, upper


def composite_step(
    t1_from: int,
    t1_to: int,
    *,
    forward: bool,
    emit: Callable[[bytes, int, int, bytes], T],
    t2_max: int | None = None,
) -> Step[Composite, T]:
    """Yield ``emit(key, t1, t2, value)`` for entries with ``t1_from <= t1 <= t1_to`` and
    ``t2 <= t2_max``; seek past runs of a key's entries outside the ``t1`` range."""

    def step(composite: Composite, value: bytes) -> T | Seek[Composite] | None:
        key, t1, t2 = composite
        if t1 < t1_from:
            return Seek((key, t1_from, TIME_MIN)) if forward else Seek(before_key(key))
        if t1 > t1_to:
            return Seek(after_key(key)) if forward else Seek((key, t1_to, TIME_MAX))
        if t2_max is not None and t2 > t2_max:
            return None
        return emit(key, t1, t2, value)

    return step


class CompositeScan(NamedTuple, Generic[T]):
    """A query as one scan of composites: inclusive bounds (None: open) and the step that
    filters entries and turns them into results. Either backend runs it."""

    lower: Composite | None
    upper: Composite | None
    step: Step[Composite, T]


def composite_scan(
    key_from: bytes | None,
    key_to: bytes | None,
    t1_from: int,
    t1_to: int,
    *,
    forward: bool,
    emit: Callable[[bytes, int, int, bytes], T],
    t2_max: int | None = None,
) -> CompositeScan[T]:
    """:func:`composite_bounds` and :func:`composite_step` of one query, together."""
    lower, upper = composite_bounds(key_from, key_to, t1_from, t1_to)
    step = composite_step(t1_from, t1_to, forward=forward, emit=emit, t2_max=t2_max)
    return CompositeScan(lower, upper, step)
