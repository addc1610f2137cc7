"""A batch of records read from one segment, verified, in delivery order.

Readers hand out :class:`MessageBatch` objects rather than one object per message: offsets and
timestamps are numpy arrays, and values, keys and headers are cut from the segment bytes only when
asked for. A reverse batch is the same thing with its arrays in descending offset order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from tidelog.log.record import (
    HEADER_SIZE,
    NO_HEADERS,
    Int64Array,
    Record,
    decode_headers,
    header_prefix,
)

_EMPTY_I64: Final[Int64Array] = np.empty(0, dtype=np.int64)
_WORD: Final = 8


class MessageBatch:
    """Verified records in delivery order (ascending for forward reads, descending for reverse).

    ``data`` is the raw segment bytes the records were read from; ``positions[i]`` and
    ``sizes[i]`` locate record ``i`` inside it. Every record passed its CRC check before the
    batch was built.
    """

    __slots__ = ("_header", "data", "offsets", "positions", "sizes", "timestamps")

    def __init__(
        self,
        data: bytes,
        positions: Int64Array,
        sizes: Int64Array,
        header: npt.NDArray[np.void] | None,
        offsets: Int64Array | None = None,
        timestamps: Int64Array | None = None,
    ) -> None:
        """``offsets`` and ``timestamps``: the headers' own, when the caller has them as arrays
        already (a read checked the headers against its index entries: they are equal), else
        taken from ``header``."""
        self.data = data
        self.positions = positions
        self.sizes = sizes
        self._header = header
        if header is None:
            self.offsets = _EMPTY_I64
            self.timestamps = _EMPTY_I64
        else:
            self.offsets = header["offset"].astype(np.int64) if offsets is None else offsets
            self.timestamps = (
                header["timestamp"].astype(np.int64) if timestamps is None else timestamps
            )

    @classmethod
    def empty(cls) -> MessageBatch:
        return cls(b"", _EMPTY_I64, _EMPTY_I64, None)

    def __len__(self) -> int:
        return len(self.positions)

    def __bool__(self) -> bool:
        return len(self.positions) > 0

    def __repr__(self) -> str:
        if not self:
            return "MessageBatch(empty)"
        return f"MessageBatch({len(self)} records, offsets {self.offsets[0]}..{self.offsets[-1]})"

    @property
    def first_offset(self) -> int:
        """Offset of the first record delivered (the lowest for forward, highest for reverse)."""
        return int(self.offsets[0])

    @property
    def last_offset(self) -> int:
        """Offset of the last record delivered."""
        return int(self.offsets[-1])

    @property
    def byte_size(self) -> int:
        """Bytes these records occupy on disk."""
        return int(self.sizes.sum())

    def _starts(self) -> npt.NDArray[np.int64]:
        assert self._header is not None
        keylens: npt.NDArray[np.int64] = np.maximum(self._header["keylen"], 0)
        return self.positions + HEADER_SIZE + keylens

    def has_keys(self) -> bool:
        """Whether any record in the batch has a key."""
        return self._header is not None and bool((self._header["keylen"] >= 0).any())

    def has_headers(self) -> bool:
        """Whether any record in the batch has headers."""
        return self._header is not None and bool(self._header["hcount"].any())

    def value_spans(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where each value starts in ``data`` and its length, in delivery order."""
        if self._header is None:
            return _EMPTY_I64, _EMPTY_I64
        return self._starts(), self.value_sizes()

    def value_sizes(self) -> npt.NDArray[np.int64]:
        """Each value's length, in delivery order."""
        if self._header is None:
            return _EMPTY_I64
        return self._header["vallen"].astype(np.int64)

    def key_spans(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where each key starts in ``data`` and its length (-1: the record has no key)."""
        if self._header is None:
            return _EMPTY_I64, _EMPTY_I64
        return self.positions + HEADER_SIZE, self._header["keylen"].astype(np.int64)

    def header_counts(self) -> npt.NDArray[np.int64]:
        """How many headers each record has, in delivery order."""
        if self._header is None:
            return _EMPTY_I64
        return self._header["hcount"].astype(np.int64)

    def values(self) -> list[bytes]:
        """Each record's value, in delivery order."""
        if self._header is None:
            return []
        starts = self._starts()
        ends = starts + self._header["vallen"]
        data = self.data
        return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]

    def keys(self) -> list[bytes | None]:
        """Each record's key (``None`` where it has none), in delivery order."""
        if self._header is None:
            return []
        keylens = self._header["keylen"].tolist()
        starts = (self.positions + HEADER_SIZE).tolist()
        data = self.data
        return [None if n < 0 else data[a : a + n] for a, n in zip(starts, keylens, strict=True)]

    def headers_of(self, indexes: npt.NDArray[np.int64]) -> list[Mapping[str, bytes]]:
        """The headers of the records at ``indexes`` (places in delivery order), decoding only
        those: a reader that wants the few records with headers pays nothing per other record."""
        if self._header is None or not len(indexes):
            return []
        header = self._header[indexes]
        counts = header["hcount"].tolist()
        keylens = np.maximum(header["keylen"], 0)
        starts = (self.positions[indexes] + HEADER_SIZE + keylens + header["vallen"]).tolist()
        ends = (self.positions[indexes] + self.sizes[indexes]).tolist()
        view = memoryview(self.data)
        return [
            decode_headers(view[a:b], c) if c else NO_HEADERS
            for a, b, c in zip(starts, ends, counts, strict=True)
        ]

    def first_header(
        self, name: str, width: int
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint8]]:
        """Which records' first header is named ``name`` with a value of exactly ``width``
        bytes (a mask in delivery order), and those values as the rows of an ``(n, width)``
        array (rows of the other records are zeros). Read for all records at once, without
        decoding any header: a front that keeps a fixed-width header first reads it in bulk."""
        n = len(self)
        if self._header is None:
            return np.zeros(n, dtype=np.bool_), np.zeros((n, width), dtype=np.uint8)
        prefix = header_prefix(name, width)
        span = len(prefix) + width
        starts = self._starts() + self._header["vallen"]
        ends = self.positions + self.sizes
        possible = (self._header["hcount"] > 0) & (starts + span <= ends)
        rows = np.flatnonzero(possible)
        raw = np.frombuffer(self.data, dtype=np.uint8)
        match = _starts_with(raw, starts[rows], prefix)
        if len(rows) == n and bool(match.all()):  # the common case: every record has it
            return possible, _rows_at(raw, starts + len(prefix), width)
        found = rows[match]
        mask = np.zeros(n, dtype=np.bool_)
        mask[found] = True
        values = np.zeros((n, width), dtype=np.uint8)
        if len(found):
            values[found] = _rows_at(raw, starts[found] + len(prefix), width)
        return mask, values

    def headers(self) -> list[Mapping[str, bytes]]:
        """Each record's headers in their stored order (an empty mapping where it has none)."""
        if self._header is None:
            return []
        counts = self._header["hcount"].tolist()
        if not any(counts):
            return [NO_HEADERS] * len(counts)
        starts = (self._starts() + self._header["vallen"]).tolist()
        ends = (self.positions + self.sizes).tolist()
        view = memoryview(self.data)
        return [
            decode_headers(view[a:b], c) if c else NO_HEADERS
            for a, b, c in zip(starts, ends, counts, strict=True)
        ]

    def records(self) -> list[Record]:
        """Every record as a :class:`Record`, in delivery order."""
        return [
            Record(o, t, v, k, h)
            for o, t, v, k, h in zip(
                self.offsets.tolist(),
                self.timestamps.tolist(),
                self.values(),
                self.keys(),
                self.headers(),
                strict=True,
            )
        ]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def reversed(self) -> MessageBatch:
        """The same records in the opposite order (no bytes are copied)."""
        if self._header is None:
            return self
        return MessageBatch(self.data, self.positions[::-1], self.sizes[::-1], self._header[::-1])

    def take(self, indices: npt.NDArray[np.intp]) -> MessageBatch:
        """The records at ``indices`` (positions in delivery order), in that order; no bytes are
        copied."""
        if self._header is None:
            return self
        return MessageBatch(
            self.data, self.positions[indices], self.sizes[indices], self._header[indices]
        )

    def cut(self, start: int, end: int) -> MessageBatch:
        """Records ``[start, end)`` of an ascending batch with their own bytes only (copied out
        of ``data``): a piece of a larger read that travels alone."""
        end = min(end, len(self))
        if self._header is None or (start == 0 and end == len(self)):
            return self
        positions = self.positions[start:end]
        first = int(positions[0])
        data = self.data[first : int(self.positions[end - 1] + self.sizes[end - 1])]
        # The headers copied too: they may be a view of ``data`` (``record.gather_headers``),
        # which would keep the whole read alive with the piece.
        header = self._header[start:end].copy()
        return MessageBatch(data, positions - first, self.sizes[start:end], header)

    def head(self, count: int) -> MessageBatch:
        """The first ``count`` records in delivery order."""
        if self._header is None or count >= len(self):
            return self
        return MessageBatch(
            self.data, self.positions[:count], self.sizes[:count], self._header[:count]
        )


def _stride(starts: Int64Array) -> int | None:
    """The distance between consecutive ``starts`` when it is one positive constant (records of
    one size stored back to back), else None."""
    if len(starts) < 2:
        return _WORD
    stride = int(starts[1] - starts[0])
    if stride <= 0 or int(starts[-1]) != int(starts[0]) + stride * (len(starts) - 1):
        return None
    return stride if bool((np.diff(starts) == stride).all()) else None


def _rows_at(raw: npt.NDArray[np.uint8], starts: Int64Array, width: int) -> npt.NDArray[np.uint8]:
    """``raw[start : start + width]`` for each start, as the rows of a new ``(m, width)`` array:
    one strided copy when the starts are evenly spaced, else a gather of whole rows."""
    stride = _stride(starts)
    if stride is not None and len(starts):
        view = as_strided(raw[int(starts[0]) :], (len(starts), width), (stride, 1), writeable=False)
        return view.copy()
    rows: npt.NDArray[np.uint8] = sliding_window_view(raw, width)[starts]
    return rows


def _starts_with(
    raw: npt.NDArray[np.uint8], starts: Int64Array, pattern: bytes
) -> npt.NDArray[np.bool_]:
    """Whether ``raw[start : start + len(pattern)] == pattern`` for each start (every span lies
    inside ``raw``): compared eight bytes at a time, as one integer per record (read in place
    when the starts are evenly spaced), the last word overlapping the one before when the length
    is not a multiple of eight."""
    size = len(pattern)
    if not len(starts):
        return np.zeros(0, dtype=np.bool_)
    if size < _WORD:
        expected = np.frombuffer(pattern, dtype=np.uint8)
        same: npt.NDArray[np.bool_] = (_rows_at(raw, starts, size) == expected).all(axis=1)
        return same
    stride = _stride(starts)
    match = np.ones(len(starts), dtype=np.bool_)
    for at in sorted({*range(0, size - _WORD + 1, _WORD), size - _WORD}):
        expected_word = np.uint64(int.from_bytes(pattern[at : at + _WORD], "little"))
        if stride is not None:
            words: npt.NDArray[np.uint64] = np.ndarray(
                (len(starts),), "<u8", raw, int(starts[0]) + at, (stride,)
            )
        else:
            words = sliding_window_view(raw, _WORD)[starts + at].view("<u8").reshape(-1)
        match &= words == expected_word
    return match
