"""Entries on their way to one sink, as columns: what a sender reads, ships and a sink applies.

A :class:`RoutedColumns` holds n entries of one source for one sink: their positions (ascending,
i64), their payload sizes, the payloads back to back in one buffer, and the client names as runs
of consecutive entries (a run per transmit call, in practice). It is a ``Sequence`` of
:class:`RoutedEntry` for code that wants objects, but the hot paths (reading the send queue,
framing a ``DeltaBatch``, appending to receive queues) work on the columns: a slice of each and
one join, never an object per entry.

On the wire (``tidelog.v1.DeltaBatch``), :func:`to_wire` sends the columns as bytes fields
(``positions``, ``payload_sizes``, ``payloads``, ``run_clients``, ``run_lengths``) to a sink
that said in its progress reply that it reads them (``packed_deltas``), and one ``RoutedEntry``
message per entry to any other (a sink from before the packed fields). :func:`from_wire` reads
either form.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, overload

import numpy as np
import numpy.typing as npt

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1

Int64Array = npt.NDArray[np.int64]
_I64: Final = np.dtype("<i8")
_U32: Final = np.dtype("<u4")
_EMPTY: Final = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class RoutedEntry:
    """One entry as it travels to a sink: its position, its client, its payload (the
    destinations stripped)."""

    position: int
    client: str
    payload: bytes


class RoutedColumns(Sequence[RoutedEntry]):
    """Entries as columns. Invariants (checked by :meth:`checked`, kept by every method):
    ``len(positions) == len(sizes) == run_ends[-1]``, ``sizes`` add up to ``len(payloads)``,
    ``run_ends`` strictly increasing, one client per run."""

    __slots__ = ("_ends", "clients", "payloads", "positions", "run_ends", "sizes")

    def __init__(
        self,
        positions: Int64Array,
        sizes: Int64Array,
        payloads: bytes,
        clients: Sequence[str],
        run_ends: Sequence[int],
    ) -> None:
        self.positions = positions
        self.sizes = sizes
        self.payloads = payloads
        self.clients = tuple(clients)
        self.run_ends = tuple(run_ends)
        self._ends: Int64Array | None = None

    @classmethod
    def empty(cls) -> RoutedColumns:
        return cls(_EMPTY, _EMPTY, b"", (), ())

    @classmethod
    def from_entries(cls, entries: Sequence[RoutedEntry]) -> RoutedColumns:
        """Columns of ``entries`` (as given: a caller checks their order)."""
        if isinstance(entries, RoutedColumns):
            return entries
        n = len(entries)
        positions = np.fromiter((e.position for e in entries), dtype=np.int64, count=n)
        sizes = np.fromiter((len(e.payload) for e in entries), dtype=np.int64, count=n)
        clients: list[str] = []
        run_ends: list[int] = []
        for i, entry in enumerate(entries):
            if clients and clients[-1] == entry.client:
                run_ends[-1] = i + 1
            else:
                clients.append(entry.client)
                run_ends.append(i + 1)
        return cls(positions, sizes, b"".join(e.payload for e in entries), clients, run_ends)

    @classmethod
    def concat(cls, parts: Sequence[RoutedColumns]) -> RoutedColumns:
        """The entries of ``parts``, one after the other (adjacent runs of one client merge)."""
        parts = [p for p in parts if len(p)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        clients: list[str] = []
        run_ends: list[int] = []
        base = 0
        for part in parts:
            for client, end in zip(part.clients, part.run_ends, strict=True):
                if clients and clients[-1] == client:
                    run_ends[-1] = base + end
                else:
                    clients.append(client)
                    run_ends.append(base + end)
            base += len(part)
        return cls(
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.sizes for p in parts]),
            b"".join(p.payloads for p in parts),
            clients,
            run_ends,
        )

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def ends(self) -> Int64Array:
        """Where each payload ends in ``payloads``."""
        if self._ends is None:
            self._ends = np.cumsum(self.sizes)
        return self._ends

    def client_at(self, index: int) -> str:
        for client, end in zip(self.clients, self.run_ends, strict=True):
            if index < end:
                return client
        raise IndexError(index)

    @overload
    def __getitem__(self, index: int) -> RoutedEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[RoutedEntry]: ...
    def __getitem__(self, index: int | slice) -> RoutedEntry | list[RoutedEntry]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"entry {index} of {n}")
        end = int(self.ends[index])
        start = end - int(self.sizes[index])
        return RoutedEntry(
            int(self.positions[index]), self.client_at(index), self.payloads[start:end]
        )

    def __iter__(self) -> Iterator[RoutedEntry]:
        ends = self.ends.tolist()
        positions = self.positions.tolist()
        payloads = self.payloads
        start = 0
        first = 0
        for client, run_end in zip(self.clients, self.run_ends, strict=True):
            for i in range(first, run_end):
                yield RoutedEntry(positions[i], client, payloads[start : ends[i]])
                start = ends[i]
            first = run_end

    def runs(self) -> list[tuple[str, int, int]]:
        """(client, first index, end index) of each run of one client's entries."""
        starts = (0, *self.run_ends)[: len(self.run_ends)]
        return list(zip(self.clients, starts, self.run_ends, strict=True))

    def span(self, start: int, end: int) -> tuple[bytes, Int64Array]:
        """The payloads of entries ``[start, end)`` back to back, and their sizes."""
        if start >= end:
            return b"", _EMPTY
        first = int(self.ends[start] - self.sizes[start])
        last = int(self.ends[end - 1])
        blob = self.payloads if first == 0 and last == len(self.payloads) else None
        return blob if blob is not None else self.payloads[first:last], self.sizes[start:end]

    def take(self, start: int, end: int) -> RoutedColumns:
        """Entries ``[start, end)``."""
        n = len(self)
        start, end = max(0, start), min(n, end)
        if start == 0 and end == n:
            return self
        if start >= end:
            return RoutedColumns.empty()
        blob, sizes = self.span(start, end)
        clients: list[str] = []
        run_ends: list[int] = []
        for client, first, stop in self.runs():
            low, high = max(first, start), min(stop, end)
            if low < high:
                clients.append(client)
                run_ends.append(high - start)
        return RoutedColumns(self.positions[start:end], sizes, blob, clients, run_ends)

    def after(self, position: int) -> RoutedColumns:
        """The entries with positions above ``position``."""
        if not len(self) or int(self.positions[0]) > position:
            return self
        return self.take(int(np.searchsorted(self.positions, position, side="right")), len(self))

    def checked(self) -> RoutedColumns:
        """Self, after checking the invariants (``ValueError`` naming the first broken one)."""
        n = len(self.positions)
        if len(self.sizes) != n:
            raise ValueError(f"{n} positions but {len(self.sizes)} payload sizes")
        if n and int(self.sizes.min()) < 0:
            raise ValueError("a negative payload size")
        if int(self.sizes.sum()) != len(self.payloads):
            raise ValueError(
                f"payload sizes add up to {int(self.sizes.sum())} bytes, but "
                f"{len(self.payloads)} bytes of payloads were sent"
            )
        if len(self.clients) != len(self.run_ends):
            raise ValueError(f"{len(self.clients)} run clients but {len(self.run_ends)} lengths")
        previous = 0
        for end in self.run_ends:
            if end <= previous:
                raise ValueError("a run of no entries")
            previous = end
        if previous != n:
            raise ValueError(f"the runs cover {previous} entries, the batch has {n}")
        return self


def to_wire(prev: int, current: int, entries: RoutedColumns, *, packed: bool) -> v1.DeltaBatch:
    """A ``DeltaBatch``: packed columns for a sink that reads them, else one message per entry."""
    if not packed:
        return v1.DeltaBatch(
            prev=prev,
            current=current,
            entries=[
                v1.RoutedEntry(position=e.position, client_name=e.client, payload=e.payload)
                for e in entries
            ],
        )
    lengths = np.diff(np.asarray((0, *entries.run_ends), dtype=np.int64))
    return v1.DeltaBatch(
        prev=prev,
        current=current,
        positions=entries.positions.astype(_I64, copy=False).tobytes(),
        payload_sizes=entries.sizes.astype(_U32).tobytes(),
        payloads=entries.payloads,
        run_clients=entries.clients,
        run_lengths=lengths.astype(_U32).tobytes(),
    )


def from_wire(batch: v1.DeltaBatch) -> RoutedColumns:
    """The entries of a ``DeltaBatch`` in either form; ``ValueError`` when the columns do not
    fit together (their order and clients are the sink's to check)."""
    if len(batch.entries):
        if batch.positions or batch.payload_sizes or batch.payloads or len(batch.run_clients):
            raise ValueError("a delta batch carries entries either packed or as messages, not both")
        return RoutedColumns.from_entries(
            [RoutedEntry(e.position, e.client_name, e.payload) for e in batch.entries]
        )
    if len(batch.positions) % 8 or len(batch.payload_sizes) % 4 or len(batch.run_lengths) % 4:
        raise ValueError("a packed column is not a whole number of its entries")
    positions = np.frombuffer(batch.positions, dtype=_I64).astype(np.int64)
    sizes = np.frombuffer(batch.payload_sizes, dtype=_U32).astype(np.int64)
    lengths = np.frombuffer(batch.run_lengths, dtype=_U32).astype(np.int64)
    if len(lengths) and int(lengths.min()) < 1:
        raise ValueError("a run of no entries")
    run_ends = np.cumsum(lengths).tolist()
    return RoutedColumns(
        positions, sizes, batch.payloads, list(batch.run_clients), run_ends
    ).checked()
