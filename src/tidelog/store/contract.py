"""The state-store contracts: what every store backend promises, bound by bound.

Three stores, each with an in-memory and a RocksDB backend that behave identically
(``tests/store`` runs one contract suite against both):

- :class:`KeyValueStore`: bytes -> bytes.
- :class:`WindowStore`: values per (key, window start), fixed windows, optional retention.
- :class:`SessionStore`: values per session (key, start, end).

Rules shared by every method below (this is KIP-617 with Kafka's later fixes folded in):

- Keys and values are ``bytes``; keys are ordered by unsigned byte comparison (Python's ``bytes``
  order), so ``b"1" < b"11" < b"2"``. Times are int milliseconds in the signed 64-bit range;
  negative times are allowed.
- **One order per store**, whatever the method: key-value by key; window by (key, window start,
  insertion); session by (key, end, start). Unlike Kafka's segmented stores, a window key-range
  fetch is not time-major: it returns every window of the smallest key first.
- **Ranges are inclusive at both ends.** ``None`` as any bound (key or time) means the range is
  open at that end. A range whose ``from`` is greater than its ``to`` (both not None) is empty:
  the method returns an empty iterator and logs a warning on the ``tidelog.store`` logger; it
  never raises. Descending order is asked for by name (``reverse_*``, ``backward_*``), never by
  swapping bounds.
- **Every backward method yields exactly the reverse of its forward twin** called with the same
  arguments on the same data, including entries that share a key and window start (KAFKA-13264)
  or a session (KAFKA-13309).
- A backward (or forward) iteration that stops after N entries costs O(N + log M) for a store of
  M entries: opening an iterator never copies the store or its key set.
- Using a closed store, or stepping an iterator of a closed store, raises ``StoreClosed``.
- Stores are not thread-safe: one owner at a time.

Iterator isolation (see :class:`StoreIterator`): a RocksDB iterator reads the snapshot taken
when it was opened. An in-memory iterator is *weakly consistent*: it never raises because of a
concurrent write and yields every entry present from its opening until it passes that entry's
position exactly once, in order, with the value current when it reaches it; an entry written
or deleted while the iterator is open may or may not be seen (one written behind the iterator's
position never is, one deleted before the iterator reaches it never is).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Protocol, Self, TypeVar

T_co = TypeVar("T_co", covariant=True)

#: What window iterators yield: (key, window_start, value).
WindowEntry = tuple[bytes, int, bytes]
#: What session iterators yield: (key, start, end, value).
SessionEntry = tuple[bytes, int, int, bytes]


class StoreIterator(Iterator[T_co], Protocol[T_co]):
    """An iterator over a store range that holds resources until closed.

    Close it (or use it as a context manager) when done early; an exhausted iterator releases its
    resources by itself. ``close()`` is idempotent; a closed iterator is exhausted (``next``
    raises ``StopIteration``). Writes made while it is open never disturb it (see the module
    docstring for what each backend sees). Stepping it after its store was closed raises
    ``StoreClosed``.
    """

    def close(self) -> None:
        """Release the iterator's resources (RocksDB: its iterator and snapshot)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class _Lifecycle(Protocol):
    def flush(self) -> None:
        """Make every write so far durable (RocksDB: WAL synced to disk; memory: no-op)."""
        ...

    def close(self) -> None:
        """Close the store and every iterator still open on it. Idempotent."""
        ...

    def approximate_num_entries(self) -> int:
        """The number of entries, exact for memory stores, RocksDB's estimate otherwise."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class KeyValueStore(_Lifecycle, Protocol):
    """bytes -> bytes, ordered by unsigned key bytes. Iterators yield ``(key, value)``."""

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``; None if it has none."""
        ...

    def put(self, key: bytes, value: bytes | None) -> None:
        """Set ``key`` to ``value``; ``None`` deletes ``key`` (as in Kafka)."""
        ...

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """``put`` each entry in order (later entries win); RocksDB writes them as one atomic
        batch."""
        ...

    def delete(self, key: bytes) -> bytes | None:
        """Delete ``key`` and return the value it had (None if it had none)."""
        ...

    def range(
        self, from_key: bytes | None, to_key: bytes | None
    ) -> StoreIterator[tuple[bytes, bytes]]:
        """Entries with ``from_key <= key <= to_key``, ascending. Both bounds inclusive; None is
        open; ``from_key > to_key`` gives an empty iterator and a warning."""
        ...

    def reverse_range(
        self, from_key: bytes | None, to_key: bytes | None
    ) -> StoreIterator[tuple[bytes, bytes]]:
        """Exactly the reverse of ``range(from_key, to_key)``: descending, from ``to_key`` down to
        ``from_key``. Both bounds inclusive; None is open; ``from_key > to_key`` gives an empty
        iterator and a warning (the bounds are never swapped)."""
        ...

    def all(self) -> StoreIterator[tuple[bytes, bytes]]:
        """Every entry, ascending by key."""
        ...

    def reverse_all(self) -> StoreIterator[tuple[bytes, bytes]]:
        """Every entry, descending by key: exactly the reverse of ``all()``."""
        ...

    def prefix_scan(self, prefix: bytes) -> StoreIterator[tuple[bytes, bytes]]:
        """Entries whose key starts with ``prefix``, ascending: the half-open byte range
        [prefix, next prefix). Prefix ``b"1"`` matches ``b"1"`` and ``b"11"``, not ``b"2"``; the
        empty prefix matches everything; ``b"\\xff"`` matches every key starting with 0xFF."""
        ...


class WindowStore(_Lifecycle, Protocol):
    """Values per (key, window start) for fixed windows; times are int ms, negative allowed.

    Iterators yield ``(key, window_start, value)`` in one order for every method: by key, then
    window start, then insertion (backward methods: the exact reverse). Time bounds apply to the
    window start and are inclusive.

    ``retain_duplicates=False``: a put replaces the value of (key, window start); None deletes it.
    ``retain_duplicates=True``: every put adds an entry, and entries of one (key, window start)
    keep their insertion order (RocksDB: also across close and reopen); a None value is ignored,
    as in Kafka.

    Retention (``retention_ms`` set): *observed* is the greatest window start ever passed to
    ``put`` (a None put counts, as in Kafka; a put into an expired window cannot raise it); a window
    whose start is ``<= observed - retention_ms`` is expired. Expired windows are never returned,
    are removed from storage, and a put into one is dropped.
    """

    def put(self, key: bytes, value: bytes | None, window_start: int) -> None:
        """Write ``value`` for (key, window_start) (see the class docstring for duplicates,
        None and expired windows)."""
        ...

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None, int]]) -> None:
        """``put(key, value, window_start)`` for each entry, in order, as one write (RocksDB: one
        atomic write batch). The result equals the puts made one by one."""
        ...

    def fetch(
        self, key: bytes, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """Windows of ``key`` with ``time_from <= start <= time_to``, ascending by start then
        insertion. Inclusive; None is open; ``time_from > time_to`` gives an empty iterator and a
        warning."""
        ...

    def backward_fetch(
        self, key: bytes, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """Exactly the reverse of ``fetch(key, time_from, time_to)``: newest window first, and
        within one window the latest insertion first. Same bounds rules."""
        ...

    def fetch_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
    ) -> StoreIterator[WindowEntry]:
        """Windows with ``key_from <= key <= key_to`` and ``time_from <= start <= time_to``,
        ordered by (key, start, insertion). Every bound inclusive; None is open; a from greater
        than its to (keys or times) gives an empty iterator and a warning."""
        ...

    def backward_fetch_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        time_from: int | None,
        time_to: int | None,
    ) -> StoreIterator[WindowEntry]:
        """Exactly the reverse of ``fetch_range`` with the same arguments. Same bounds rules."""
        ...

    def fetch_all(self, time_from: int | None, time_to: int | None) -> StoreIterator[WindowEntry]:
        """Windows of every key with ``time_from <= start <= time_to``, ordered by (key, start,
        insertion). Inclusive; None is open; ``time_from > time_to``: empty and a warning."""
        ...

    def backward_fetch_all(
        self, time_from: int | None, time_to: int | None
    ) -> StoreIterator[WindowEntry]:
        """Exactly the reverse of ``fetch_all(time_from, time_to)``. Same bounds rules."""
        ...

    def all(self) -> StoreIterator[WindowEntry]:
        """Every unexpired window, ordered by (key, start, insertion)."""
        ...

    def backward_all(self) -> StoreIterator[WindowEntry]:
        """Exactly the reverse of ``all()``."""
        ...


class SessionStore(_Lifecycle, Protocol):
    """Values per session (key, start, end), ``start <= end``, int ms.

    Iterators yield ``(key, start, end, value)`` ordered by (key, end, start) for every method
    (backward methods: the exact reverse). A session *matches* (earliest_session_end,
    latest_session_start) when ``end >= earliest_session_end`` and
    ``start <= latest_session_start``; those two are not a from/to pair, so
    ``earliest_session_end > latest_session_start`` is a valid query (sessions that span the
    whole interval between them), not an empty range.
    """

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> None:
        """Set the value of session (key, start, end); None removes it. ``start > end`` raises
        ``ValueError``."""
        ...

    def remove(self, key: bytes, start: int, end: int) -> None:
        """Remove session (key, start, end) if present."""
        ...

    def fetch_session(self, key: bytes, start: int, end: int) -> bytes | None:
        """The value of exactly (key, start, end); None if there is no such session."""
        ...

    def find_sessions(
        self,
        key: bytes,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """Sessions of ``key`` with ``end >= earliest_session_end`` and
        ``start <= latest_session_start`` (inclusive; None: no condition), ordered by (end,
        start)."""
        ...

    def backward_find_sessions(
        self,
        key: bytes,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """Exactly the reverse of ``find_sessions`` with the same arguments."""
        ...

    def find_sessions_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """Matching sessions of keys ``key_from <= key <= key_to``, ordered by (key, end, start).
        Key bounds inclusive; None is open; ``key_from > key_to`` gives an empty iterator and a
        warning."""
        ...

    def backward_find_sessions_range(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int | None,
        latest_session_start: int | None,
    ) -> StoreIterator[SessionEntry]:
        """Exactly the reverse of ``find_sessions_range`` with the same arguments."""
        ...

    def fetch(self, key: bytes) -> StoreIterator[SessionEntry]:
        """Every session of ``key``, ordered by (end, start)."""
        ...

    def backward_fetch(self, key: bytes) -> StoreIterator[SessionEntry]:
        """Exactly the reverse of ``fetch(key)``."""
        ...

    def fetch_range(
        self, key_from: bytes | None, key_to: bytes | None
    ) -> StoreIterator[SessionEntry]:
        """Every session of keys ``key_from <= key <= key_to``, ordered by (key, end, start).
        Inclusive; None is open; ``key_from > key_to`` gives an empty iterator and a warning."""
        ...

    def backward_fetch_range(
        self, key_from: bytes | None, key_to: bytes | None
    ) -> StoreIterator[SessionEntry]:
        """Exactly the reverse of ``fetch_range(key_from, key_to)``."""
        ...
