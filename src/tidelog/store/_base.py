"""What every store backend shares: bounds checks, the store lifecycle and the iterator shell.

Scans are written once as a *step function* over the backend's sorted entries: for each entry
in scan order it returns the item to yield, ``None`` to skip the entry, or a :class:`Seek` to
jump (a skip-scan: e.g. from a key's windows before ``time_from`` straight to the first one at
``time_from``). The backends (``_memory_scan``, ``_rocksdb``) move a cursor and call it, in
either direction, so forward and backward scans share one definition of what matches and are
exact reverses of each other by construction.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from tidelog.errors import StoreClosed

logger = logging.getLogger("tidelog.store")

T = TypeVar("T")
K = TypeVar("K")

#: The signed 64-bit range every stored time must fit (the RocksDB layout stores 8 bytes).
TIME_MIN = -(1 << 63)
TIME_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Seek(Generic[K]):
    """Move the scan to ``target``: forward, to the first entry >= target; backward, to the last
    entry <= target. The target always lies ahead of the entry that asked for it."""

    target: K


#: Given a stored (key, value), what to do: yield an item, skip (None), or seek.
Step = Callable[[K, bytes], T | Seek[K] | None]


def check_time(name: str, value: int) -> int:
    """``value`` if it fits the stored time range, else ``ValueError``."""
    if not TIME_MIN <= value <= TIME_MAX:
        raise ValueError(f"{name}={value} is outside the signed 64-bit millisecond range")
    return value


def clamp_time(value: int | None, default: int) -> int:
    """A query time bound inside the stored range (None: ``default``, the open end)."""
    if value is None:
        return default
    return min(max(value, TIME_MIN), TIME_MAX)


def swapped(method: str, lower: Any, upper: Any, what: str = "") -> bool:
    """True (and a warning) when ``lower > upper`` with both set: the range is empty."""
    if lower is None or upper is None or lower <= upper:
        return False
    logger.warning(
        "%s: %sfrom %r is greater than %sto %r, so the range is empty; bounds are never swapped, "
        "use the reverse_/backward_ method for descending order",
        method,
        what,
        lower,
        what,
        upper,
    )
    return True


def next_prefix(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``; None when
    there is none (the empty prefix, or one of only 0xFF bytes)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class StoreIteratorBase(Generic[T]):
    """The :class:`~tidelog.store.contract.StoreIterator` shell: lifecycle and store checks.

    Subclasses implement ``_advance`` (the next item, or ``StopIteration``) and ``_release``.
    """

    def __init__(self, store: StoreBase) -> None:
        self._store = store
        self._closed = False
        self._released = False
        store._track(self)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        self._store._check_open()
        try:
            return self._advance()
        except StopIteration:
            self.close()
            raise

    def close(self) -> None:
        self._closed = True
        self._free()

    def _free(self) -> None:
        if not self._released:
            self._released = True
            self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _advance(self) -> T:
        raise NotImplementedError

    def _release(self) -> None:
        """Free backend resources; called once."""


class EmptyIterator(StoreIteratorBase[T]):
    """The iterator of an empty range."""

    def _advance(self) -> T:
        raise StopIteration


class StoreBase:
    """Lifecycle shared by every store: close, flush, context manager, open-iterator tracking."""

    def __init__(self) -> None:
        self._closed = False
        self._open_iterators: weakref.WeakSet[StoreIteratorBase[Any]] = weakref.WeakSet()

    def _name(self) -> str:
        return type(self).__name__

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(self._name())

    def _track(self, iterator: StoreIteratorBase[Any]) -> None:
        self._check_open()
        self._open_iterators.add(iterator)

    def _close_iterators(self) -> None:
        # Their next step raises StoreClosed (checked before the closed-iterator case would
        # make it a quiet StopIteration): a reader learns its store went away.
        for iterator in list(self._open_iterators):
            iterator._free()
        self._open_iterators.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._close_iterators()
        self._closed = True
        self._close_backend()

    def _close_backend(self) -> None:
        """Release the backend (RocksDB: close the database)."""

    def flush(self) -> None:
        self._check_open()

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
