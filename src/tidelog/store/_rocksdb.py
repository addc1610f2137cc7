"""What the RocksDB stores share: opening a database in raw bytes mode, and the scan iterator.

Each scan owns one RocksDB iterator. A RocksDB iterator reads an implicit snapshot taken when it
is created (seeks included), so writes made while it is open are never seen and never disturb
it. Forward scans ``seek`` then ``next``; backward scans ``seek_for_prev`` then ``prev``, so a
backward scan that stops after N entries reads N entries, never the rest of the range.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, Generic, TypeVar

from rocksdict import ColumnFamily, Options, Rdict, RdictIter, WriteBatch, WriteOptions

from tidelog.errors import DiskFull, OutOfDescriptors
from tidelog.store._base import Seek, Step, StoreBase, StoreIteratorBase
from tidelog.store._composite import Composite, CompositeScan
from tidelog.store.encoding import decode_composite, encode_composite

T = TypeVar("T")
K = TypeVar("K")


MIN_OPEN_FILES: Final = 20
"""RocksDB's smallest ``max_open_files`` (it raises a smaller one to this): ten of them are
table files kept open, the rest its own files."""


def _options(max_open_files: int | None = None) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    if max_open_files is not None:
        options.set_max_open_files(max(max_open_files, MIN_OPEN_FILES))
    return options


def _open(path: str, options: Options, families: dict[str, Options]) -> Rdict:
    try:
        return Rdict(path, options, column_families=families or None)
    except Exception as error:
        # rocksdict raises a plain Exception carrying RocksDB's IOError text: the system's words
        # are the only way to tell the failures a caller can act on (EMFILE, ENOSPC).
        if "Too many open files" in str(error):
            raise OutOfDescriptors(path, reason=str(error)) from error
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            raise DiskFull(
                path, "the store could not be opened: free space or add disk", reason=str(error)
            ) from error
        raise


class RocksStoreBase(StoreBase):
    """A RocksDB database at ``path`` with the default column family plus ``extra_families``.
    ``max_open_files``: the most files RocksDB keeps open (None: as many as it likes; at least
    :data:`MIN_OPEN_FILES`); a process out of descriptors raises ``OutOfDescriptors``."""

    def __init__(
        self,
        path: str | Path,
        extra_families: tuple[str, ...] = (),
        *,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__()
        self._path = str(path)
        families = {name: _options(max_open_files) for name in extra_families}
        self._db = _open(self._path, _options(max_open_files), families)
        self._families = {name: self._db.get_column_family(name) for name in extra_families}
        self._handles: dict[str, ColumnFamily] = {
            name: self._db.get_column_family_handle(name) for name in extra_families
        }
        self._sync = WriteOptions()
        self._sync.sync = True

    def _name(self) -> str:
        return f"{type(self).__name__}({self._path!r})"

    @staticmethod
    def _batch() -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def _write(self, batch: WriteBatch) -> None:
        if not batch.is_empty():
            self._db.write(batch)

    def flush(self) -> None:
        """Sync the write-ahead log: every write so far survives a crash of the process or host."""
        self._check_open()
        self._db.flush_wal(True)

    def approximate_num_entries(self) -> int:
        """RocksDB's estimate of the number of keys holding data (``rocksdb.estimate-num-keys``
        of the data column family): deleted or overwritten keys may still be counted until
        compaction."""
        self._check_open()
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

    def _close_backend(self) -> None:
        # Column-family objects keep the database open (and its LOCK held) while they live.
        self._families.clear()
        self._handles.clear()
        self._db.close()


class RocksScan(StoreIteratorBase[T], Generic[K, T]):
    """Entries of ``source`` with raw keys from ``lower`` (inclusive) to ``upper`` (inclusive
    unless ``upper_inclusive`` is False; None: open), decoded by ``decode`` and passed through
    ``step``, whose seek targets ``encode`` turns back into raw keys."""

    def __init__(
        self,
        store: StoreBase,
        source: Rdict,
        lower: bytes | None,
        upper: bytes | None,
        *,
        forward: bool,
        step: Step[K, T],
        decode: Callable[[bytes], K],
        encode: Callable[[K], bytes],
        upper_inclusive: bool = True,
    ) -> None:
        super().__init__(store)
        self._lower = lower
        self._upper = upper
        self._upper_inclusive = upper_inclusive
        self._forward = forward
        self._step = step
        self._decode = decode
        self._encode = encode
        it = source.iter()
        if forward:
            if lower is None:
                it.seek_to_first()
            else:
                it.seek(lower)
        elif upper is None:
            it.seek_to_last()
        else:
            it.seek_for_prev(upper)
            if not upper_inclusive and it.valid() and it.key() == upper:
                it.prev()
        self._it: RdictIter | None = it

    def _in_range(self, raw: bytes) -> bool:
        if self._forward:
            if self._upper is None:
                return True
            return raw <= self._upper if self._upper_inclusive else raw < self._upper
        return self._lower is None or raw >= self._lower

    def _advance(self) -> T:
        it = self._it
        assert it is not None
        while True:
            if not it.valid():
                it.status()  # raises if the iterator stopped on an error, not at the end
                raise StopIteration
            raw: bytes = it.key()
            if not self._in_range(raw):
                raise StopIteration
            result = self._step(self._decode(raw), it.value())
            if isinstance(result, Seek):
                target = self._encode(result.target)
                if self._forward:
                    it.seek(target)
                else:
                    it.seek_for_prev(target)
                continue
            if self._forward:
                it.next()
            else:
                it.prev()
            if result is not None:
                return result

    def _release(self) -> None:
        self._it = None


def rocks_composite_scan(
    store: StoreBase, db: Rdict, plan: CompositeScan[T], *, forward: bool
) -> RocksScan[Composite, T]:
    """Run ``plan`` over the composite-keyed ``db`` of ``store``."""
    return RocksScan[Composite, T](
        store,
        db,
        None if plan.lower is None else encode_composite(plan.lower),
        None if plan.upper is None else encode_composite(plan.upper),
        forward=forward,
        step=plan.step,
        decode=decode_composite,
        encode=encode_composite,
    )
