"""The RocksDB window store: composite keys in the default family, a time index, and metadata.

Column families (the key encoding is in ``encoding.py``)::

    default   escape(key) 00 00 | start (8) | seq (8)   -> value
    by_time   start (8) | escape(key) 00 00 | seq (8)   -> b""      (every entry, time-major)
    meta      b"layout"   -> b"window/1 duplicates=0|1"
              b"observed" -> greatest window start ever put (8)
              b"next_seq" -> the next insertion sequence (8), duplicates only

``seq`` is 0 without duplicates (a put overwrites its window) and a store-wide counter with
them; the counter is written in the same atomic batch as each entry, so insertion order survives
close and reopen.

Retention: the store keeps in memory a lower bound of the oldest indexed window start. When a
put raises the observed time so that this bound is expired, the same batch deletes every expired
entry found at the front of ``by_time`` (and its data row): O(log M + expired) per such put,
never a scan of the store. Reads also skip windows below the cutoff, so nothing expired is ever
returned, even between sweeps (e.g. right after a reopen with a shorter retention, which sweeps
once on open).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rocksdict import WriteBatch

from tidelog.errors import StoreLayoutMismatch
from tidelog.store._base import (
    EmptyIterator,
    check_time,
)
from tidelog.store._rocksdb import RocksStoreBase, rocks_composite_scan
from tidelog.store._window import (
    WindowQueries,
    check_retention,
    oldest_live,
    plan_window_scan,
)
from tidelog.store.contract import StoreIterator, WindowEntry
from tidelog.store.encoding import (
    encode_composite,
    encode_key,
    encode_time,
)

_BY_TIME = "by_time"
_META = "meta"
_LAYOUT = b"layout"
_OBSERVED = b"observed"
_NEXT_SEQ = b"next_seq"


def _time_index_key(key: bytes, start: int, seq: int) -> bytes:
    return encode_time(start) + encode_key(key) + encode_time(seq)


def _data_key_of_index_key(raw: bytes) -> bytes:
    """``start | escape(key) 00 00 | seq`` -> ``escape(key) 00 00 | start | seq``."""
    key_end = raw.find(b"\x00\x00", 8) + 2
    return raw[8:key_end] + raw[:8] + raw[key_end:]


def _decode_time(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "big") - (1 << 63)


class RocksDBWindowStore(WindowQueries, RocksStoreBase):
    """A durable :class:`~tidelog.store.contract.WindowStore` in a RocksDB directory.

    Each put is one atomic write batch (entry, time index, counters, and any expired entries it
    removes). Iterators read the snapshot taken when they open. Reopening a directory with a
    different ``retain_duplicates`` raises ``StoreLayoutMismatch``; ``retention_ms`` may change.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention_ms: int | None = None,
        retain_duplicates: bool = False,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__(path, (_BY_TIME, _META), max_open_files=max_open_files)
        self._retention_ms = check_retention(retention_ms)
        self._retain_duplicates = retain_duplicates
        meta = self._families[_META]
        layout = f"window/1 duplicates={int(retain_duplicates)}".encode()
        stored = meta.get(_LAYOUT)
        if stored is None:
            meta.put(_LAYOUT, layout)
        elif stored != layout:
            self.close()
            raise StoreLayoutMismatch(
                self._path,
                f"written as {stored.decode()!r}, opened as {layout.decode()!r}; open it with "
                f"the retain_duplicates it was created with",
            )
        observed = meta.get(_OBSERVED)
        self._observed: int | None = None if observed is None else _decode_time(observed)
        next_seq = meta.get(_NEXT_SEQ)
        self._next_seq = 0 if next_seq is None else _decode_time(next_seq)
        self._oldest_indexed = self._first_indexed_start()
        if self._retention_ms is not None:
            batch = self._batch()
            self._sweep(batch)
            self._write(batch)

    def _first_indexed_start(self) -> int | None:
        it = self._families[_BY_TIME].iter()
        it.seek_to_first()
        return _decode_time(it.key()) if it.valid() else None

    def _oldest_live(self) -> int:
        return oldest_live(self._retention_ms, self._observed)

    def _sweep(self, batch: WriteBatch, pending: int | None = None) -> None:
        """Add to ``batch`` the deletion of every expired entry (front of ``by_time``).

        ``pending``: the oldest window start ``batch`` itself writes into; the sweep reads the
        database, which does not hold the batch yet, so that start is folded into
        ``_oldest_indexed`` here, or a later sweep would never look at it.
        """
        self._sweep_stored(batch)
        if pending is None or pending < self._oldest_live():
            return
        if self._oldest_indexed is None or pending < self._oldest_indexed:
            self._oldest_indexed = pending

    def _sweep_stored(self, batch: WriteBatch) -> None:
        live_from = self._oldest_live()
        if self._oldest_indexed is None or self._oldest_indexed >= live_from:
            return
        index = self._handles[_BY_TIME]
        it = self._families[_BY_TIME].iter()
        it.seek_to_first()
        while it.valid():
            raw: bytes = it.key()
            start = _decode_time(raw)
            if start >= live_from:
                self._oldest_indexed = start
                return
            batch.delete(_data_key_of_index_key(raw))
            batch.delete(raw, index)
            it.next()
        self._oldest_indexed = None

    def put(self, key: bytes, value: bytes | None, window_start: int) -> None:
        self._check_open()
        check_time("window_start", window_start)
        if window_start < self._oldest_live():
            return
        batch = self._batch()
        if value is not None or not self._retain_duplicates:
            self._add_write(batch, key, value, window_start)
        # Every put advances observed time, even one that stores nothing (as in Kafka).
        if self._observed is None or window_start > self._observed:
            self._observed = window_start
            batch.put(_OBSERVED, encode_time(window_start), self._handles[_META])
            if self._retention_ms is not None:
                self._sweep(batch, window_start if value is not None else None)
        self._write(batch)

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None, int]]) -> None:
        self._check_open()
        batch = self._batch()
        advanced = False
        added: int | None = None  # the oldest window start this batch writes a value into
        first_seq = self._next_seq
        for key, value, window_start in entries:
            check_time("window_start", window_start)
            if window_start < self._oldest_live():
                continue
            if value is not None or not self._retain_duplicates:
                self._add_write(batch, key, value, window_start, save_seq=False)
                if value is not None and (added is None or window_start < added):
                    added = window_start
            if self._observed is None or window_start > self._observed:
                self._observed = window_start
                advanced = True
        if self._retain_duplicates and self._next_seq != first_seq:
            batch.put(_NEXT_SEQ, encode_time(self._next_seq), self._handles[_META])
        if advanced:
            assert self._observed is not None
            batch.put(_OBSERVED, encode_time(self._observed), self._handles[_META])
            if self._retention_ms is not None:
                self._sweep(batch, added)
        self._write(batch)

    def _add_write(
        self,
        batch: WriteBatch,
        key: bytes,
        value: bytes | None,
        window_start: int,
        *,
        save_seq: bool = True,
    ) -> None:
        """Add one entry to ``batch``; ``save_seq=False`` leaves persisting the sequence counter
        to the caller (once per batch)."""
        seq = 0
        if self._retain_duplicates:
            seq = self._next_seq
            self._next_seq += 1
            if save_seq:
                batch.put(_NEXT_SEQ, encode_time(self._next_seq), self._handles[_META])
        data_key = encode_composite((key, window_start, seq))
        index_key = _time_index_key(key, window_start, seq)
        index = self._handles[_BY_TIME]
        if value is None:
            batch.delete(data_key)
            batch.delete(index_key, index)
            return
        batch.put(data_key, value)
        batch.put(index_key, b"", index)
        if self._oldest_indexed is None or window_start < self._oldest_indexed:
            self._oldest_indexed = window_start

    def _scan(
        self,
        method: str,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
        *,
        forward: bool,
    ) -> StoreIterator[WindowEntry]:
        self._check_open()
        plan = plan_window_scan(
            method, key_from, key_to, time_from, time_to, self._oldest_live(), forward=forward
        )
        if plan is None:
            return EmptyIterator(self)
        return rocks_composite_scan(self, self._db, plan, forward=forward)
