"""The RocksDB key-value store: user keys stored as they are, in the default column family."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tidelog.store._base import EmptyIterator, next_prefix, swapped
from tidelog.store._rocksdb import RocksScan, RocksStoreBase
from tidelog.store.contract import StoreIterator

KV = tuple[bytes, bytes]


def _pair(key: bytes, value: bytes) -> KV:
    return key, value


def _same(raw: bytes) -> bytes:
    return raw


class RocksDBKeyValueStore(RocksStoreBase):
    """A durable :class:`~tidelog.store.contract.KeyValueStore` in a RocksDB directory.

    Writes go to the write-ahead log (``flush()`` syncs it); ``put_all`` is one atomic write
    batch. Iterators read the snapshot taken when they open.
    """

    def __init__(self, path: str | Path, *, max_open_files: int | None = None) -> None:
        super().__init__(path, max_open_files=max_open_files)

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        value: bytes | None = self._db.get(key)
        return value

    def put(self, key: bytes, value: bytes | None) -> None:
        self._check_open()
        if value is None:
            self._db.delete(key)
        else:
            self._db.put(key, value)

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._check_open()
        batch = self._batch()
        for key, value in entries:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._write(batch)

    def delete(self, key: bytes) -> bytes | None:
        self._check_open()
        old: bytes | None = self._db.get(key)
        if old is not None:
            self._db.delete(key)
        return old

    def _scan(
        self,
        method: str,
        lower: bytes | None,
        upper: bytes | None,
        *,
        forward: bool,
        upper_inclusive: bool = True,
    ) -> StoreIterator[KV]:
        self._check_open()
        if swapped(method, lower, upper, "key "):
            return EmptyIterator(self)
        return RocksScan(
            self,
            self._db,
            lower,
            upper,
            forward=forward,
            step=_pair,
            decode=_same,
            encode=_same,
            upper_inclusive=upper_inclusive,
        )

    def range(self, from_key: bytes | None, to_key: bytes | None) -> StoreIterator[KV]:
        return self._scan("range", from_key, to_key, forward=True)

    def reverse_range(self, from_key: bytes | None, to_key: bytes | None) -> StoreIterator[KV]:
        return self._scan("reverse_range", from_key, to_key, forward=False)

    def all(self) -> StoreIterator[KV]:
        return self._scan("all", None, None, forward=True)

    def reverse_all(self) -> StoreIterator[KV]:
        return self._scan("reverse_all", None, None, forward=False)

    def prefix_scan(self, prefix: bytes) -> StoreIterator[KV]:
        return self._scan(
            "prefix_scan", prefix, next_prefix(prefix), forward=True, upper_inclusive=False
        )
