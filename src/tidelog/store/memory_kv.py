"""The in-memory key-value store: a ``SortedDict`` of bytes, scanned lazily in either direction."""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from tidelog.store._base import EmptyIterator, StoreBase, next_prefix, swapped
from tidelog.store._memory_scan import SortedScan
from tidelog.store.contract import StoreIterator

KV = tuple[bytes, bytes]


def _pair(key: bytes, value: bytes) -> KV:
    return key, value


class InMemoryKeyValueStore(StoreBase):
    """A :class:`~tidelog.store.contract.KeyValueStore` in a sorted map; nothing is durable.

    Iterators are weakly consistent (``tidelog.store._memory_scan``): they never copy the key
    set, so opening one is O(log M).
    """

    def __init__(self) -> None:
        super().__init__()
        self._data = SortedDict()

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        value: bytes | None = self._data.get(key)
        return value

    def put(self, key: bytes, value: bytes | None) -> None:
        self._check_open()
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = value

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._check_open()
        for key, value in entries:
            self.put(key, value)

    def delete(self, key: bytes) -> bytes | None:
        self._check_open()
        old: bytes | None = self._data.pop(key, None)
        return old

    def _scan(
        self, method: str, lower: bytes | None, upper: bytes | None, *, forward: bool
    ) -> StoreIterator[KV]:
        self._check_open()
        if swapped(method, lower, upper, "key "):
            return EmptyIterator(self)
        return SortedScan(self, self._data, lower, upper, forward=forward, step=_pair)

    def range(self, from_key: bytes | None, to_key: bytes | None) -> StoreIterator[KV]:
        return self._scan("range", from_key, to_key, forward=True)

    def reverse_range(self, from_key: bytes | None, to_key: bytes | None) -> StoreIterator[KV]:
        return self._scan("reverse_range", from_key, to_key, forward=False)

    def all(self) -> StoreIterator[KV]:
        return self._scan("all", None, None, forward=True)

    def reverse_all(self) -> StoreIterator[KV]:
        return self._scan("reverse_all", None, None, forward=False)

    def prefix_scan(self, prefix: bytes) -> StoreIterator[KV]:
        self._check_open()
        upper = next_prefix(prefix)
        return SortedScan(
            self, self._data, prefix, upper, forward=True, step=_pair, upper_inclusive=False
        )

    def approximate_num_entries(self) -> int:
        self._check_open()
        return len(self._data)

    def _close_backend(self) -> None:
        self._data = SortedDict()
