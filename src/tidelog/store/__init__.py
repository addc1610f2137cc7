"""State stores: key-value, window and session stores, in memory and in RocksDB.

The contracts (bounds, ordering, iterator isolation) are in :mod:`tidelog.store.contract`; the
on-disk layout and costs in ``docs/stores.md``. This package imports only the standard library,
sortedcontainers, rocksdict and ``tidelog.errors``.
"""

from typing import TYPE_CHECKING

from tidelog.errors import StoreClosed, StoreError, StoreLayoutMismatch
from tidelog.store.contract import (
    KeyValueStore,
    SessionEntry,
    SessionStore,
    StoreIterator,
    WindowEntry,
    WindowStore,
)
from tidelog.store.memory_kv import InMemoryKeyValueStore
from tidelog.store.memory_session import InMemorySessionStore
from tidelog.store.memory_window import InMemoryWindowStore
from tidelog.store.rocksdb_kv import RocksDBKeyValueStore
from tidelog.store.rocksdb_session import RocksDBSessionStore
from tidelog.store.rocksdb_window import RocksDBWindowStore

__all__ = [
    "InMemoryKeyValueStore",
    "InMemorySessionStore",
    "InMemoryWindowStore",
    "KeyValueStore",
    "RocksDBKeyValueStore",
    "RocksDBSessionStore",
    "RocksDBWindowStore",
    "SessionEntry",
    "SessionStore",
    "StoreClosed",
    "StoreError",
    "StoreIterator",
    "StoreLayoutMismatch",
    "WindowEntry",
    "WindowStore",
]

if TYPE_CHECKING:  # mypy checks that every backend satisfies its contract
    from tidelog.store.contract import _Lifecycle

    def _conforms(
        kv: tuple[InMemoryKeyValueStore, RocksDBKeyValueStore],
        window: tuple[InMemoryWindowStore, RocksDBWindowStore],
        session: tuple[InMemorySessionStore, RocksDBSessionStore],
    ) -> tuple[list[KeyValueStore], list[WindowStore], list[SessionStore], _Lifecycle]:
        return list(kv), list(window), list(session), kv[0]
