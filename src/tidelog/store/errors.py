"""The store layer's failures, one exception type each (all are ``TidelogError``s)."""

from __future__ import annotations

from tidelog.errors import TidelogError


class StoreError(TidelogError):
    """A state-store failure."""


class StoreClosed(StoreError):
    """The store was closed: no read, write or iterator step is possible on it any more."""

    def __init__(self, store: str) -> None:
        self.store = store
        super().__init__(
            f"{store} is closed; open a new store object (a RocksDB store keeps its data on disk)"
        )


class StoreLayoutMismatch(StoreError):
    """A RocksDB store directory was written with settings that change its on-disk layout.

    A window store's ``retain_duplicates`` decides whether its keys carry an insertion sequence,
    so a directory written with one setting cannot be read with the other.
    """

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"store at {path}: {detail}")
