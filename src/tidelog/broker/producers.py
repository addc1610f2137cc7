"""The producer table of one partition: what makes publishing idempotent.

A producer names itself (``producer_id``) and numbers its batches (``sequence``, >= 0, gaps
allowed). For each producer id the table holds its latest stored batch: its sequence and
offsets. A batch whose sequence is not above the stored one is a duplicate: it is not appended,
and when its sequence equals the stored one the caller gets the stored batch's offsets. So a
producer's sequences rise along the log, except where retention made the table forget it and
it started again lower: the latest batch, not the highest sequence, is its state (as Kafka's
replay takes each batch in offset order), on the leader that wrote it and on every copy.

Theory of operation. The check and the update run under the partition log's lock (an
``AppendGuard``): ``check`` before anything is written, ``written`` once the batch is, so two
publishes of the same (producer, sequence) cannot both append, whatever threads they run on.
A producer's batch is appended atomically (``atomic=True``) and its last record carries the
reserved header ``__producer`` = (sequence, count, producer id), so the table can always be
rebuilt from the log itself: it is exactly what the log says.

The table follows the log as Kafka's ``ProducerStateManager`` follows its log, never by a
rescan. Invariant: it equals what a rebuild from the log's records would give.

- **Appends**, a leader's (the guard) and a follower's (``__producer`` headers of the records it
  copies, :func:`stored_producer_batches`) alike, update it as they are written; each change is
  also recorded in an *undo journal* (producer, the entry it replaced, the offset after the new
  batch), in offset order.
- **A cut** (a follower truncating its log to offset N) undoes the journal's changes by batches
  ending at or after N, newest first: exact for any N at or above the journal's *floor*. The
  journal only keeps what a cut may still take back: changes by batches at or below the high
  watermark are settled (:meth:`ProducerTable.settle`; a replica never cuts what every in-sync
  replica holds), and it holds at most :data:`MAX_UNDO` changes (older ones settle first).
  A cut below the floor (only a damaged log's) restores the table from its snapshot and the log.
- **Retention** (:meth:`ProducerTable.trim_before`, when the log's oldest offset moves) forgets
  every producer whose latest batch lies wholly below the new oldest offset, and a cut never
  brings one back. A producer's deduplication window is thus bounded by retention (as in Kafka),
  and the table never outgrows what the log holds.
- **A leadership gain** needs nothing: a follower's table already is its log's.

Owners. A producer id belongs to the principal that first stored a batch under it (Kafka binds a
transactional id to whoever may write it; here the id itself is bound): the entry records that
``owner``, and a batch with the id from another principal is refused with
:class:`ProducerIdTaken` before the duplicate check, nothing stored and nothing said about the
owner's batches. The owner travels with the data: the batch's last record carries the reserved
header ``__owner`` (the principal, UTF-8; absent for :data:`~tidelog.access.ANONYMOUS`), so a
follower's copy and a rebuild from the log know it as the leader did. An entry without an owner
(stored by an anonymous caller, or before owners were recorded) is bound by the next principal
that stores a batch under it: without credentials every caller is anonymous and nothing changes.
A producer forgotten by retention is forgotten with its owner.

Persistence, as for the cursor index: a snapshot (``producers.json`` in the partition's
directory, written atomically on close, pause, by maintenance and after a cut) records the
offset it covers and the undo journal; at open the table is that snapshot plus the
``__producer`` headers of the records after it. A snapshot that covers records the log no longer
has (recovery cut its tail) is cut back with its journal. A missing or unreadable snapshot, or
one its journal cannot cut back to the log's end, means a rebuild from the whole log.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from tidelog.durable import replace_json
from tidelog.errors import InvalidArgument, PermissionDenied, echo
from tidelog.log import CommitLog, MessageBatch, NewRecord
from tidelog.log.bodies import RecordBodies
from tidelog.log.record import HeaderedValues, Int64Array, PackedValues, gather_headers

LOG = logging.getLogger("tidelog.broker.producers")

PRODUCER_HEADER: Final = "__producer"
OWNER_HEADER: Final = "__owner"
"""The principal owning a producer batch's id (module docstring), on the batch's last record."""
RESERVED_HEADERS: Final = (PRODUCER_HEADER, OWNER_HEADER)
SNAPSHOT_FILE: Final = "producers.json"
MAX_PRODUCER_ID_BYTES: Final = 255
_VALUE: Final = struct.Struct("<qI")  # sequence, count; then the producer id (UTF-8)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A producer's latest stored batch: its sequence and offsets, and the principal owning the
    producer id ("": nobody yet, module docstring)."""

    sequence: int
    first_offset: int
    count: int
    owner: str = ""

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.first_offset + self.count)


@dataclass(frozen=True, slots=True)
class Published:
    """The outcome of a publish: the offsets the batch got, or, for a duplicate of an idempotent
    publish, those of the stored batch with the same sequence (empty for an older sequence).
    ``timestamp`` is the one the batch's records were stored with (0 for a duplicate)."""

    offsets: range
    duplicate: bool = False
    timestamp: int = 0


class DuplicateBatch(Exception):
    """Raised by the guard (and caught by the partition): the batch is not appended.

    ``stored`` is the producer's latest batch when the sequence equals its sequence, else None;
    ``latest`` is the producer's latest batch either way.
    """

    def __init__(
        self, producer_id: str, sequence: int, stored: StoredBatch | None, latest: StoredBatch
    ) -> None:
        self.stored = stored
        self.latest = latest
        super().__init__(f"producer {producer_id!r} batch {sequence} is a duplicate")


class ProducerIdTaken(PermissionDenied):
    """A batch under a producer id another principal owns (module docstring): not stored."""

    def __init__(self, producer_id: str) -> None:
        super().__init__(
            f"producer id {echo(producer_id)} belongs to another principal: choose another "
            f"producer id (ids are bound to the principal that first published with them)"
        )


def validate_producer(producer_id: str, sequence: int) -> None:
    """Raise :class:`InvalidArgument` unless (producer_id, sequence) can name a batch."""
    if not producer_id:
        raise InvalidArgument("producer_id must not be empty when a producer sequence is given")
    size = len(producer_id.encode())
    if size > MAX_PRODUCER_ID_BYTES:
        raise InvalidArgument(
            f"producer_id is {size} bytes (UTF-8); the limit is {MAX_PRODUCER_ID_BYTES}"
        )
    if sequence < 0:
        raise InvalidArgument(f"producer_sequence must be >= 0, got {sequence}")


MAX_HEADERS: Final = 0xFFFF
"""Headers one message can carry: the record stores their count as a u16 (``log/record.py``)."""
MAX_HEADER_NAME_BYTES: Final = 0xFFFF
"""Longest header name in UTF-8 bytes: the record stores each name's length as a u16. (A value's
length is a u32, beyond any ``max_message_bytes``.)"""
_SAFE_NAME_CHARS: Final = MAX_HEADER_NAME_BYTES // 4
"""A name of at most this many characters fits whatever they are (UTF-8 takes at most 4 bytes)."""


def check_headers(messages: Sequence[bytes | NewRecord]) -> None:
    """Refuse a published batch with headers the record format cannot hold (over
    :data:`MAX_HEADERS` on a message, or a name over :data:`MAX_HEADER_NAME_BYTES`) or that sets
    a reserved header (``__producer``, ``__owner``) itself."""
    if type(messages) is list:  # the ABC checks below take isinstance's slow path for a list
        pass
    elif isinstance(messages, PackedValues):
        return
    elif isinstance(messages, RecordBodies):
        _check_names(messages.header_names)  # the names of all its records; counts fit a u16
        return
    elif isinstance(messages, HeaderedValues):
        messages = messages[:1]  # one header name for all: checking the first checks all
    for i, m in enumerate(messages):
        if not isinstance(m, NewRecord) or not m.headers:
            continue
        headers = m.headers
        reserved = next((h for h in RESERVED_HEADERS if h in headers), None)
        if reserved is not None:
            raise InvalidArgument(
                f"message {i} of the batch has a header named {reserved!r}: header names "
                f"starting '__' are reserved for tidelog (use publish_batch's producer_id and "
                f"producer_sequence for idempotent publishing)"
            )
        if len(headers) > MAX_HEADERS:
            raise InvalidArgument(
                f"message {i} of the batch has {len(headers)} headers; the limit is "
                f"{MAX_HEADERS} headers per message. Nothing in the batch was written."
            )
        if max(map(len, headers)) > _SAFE_NAME_CHARS:
            for name in headers:
                size = len(name.encode())
                if size > MAX_HEADER_NAME_BYTES:
                    raise InvalidArgument(
                        f"message {i} of the batch has a header name of {size} bytes (UTF-8, "
                        f"starting {echo(name[:40])}); the limit is {MAX_HEADER_NAME_BYTES} "
                        f"bytes. Nothing in the batch was written."
                    )


def _check_names(names: frozenset[str]) -> None:
    reserved = next((h for h in RESERVED_HEADERS if h in names), None)
    if reserved is not None:
        raise InvalidArgument(
            f"a message of the batch has a header named {reserved!r}: header names starting '__' "
            f"are reserved for tidelog. Nothing in the batch was written."
        )
    for name in names:
        size = len(name.encode())
        if size > MAX_HEADER_NAME_BYTES:
            raise InvalidArgument(
                f"a message of the batch has a header name of {size} bytes (UTF-8, starting "
                f"{echo(name[:40])}); the limit is {MAX_HEADER_NAME_BYTES} bytes. Nothing in the "
                f"batch was written."
            )


def encode_producer(producer_id: str, sequence: int, count: int) -> bytes:
    return _VALUE.pack(sequence, count) + producer_id.encode()


def decode_producer(value: bytes) -> tuple[str, int, int] | None:
    """(producer id, sequence, count) from a ``__producer`` value; None if it is malformed."""
    if len(value) <= _VALUE.size:
        return None
    sequence, count = _VALUE.unpack_from(value)
    try:
        producer_id = value[_VALUE.size :].decode()
    except UnicodeDecodeError:
        return None
    if sequence < 0 or count < 1:
        return None
    return producer_id, sequence, count


def with_producer_header(
    messages: Sequence[bytes | NewRecord], producer_id: str, sequence: int, owner: str = ""
) -> Sequence[bytes | NewRecord]:
    """``messages`` with the ``__producer`` header (and ``__owner`` for an identified
    ``owner``) added to the last one."""
    if isinstance(messages, RecordBodies):
        return _bodies_with_producer_header(messages, producer_id, sequence, owner)
    items: list[bytes | NewRecord] = (
        list(messages.split())
        if isinstance(messages, PackedValues)
        else list[bytes | NewRecord](messages.records())
        if isinstance(messages, HeaderedValues)
        else list(messages)
    )
    last = items[-1]
    added = {PRODUCER_HEADER: encode_producer(producer_id, sequence, len(items))}
    if owner:
        added[OWNER_HEADER] = owner.encode()
    if isinstance(last, NewRecord) and len(last.headers) > MAX_HEADERS - len(added):
        raise InvalidArgument(
            f"the last message of an idempotent batch has {len(last.headers)} headers; the limit "
            f"is {MAX_HEADERS - len(added)} there, less than elsewhere, to leave room for the "
            f"{' and '.join(map(repr, added))} header(s) the broker adds. Nothing in the batch "
            f"was written."
        )
    if not isinstance(last, NewRecord):
        last = NewRecord(bytes(last))
    headers: Mapping[str, bytes] = {**last.headers, **added}
    items[-1] = NewRecord(last.value, key=last.key, headers=headers)
    return items


def _bodies_with_producer_header(
    messages: RecordBodies, producer_id: str, sequence: int, owner: str
) -> RecordBodies:
    """The columnar form of :func:`with_producer_header`: only the last body grows."""
    added = {PRODUCER_HEADER: encode_producer(producer_id, sequence, len(messages))}
    if owner:
        added[OWNER_HEADER] = owner.encode()
    count = int(messages.hcounts[-1])
    if count > MAX_HEADERS - len(added):
        raise InvalidArgument(
            f"the last message of an idempotent batch has {count} headers; the limit is "
            f"{MAX_HEADERS - len(added)} there, to leave room for the header(s) the broker adds. "
            f"Nothing in the batch was written."
        )
    return messages.with_headers_on_last(added)


MAX_UNDO: Final = 10_000
"""The most changes the undo journal keeps (older ones settle first: a cut below them restores
the table from the log instead). Settling at the high watermark keeps it far shorter."""


@dataclass(frozen=True, slots=True)
class _Change:
    """One change the undo journal can take back: ``producer_id``'s entry was ``previous``
    before a batch ending just below ``stop`` (exclusive) replaced it."""

    producer_id: str
    previous: StoredBatch | None
    stop: int


def producer_batches(batch: MessageBatch) -> list[tuple[str, StoredBatch]]:
    """The producer batches whose last records (those with a ``__producer`` header) are in
    ``batch``, in its order."""
    # Only the records with headers are decoded: in a follower's copy of idempotent batches that
    # is one record per batch, and decoding all of them cost a third of the follower's append.
    with_headers = np.flatnonzero(batch.header_counts())
    if not len(with_headers):
        return []
    found: list[tuple[str, StoredBatch]] = []
    offsets = batch.offsets[with_headers].tolist()
    for offset, headers in zip(offsets, batch.headers_of(with_headers), strict=True):
        value = headers.get(PRODUCER_HEADER)
        decoded = None if value is None else decode_producer(value)
        if decoded is not None:
            producer_id, sequence, size = decoded
            owner = _owner(headers.get(OWNER_HEADER))
            found.append((producer_id, StoredBatch(sequence, offset - size + 1, size, owner)))
    return found


def _owner(value: bytes | None) -> str:
    if value is None:
        return ""
    try:
        return value.decode()
    except UnicodeDecodeError:
        return ""  # never written so: an owner nobody can present, rather than a guess


def stored_producer_batches(data: bytes, sizes: Int64Array) -> list[tuple[str, StoredBatch]]:
    """:func:`producer_batches` of records as a log stores them (``data``: whole records back to
    back, ``sizes[i]`` bytes each, their CRCs checked already: what a follower appended)."""
    if not len(sizes):
        return []
    sizes = sizes.astype(np.int64)
    positions = np.cumsum(sizes) - sizes
    return producer_batches(MessageBatch(data, positions, sizes, gather_headers(data, positions)))


class ProducerTable:
    """producer id -> its latest stored batch, for one partition. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, StoredBatch] = {}
        self._undo: deque[_Change] = deque()
        self._floor = 0
        """A cut at an offset at or above it is exact with the undo journal alone."""
        self._oldest = 0
        """The log's oldest offset as last told (:meth:`trim_before`)."""
        self.replayed = 0
        """Records read from the log by the last restore (0 when the snapshot was current)."""
        self._saved_covered = -1
        self._dirty = False

    def get(self, producer_id: str) -> StoredBatch | None:
        with self._lock:
            return self._entries.get(producer_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def entries(self) -> dict[str, StoredBatch]:
        """A copy of the table (producer id -> latest stored batch)."""
        with self._lock:
            return dict(self._entries)

    @property
    def floor(self) -> int:
        """The lowest offset :meth:`truncate` can cut the table to without the log."""
        with self._lock:
            return self._floor

    @property
    def undo_length(self) -> int:
        """Changes the undo journal holds (those a cut may still take back)."""
        with self._lock:
            return len(self._undo)

    def apply(self, producer_id: str, batch: StoredBatch) -> None:
        """Take one stored batch, the log's newest, into account: its producer's latest.
        Batches come in offset order (under the log's lock, or from the one thread that
        copies or replays the log)."""
        with self._lock:
            known = self._entries.get(producer_id)
            self._entries[producer_id] = batch
            self._dirty = True
            self._undo.append(_Change(producer_id, known, batch.offsets.stop))
            if len(self._undo) > MAX_UNDO:
                self._floor = max(self._floor, self._undo.popleft().stop)

    def truncate(self, offset: int) -> bool:
        """The log was cut to end below ``offset`` (exclusive): take back every batch that ended
        at or after it. False (and nothing changed) when the cut is below :attr:`floor`: the
        journal no longer reaches there, and the caller restores the table from the log."""
        with self._lock:
            if offset <= self._oldest:  # the whole log is cut: nothing is left to know
                self._dirty = self._dirty or bool(self._entries)
                self._entries.clear()
                self._undo.clear()
                self._floor = offset  # the journal again holds every change from here on
                return True
            if offset < self._floor:
                return False
            while self._undo and self._undo[-1].stop > offset:
                change = self._undo.pop()
                previous = change.previous
                if previous is None or previous.offsets.stop <= self._oldest:
                    self._entries.pop(change.producer_id, None)
                else:
                    self._entries[change.producer_id] = previous
                self._dirty = True
            return True

    def settle(self, high_watermark: int) -> None:
        """No cut will remove a record at or below ``high_watermark`` (every in-sync replica
        holds it): drop the journal's changes by batches ending there or before."""
        with self._lock:
            while self._undo and self._undo[0].stop <= high_watermark + 1:
                self._floor = max(self._floor, self._undo.popleft().stop)

    def trim_before(self, oldest_offset: int) -> int:
        """Retention removed the records below ``oldest_offset``: forget every producer whose
        latest batch lies wholly below it, as a rebuild from the log would (its deduplication
        window is over), and never bring one back by a cut. Returns how many were forgotten."""
        with self._lock:
            self._oldest = max(self._oldest, oldest_offset)
            gone = [p for p, b in self._entries.items() if b.offsets.stop <= oldest_offset]
            for producer_id in gone:
                del self._entries[producer_id]
            while self._undo and self._undo[0].stop <= oldest_offset:
                self._undo.popleft()  # no cut goes below the oldest offset
            if gone:
                self._dirty = True
            return len(gone)

    def guard(self, producer_id: str, sequence: int, owner: str = "") -> ProducerGuard:
        return ProducerGuard(self, producer_id, sequence, owner)

    # -- persistence -----------------------------------------------------------------------------

    @classmethod
    def restore(cls, log: CommitLog, directory: Path) -> ProducerTable:
        """The table of ``log``: its snapshot in ``directory`` plus the records after it."""
        table, covered = cls._load(directory, log.newest_offset)
        table.trim_before(log.oldest_offset)
        table._replay(log, covered + 1)
        table.settle(log.high_watermark)
        return table

    def _replay(self, log: CommitLog, start: int) -> None:
        """Apply the ``__producer`` headers of every record from ``start`` on: the one path
        that reads the log (a restore, never an append, a cut or a leadership gain)."""
        for batch in log.forward_reader(start, past_limit=True):
            self.replayed += len(batch)
            for producer_id, stored in producer_batches(batch):
                self.apply(producer_id, stored)

    @classmethod
    def _load(cls, directory: Path, newest_offset: int) -> tuple[ProducerTable, int]:
        table = cls()
        path = directory / SNAPSHOT_FILE
        try:
            data = json.loads(path.read_text())
            covered = int(data["covered"])
            entries = {str(row[0]): _stored(row[1:]) for row in data["producers"]}
            undo = [
                _Change(str(p), None if b is None else _stored(b), int(stop))
                for p, b, stop in data.get("undo", [])
            ]
            floor = int(data.get("floor", covered + 1))
        except FileNotFoundError:
            return table, -1
        except (ValueError, KeyError, TypeError) as error:
            LOG.warning(
                "%s: unreadable producer snapshot (%s); rebuilding from the log", path, error
            )
            return table, -1
        table._entries = entries
        table._undo = deque(undo)
        table._floor = floor
        if covered > newest_offset and table.truncate(newest_offset + 1):
            # The log lost its tail (recovery cut it): the journal takes it back, and the
            # snapshot is rewritten at the next save (the table stays dirty).
            covered = newest_offset
        else:
            table._dirty = False
        ahead = max((b.offsets.stop - 1 for b in table._entries.values()), default=-1)
        if max(covered, ahead) > newest_offset:
            LOG.warning(
                "%s: snapshot covers offset %d but the log ends at %d; rebuilding from the log",
                path,
                max(covered, ahead),
                newest_offset,
            )
            return cls(), -1
        table._saved_covered = covered
        return table, covered

    def snapshot(self, newest_offset: int) -> dict[str, object] | None:
        """The snapshot covering ``newest_offset`` (read from the log *before* this call), or
        None if nothing changed since the last one."""
        with self._lock:
            if not self._dirty and newest_offset == self._saved_covered:
                return None
            self._dirty = False
            self._saved_covered = newest_offset
            producers = [[p, *_row(b)] for p, b in self._entries.items()]
            undo = [
                [c.producer_id, None if c.previous is None else _row(c.previous), c.stop]
                for c in self._undo
            ]
            floor = self._floor
        return {
            "format": SNAPSHOT_FORMAT,
            "covered": newest_offset,
            "producers": producers,
            "floor": floor,
            "undo": undo,
        }

    def save(self, log: CommitLog, directory: Path) -> None:
        """Write the snapshot if anything changed (the log must be open)."""
        data = self.snapshot(log.newest_offset)
        if data is not None:
            write_snapshot(directory, data)


SNAPSHOT_FORMAT: Final = 3
"""3: each batch also names its owner (2, without, is read as owned by nobody yet)."""


def _row(batch: StoredBatch) -> list[object]:
    row: list[object] = [batch.sequence, batch.first_offset, batch.count]
    return [*row, batch.owner] if batch.owner else row


def _stored(row: Sequence[object]) -> StoredBatch:
    """A snapshot row: [sequence, first offset, count] (format 2) with an owner (format 3)."""
    if len(row) not in (3, 4):
        raise ValueError(f"a stored batch has 3 or 4 fields, not {len(row)}")
    sequence, first, count = (int(v) for v in row[:3])  # type: ignore[call-overload]
    owner = row[3] if len(row) == 4 else ""
    if not isinstance(owner, str):
        raise TypeError(f"a stored batch's owner is a string, not {owner!r}")
    return StoredBatch(sequence, first, count, owner)


class ProducerGuard:
    """The ``AppendGuard`` of one producer's batch (runs under the log's lock): the owner check
    (:class:`ProducerIdTaken`), then the duplicate check."""

    __slots__ = ("owner", "producer_id", "sequence", "table")

    def __init__(self, table: ProducerTable, producer_id: str, sequence: int, owner: str) -> None:
        self.table = table
        self.producer_id = producer_id
        self.sequence = sequence
        self.owner = owner

    def check(self, next_offset: int) -> None:
        known = self.table.get(self.producer_id)
        if known is None:
            return
        if known.owner and known.owner != self.owner:
            raise ProducerIdTaken(self.producer_id)
        if self.sequence <= known.sequence:
            stored = known if self.sequence == known.sequence else None
            raise DuplicateBatch(self.producer_id, self.sequence, stored, known)

    def written(self, offsets: range) -> None:
        stored = StoredBatch(self.sequence, offsets.start, len(offsets), self.owner)
        self.table.apply(self.producer_id, stored)


def write_snapshot(directory: Path, data: dict[str, object]) -> None:
    """Replace the partition's producer snapshot atomically (temp file, fsync, rename)."""
    replace_json(directory / SNAPSHOT_FILE, data)
