"""The RocksDB session store: composite keys in the default family, and metadata.

Column families (the key encoding is in ``encoding.py``)::

    default   escape(key) 00 00 | end (8) | start (8)   -> value
    meta      b"longest" -> the longest session ever put, end - start (8)

*longest* bounds how far past ``latest_session_start`` a find scans (``_session.py``); it is
written in the same atomic batch as the session that raised it.
"""

from __future__ import annotations

from pathlib import Path

from tidelog.store._base import EmptyIterator
from tidelog.store._rocksdb import RocksStoreBase, rocks_composite_scan
from tidelog.store._session import SessionQueries, check_session, plan_session_scan
from tidelog.store.contract import SessionEntry, StoreIterator
from tidelog.store.encoding import encode_composite, encode_time

_META = "meta"
_LONGEST = b"longest"


class RocksDBSessionStore(SessionQueries, RocksStoreBase):
    """A durable :class:`~tidelog.store.contract.SessionStore` in a RocksDB directory.

    Each put is one atomic write batch. Iterators read the snapshot taken when they open.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, (_META,))
        longest = self._families[_META].get(_LONGEST)
        self._longest = 0 if longest is None else int.from_bytes(longest, "big") - (1 << 63)

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> None:
        self._check_open()
        check_session(start, end)
        data_key = encode_composite((key, end, start))
        if value is None:
            self._db.delete(data_key)
            return
        batch = self._batch()
        batch.put(data_key, value)
        if end - start > self._longest:
            self._longest = end - start
            batch.put(_LONGEST, encode_time(self._longest), self._handles[_META])
        self._write(batch)

    def remove(self, key: bytes, start: int, end: int) -> None:
        self.put(key, start, end, None)

    def fetch_session(self, key: bytes, start: int, end: int) -> bytes | None:
        self._check_open()
        check_session(start, end)
        value: bytes | None = self._db.get(encode_composite((key, end, start)))
        return value

    def _scan(
        self,
        method: str,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
        *,
        forward: bool,
    ) -> StoreIterator[SessionEntry]:
        self._check_open()
        plan = plan_session_scan(
            method,
            key_from,
            key_to,
            earliest_session_end,
            latest_session_start,
            self._longest,
            forward=forward,
        )
        if plan is None:
            return EmptyIterator(self)
        return rocks_composite_scan(self, self._db, plan, forward=forward)
