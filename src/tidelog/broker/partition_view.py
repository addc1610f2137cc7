"""Materialised views of one stream partition: a table or a window index kept in RocksDB.

A **table** holds the latest value per key; a record with a key and an empty value deletes the
key (a tombstone, as compaction treats it). A **window index** holds every value per key, filed
under the fixed window (of ``window_size_ms``) its broker timestamp falls in, so "the last N
values of K in [t0, t1]" is a backward fetch that stops after N entries. Keyless records are
not part of either.

Each view of a partition (:class:`PartitionView`) applies the partition's records in offset
order and remembers ``applied``, the next offset to apply. Theory of operation:

* Stored values carry the record's offset and timestamp (``STORED`` then the value), so a query
  answers with where a value came from.
* ``checkpoint.json`` records ``applied``; it is written only after the store has been flushed
  (``flush`` makes every write so far durable), so the store always holds at least what the
  checkpoint claims. After a crash the view replays from the checkpoint. Replaying a table is
  idempotent (the same puts and deletes land again). A window index appends, so during the first
  catch-up after opening it skips a record whose (key, window) already holds an entry at or past
  that record's offset: such a record was applied before the crash.
* A view directory without a checkpoint is wiped and rebuilt from the log's oldest record.
* Records removed by retention before the view applied them are skipped (logged); a view always
  follows the log's oldest retained offset.

A :class:`PartitionView` is thread-safe: its lock serialises catch-up, queries and close, so the
applier may run in a worker thread while queries arrive from others.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import shutil
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tidelog.durable import make_dirs, replace_json
from tidelog.errors import InvalidArgument, LogClosed, echo
from tidelog.log import CommitLog
from tidelog.store import RocksDBKeyValueStore, RocksDBWindowStore

LOG = logging.getLogger("tidelog.broker.views")

CHECKPOINT_FILE: Final = "checkpoint.json"
STORE_DIR: Final = "store"
STORED: Final = struct.Struct(">qq")  # offset, broker timestamp (ns), then the value
_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CHECKPOINT_EVERY_RECORDS: Final = 100_000
CHECKPOINT_EVERY_S: Final = 5.0
STORE_MAX_OPEN_FILES: Final = 20
"""RocksDB's ``max_open_files`` for a view's store: its minimum (``descriptors.py``)."""


class ViewKind(enum.Enum):
    TABLE = "table"
    WINDOW = "window"


@dataclass(frozen=True, slots=True)
class ViewSpec:
    """What a view is. ``window_size_ms`` and ``retention_ms`` apply to window views only;
    ``retention_ms`` 0 keeps every window."""

    name: str
    kind: ViewKind
    window_size_ms: int = 0
    retention_ms: int = 0

    def validate(self) -> ViewSpec:
        if not _NAME.fullmatch(self.name) or self.name in (".", ".."):
            raise InvalidArgument(
                f"invalid view name {echo(self.name)}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        if self.kind is ViewKind.WINDOW:
            if self.window_size_ms <= 0:
                raise InvalidArgument(
                    f"window view {self.name!r} needs a window size > 0 ms, "
                    f"not {self.window_size_ms}"
                )
            if self.retention_ms < 0:
                raise InvalidArgument(
                    f"window view {self.name!r}: retention must be >= 0 ms (0 keeps every "
                    f"window), not {self.retention_ms}"
                )
        elif self.window_size_ms or self.retention_ms:
            raise InvalidArgument(
                f"table view {self.name!r} takes no window size or retention; "
                f"declare a window view for those"
            )
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "window_size_ms": self.window_size_ms,
            "retention_ms": self.retention_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ViewSpec:
        return cls(
            str(data["name"]),
            ViewKind(data["kind"]),
            int(data.get("window_size_ms", 0)),
            int(data.get("retention_ms", 0)),
        )


@dataclass(frozen=True, slots=True)
class ViewEntry:
    """One answer of a view query: a value and the record it came from."""

    key: bytes
    value: bytes
    partition: int
    offset: int
    timestamp_ns: int
    window_start_ms: int = 0


def window_start(timestamp_ns: int, window_size_ms: int) -> int:
    """The start (ms) of the window of ``window_size_ms`` that holds ``timestamp_ns``."""
    millis = timestamp_ns // 1_000_000
    return millis - millis % window_size_ms


class PartitionView:
    """One view of one partition, stored under ``directory`` (see the module docstring)."""

    def __init__(self, spec: ViewSpec, partition: int, directory: Path) -> None:
        self.spec = spec
        self.partition = partition
        self.directory = directory
        self.lock = threading.Lock()
        self.applied = 0
        """The next offset this view will apply."""
        self._checkpointed = 0
        self._checkpointed_at = time.monotonic()
        self._uncertain_until: int | None = None
        """While set: records at or below it may already be in a window index (crash replay)."""
        self._closed = False
        make_dirs(directory)
        checkpoint = self._read_checkpoint()
        if checkpoint is None:
            shutil.rmtree(directory / STORE_DIR, ignore_errors=True)
        else:
            self.applied = self._checkpointed = checkpoint
            self._uncertain_until = -1  # fixed at the first catch-up: the log's end by then
        self.table: RocksDBKeyValueStore | None = None
        self.windows: RocksDBWindowStore | None = None
        self._open_store()
        if checkpoint is None:
            self._write_checkpoint()

    def _open_store(self) -> None:
        path = str(self.directory / STORE_DIR)
        # Few files each: every partition of every view holds a store open (descriptors.py).
        if self.spec.kind is ViewKind.TABLE:
            self.table = RocksDBKeyValueStore(path, max_open_files=STORE_MAX_OPEN_FILES)
        else:
            self.windows = RocksDBWindowStore(
                path,
                retention_ms=self.spec.retention_ms or None,
                retain_duplicates=True,
                max_open_files=STORE_MAX_OPEN_FILES,
            )

    # -- applying records ------------------------------------------------------------------------

    def catch_up(self, log: CommitLog) -> int:
        """Apply every committed record not applied yet; returns how many records were read.

        Runs in a worker thread; a log closed underneath (pause, delete, shutdown) ends it early
        without error: the next catch-up continues where this one stopped.
        """
        with self.lock:
            if self._closed:
                return 0
            try:
                return self._catch_up_locked(log)
            except LogClosed:
                return 0

    def _catch_up_locked(self, log: CommitLog) -> int:
        high_watermark = log.high_watermark
        if self._uncertain_until == -1:
            self._uncertain_until = high_watermark
            if self.applied > high_watermark + 1:
                LOG.warning(
                    "view %s of partition %d applied offsets up to %d but the log ends at %d "
                    "(recovery cut its tail); rebuilding the view",
                    self.spec.name,
                    self.partition,
                    self.applied - 1,
                    high_watermark,
                )
                self._reset_locked()
        if self.applied > high_watermark:
            return 0
        oldest = log.oldest_offset
        if oldest > self.applied > 0:
            LOG.warning(
                "view %s of partition %d: retention removed offsets %d..%d before the view "
                "applied them; they are not in the view",
                self.spec.name,
                self.partition,
                self.applied,
                oldest - 1,
            )
        self.applied = max(self.applied, oldest)
        read = 0
        for batch in log.forward_reader(self.applied, stop_offset=high_watermark):
            keys = batch.keys()
            offsets = batch.offsets.tolist()
            timestamps = batch.timestamps.tolist()
            if self.table is not None:
                self._apply_table(keys, batch.values(), offsets, timestamps)
            else:
                self._apply_windows(keys, batch.values(), offsets, timestamps)
            self.applied = batch.last_offset + 1
            read += len(batch)
        if self._uncertain_until is not None and self.applied > self._uncertain_until:
            self._uncertain_until = None
        if read:
            self._maybe_checkpoint()
        return read

    def _apply_table(
        self,
        keys: list[bytes | None],
        values: list[bytes],
        offsets: list[int],
        timestamps: list[int],
    ) -> None:
        assert self.table is not None
        latest: dict[bytes, bytes | None] = {}
        for key, value, offset, timestamp in zip(keys, values, offsets, timestamps, strict=True):
            if key is not None:
                latest[key] = STORED.pack(offset, timestamp) + value if value else None
        self.table.put_all(latest.items())

    def _apply_windows(
        self,
        keys: list[bytes | None],
        values: list[bytes],
        offsets: list[int],
        timestamps: list[int],
    ) -> None:
        windows = self.windows
        assert windows is not None
        size = self.spec.window_size_ms
        uncertain = self._uncertain_until
        entries: list[tuple[bytes, bytes | None, int]] = []
        for key, value, offset, timestamp in zip(keys, values, offsets, timestamps, strict=True):
            if key is None:
                continue
            start = window_start(timestamp, size)
            if uncertain is not None and offset <= uncertain and self._has(key, start, offset):
                continue
            entries.append((key, STORED.pack(offset, timestamp) + value, start))
        windows.put_all(entries)  # one write batch per log batch

    def _has(self, key: bytes, start: int, offset: int) -> bool:
        """Whether the window index holds ``offset`` (or a later record) in (key, start)."""
        assert self.windows is not None
        with self.windows.backward_fetch(key, start, start) as newest_first:
            for _key, _start, stored in newest_first:
                return int(STORED.unpack_from(stored)[0]) >= offset
        return False

    def _reset_locked(self) -> None:
        """Empty the store and start again from the log's oldest record."""
        self._store().close()
        shutil.rmtree(self.directory / STORE_DIR, ignore_errors=True)
        self._open_store()
        self.applied = 0
        self._uncertain_until = None
        self._write_checkpoint()

    # -- checkpoints -----------------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        due = time.monotonic() - self._checkpointed_at >= CHECKPOINT_EVERY_S
        if due or self.applied - self._checkpointed >= CHECKPOINT_EVERY_RECORDS:
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        if self.applied == self._checkpointed:
            return
        self._store().flush()  # the store holds at least what the checkpoint will claim
        self._write_checkpoint()

    def checkpoint(self) -> None:
        with self.lock:
            if not self._closed:
                self._checkpoint_locked()

    def _write_checkpoint(self) -> None:
        replace_json(
            self.directory / CHECKPOINT_FILE,
            {"format": 1, "applied": self.applied, "spec": self.spec.to_json()},
        )
        self._checkpointed = self.applied
        self._checkpointed_at = time.monotonic()

    def _read_checkpoint(self) -> int | None:
        path = self.directory / CHECKPOINT_FILE
        try:
            data = json.loads(path.read_text())
            applied = int(data["applied"])
            stored_spec = ViewSpec.from_json(data["spec"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as error:
            LOG.warning("%s: unreadable view checkpoint (%s); rebuilding the view", path, error)
            return None
        if stored_spec != self.spec or applied < 0:
            LOG.warning("%s: checkpoint of another definition; rebuilding the view", path)
            return None
        return applied

    # -- queries (the caller holds ``lock``) -----------------------------------------------------

    def _store(self) -> RocksDBKeyValueStore | RocksDBWindowStore:
        store = self.table if self.table is not None else self.windows
        assert store is not None
        return store

    def get(self, key: bytes) -> ViewEntry | None:
        assert self.table is not None
        stored = self.table.get(key)
        return None if stored is None else self._entry(key, stored)

    def range(
        self, from_key: bytes | None, to_key: bytes | None, reverse: bool, limit: int
    ) -> list[ViewEntry]:
        """At most ``limit`` entries of ``[from_key, to_key]`` in key order (descending when
        ``reverse``)."""
        assert self.table is not None
        method = self.table.reverse_range if reverse else self.table.range
        entries: list[ViewEntry] = []
        if limit <= 0:
            return entries
        with method(from_key, to_key) as found:
            for key, stored in found:
                entries.append(self._entry(key, stored))
                if len(entries) >= limit:
                    break
        return entries

    def window_fetch(
        self,
        key: bytes,
        time_from_ms: int | None,
        time_to_ms: int | None,
        backward: bool,
        limit: int,
    ) -> list[ViewEntry]:
        """At most ``limit`` values of ``key`` whose timestamps (ms) lie in [time_from_ms,
        time_to_ms], oldest first or (``backward``) newest first."""
        assert self.windows is not None
        size = self.spec.window_size_ms
        # A record at time t sits in the window starting at or before t: widen the lower bound
        # to that window's start, then filter on the record's own timestamp.
        first_window = None if time_from_ms is None else time_from_ms - time_from_ms % size
        method = self.windows.backward_fetch if backward else self.windows.fetch
        entries: list[ViewEntry] = []
        if limit <= 0:
            return entries
        with method(key, first_window, time_to_ms) as found:
            for _key, start, stored in found:
                entry = self._entry(key, stored, start)
                millis = entry.timestamp_ns // 1_000_000
                if time_from_ms is not None and millis < time_from_ms:
                    continue
                if time_to_ms is not None and millis > time_to_ms:
                    continue
                entries.append(entry)
                if len(entries) >= limit:
                    break
        return entries

    def approximate_entries(self) -> int:
        with self.lock:
            return 0 if self._closed else self._store().approximate_num_entries()

    def _entry(self, key: bytes, stored: bytes, start: int = 0) -> ViewEntry:
        offset, timestamp = STORED.unpack_from(stored)
        return ViewEntry(key, stored[STORED.size :], self.partition, offset, timestamp, start)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, checkpoint and close the store (idempotent)."""
        with self.lock:
            if self._closed:
                return
            self._checkpoint_locked()
            self._closed = True
            self._store().close()

    def entries(self) -> list[ViewEntry]:
        """Every entry in store order (tests and tools; not for the hot path)."""
        with self.lock:
            if self.table is not None:
                with self.table.all() as rows:
                    return [self._entry(key, stored) for key, stored in rows]
            assert self.windows is not None
            with self.windows.all() as windows:
                return [self._entry(key, stored, start) for key, start, stored in windows]
