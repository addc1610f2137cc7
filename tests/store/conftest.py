"""Store fixtures: every contract test runs once per backend (memory, RocksDB under tmp_path).

A :class:`Backend` opens stores of one kind and closes them all when the test ends; ``reopen``
closes a store and opens its directory again (memory backends cannot, so persistence tests ask
for ``rocksdb_only``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from tidelog.store import (
    InMemoryKeyValueStore,
    InMemorySessionStore,
    InMemoryWindowStore,
    RocksDBKeyValueStore,
    RocksDBSessionStore,
    RocksDBWindowStore,
)

S = TypeVar("S")

BACKENDS = ("memory", "rocksdb")


class Backend(Generic[S]):
    def __init__(
        self, name: str, root: Path, memory: Callable[..., S], rocksdb: Callable[..., S]
    ) -> None:
        self.name = name
        self.durable = name == "rocksdb"
        self._root = root
        self._memory = memory
        self._rocksdb = rocksdb
        self._ids = count()
        self._opened: list[Any] = []
        self._paths: dict[int, tuple[Path, dict[str, Any]]] = {}

    def __call__(self, **kwargs: Any) -> S:
        if self.durable:
            path = self._root / f"store{next(self._ids)}"
            store = self._rocksdb(path, **kwargs)
            self._paths[id(store)] = (path, kwargs)
        else:
            store = self._memory(**kwargs)
        self._opened.append(store)
        return store

    def reopen(self, store: S, **kwargs: Any) -> S:
        """Close ``store`` and open its directory again (``kwargs`` replace its settings)."""
        assert self.durable, "only RocksDB stores survive a close"
        path, old = self._paths[id(store)]
        store.close()  # type: ignore[attr-defined]
        again = self._rocksdb(path, **(kwargs or old))
        self._paths[id(again)] = (path, kwargs or old)
        self._opened.append(again)
        return again

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


def _backend(request: pytest.FixtureRequest, tmp_path: Path, memory: Any, rocksdb: Any) -> Any:
    backend = Backend(request.param, tmp_path, memory, rocksdb)
    yield backend
    backend.close_all()


@pytest.fixture(params=BACKENDS)
def kv_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Backend[InMemoryKeyValueStore | RocksDBKeyValueStore]]:
    yield from _backend(request, tmp_path, InMemoryKeyValueStore, RocksDBKeyValueStore)


@pytest.fixture(params=BACKENDS)
def window_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Backend[InMemoryWindowStore | RocksDBWindowStore]]:
    yield from _backend(request, tmp_path, InMemoryWindowStore, RocksDBWindowStore)


@pytest.fixture(params=BACKENDS)
def session_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Backend[InMemorySessionStore | RocksDBSessionStore]]:
    yield from _backend(request, tmp_path, InMemorySessionStore, RocksDBSessionStore)


@pytest.fixture(params=["forward", "backward"])
def direction(request: pytest.FixtureRequest) -> str:
    return str(request.param)
