"""Records to append given as columns: their bodies laid out once, with numpy, by the log.

A record's body is what follows its fixed 36-byte header on disk: the key, the value, then the
encoded headers (``record.py``). :class:`RecordBodies` carries a whole batch of bodies back to
back in one buffer with, per record, the key length (-1: no key), the value length and the header
count: what the encoder needs, so appending it makes no object per record. A front that receives
records as columns (the Kafka front: keys and values are spans of a request's buffer) builds it
with :meth:`RecordBodies.from_columns`, which lays the bodies out itself, so the header encoding
stays known to the log alone.

Invariants: ``sizes[i] == max(keylens[i], 0) + vallens[i] + len(encoded headers of i)``, the
sizes add up to the buffer, a record without headers has no bytes after its value, and
``header_names`` holds every header name any record has. Stored, a ``RecordBodies`` is byte for
byte what the equivalent list of ``NewRecord`` would store; as a ``Sequence[NewRecord]`` it builds
a record object only when one is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, overload

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tidelog.log.record import (
    Int64Array,
    LaidOutRecords,
    NewRecord,
    PackedValues,
    decode_headers,
    encode_headers,
    header_prefix,
)

MAX_HEADERS: Final = 0xFFFF
"""The most headers a record can hold (its header count is a u16)."""
MAX_NAME_BYTES: Final = 0xFFFF
"""The longest header name, UTF-8 (its length is a u16)."""

Span = tuple[bytes | memoryview | npt.NDArray[np.uint8], Int64Array, Int64Array]


class RecordBodies(LaidOutRecords):
    """A batch of records as laid-out bodies plus per-record lengths (module docstring)."""

    __slots__ = ("_starts", "blob", "hcounts", "header_names", "keylens", "sizes", "vallens")

    def __init__(
        self,
        blob: bytes,
        keylens: Int64Array,
        vallens: Int64Array,
        hcounts: Int64Array,
        sizes: Int64Array,
        header_names: frozenset[str],
    ) -> None:
        """Bodies already laid out (``from_columns`` does that); the lengths are checked against
        each other and the buffer, ``ValueError`` when they disagree."""
        n = len(sizes)
        if not len(keylens) == len(vallens) == len(hcounts) == n:
            raise ValueError("the key, value, header count and size columns differ in length")
        if int(sizes.sum()) != len(blob):
            raise ValueError(f"body sizes add up to {int(sizes.sum())}, not {len(blob)} bytes")
        if n:
            fixed = np.maximum(keylens, 0) + vallens
            if (
                int(keylens.min()) < -1
                or int(vallens.min()) < 0
                or int(hcounts.min()) < 0
                or int(hcounts.max()) > MAX_HEADERS
                or bool((sizes < fixed).any())
                or bool(((hcounts == 0) & (sizes != fixed)).any())
            ):
                raise ValueError("body sizes disagree with their key, value and header columns")
        self.blob = blob
        self.keylens = keylens
        self.vallens = vallens
        self.hcounts = hcounts
        self.sizes = sizes
        self.header_names = header_names
        self._starts: list[int] | None = None

    @classmethod
    def from_columns(
        cls,
        data: bytes | memoryview | npt.NDArray[np.uint8],
        keys: tuple[Int64Array, Int64Array] | None,
        values: tuple[Int64Array, Int64Array],
        *,
        first_header: tuple[str, npt.NDArray[np.uint8]] | None = None,
        headers: Mapping[int, Mapping[str, bytes]] | None = None,
    ) -> RecordBodies:
        """Lay out records whose keys and values are spans of ``data``.

        ``keys`` and ``values`` are (starts, lengths); a key length of -1 means no key (``keys``
        None: no record has one). Every record's headers are ``{name: row}`` of
        ``first_header`` = (name, an ``(n, width)`` array of values), or none without it, except
        the records in ``headers``, whose headers (in order) are given whole there. The bodies
        are gathered in one pass: the header of every other record is a row of one table.
        """
        value_starts, vallens = (np.asarray(a, dtype=np.int64) for a in values)
        n = len(vallens)
        if keys is None:
            key_starts, keylens = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        else:
            key_starts, keylens = (np.asarray(a, dtype=np.int64) for a in keys)
        _check_spans(len(data), key_starts, keylens, -1, "key")
        _check_spans(len(data), value_starts, vallens, 0, "value")
        names: set[str] = set()
        hcounts = np.zeros(n, dtype=np.int64)
        header_len = np.zeros(n, dtype=np.int64)
        header_at = np.zeros(n, dtype=np.int64)
        parts: list[npt.NDArray[np.uint8]] = [_as_array(data)]
        table_at = len(parts[0])
        if first_header is not None:
            name, rows = first_header
            prefix = np.frombuffer(header_prefix(name, rows.shape[1]), dtype=np.uint8)
            _check_name(name)
            width = len(prefix) + rows.shape[1]
            table = np.empty((n, width), dtype=np.uint8)
            table[:, : len(prefix)] = prefix
            table[:, len(prefix) :] = rows
            parts.append(table.reshape(-1))
            if len(headers or ()) < n:  # some record keeps it
                names.add(name)
            hcounts[:] = 1
            header_len[:] = width
            header_at = table_at + np.arange(n, dtype=np.int64) * width
        if headers:
            places = np.fromiter(headers, dtype=np.int64, count=len(headers))
            if int(places.min()) < 0 or int(places.max()) >= n:
                raise IndexError(f"headers given for a record outside 0..{n - 1}")
            encoded = []
            for i in places.tolist():
                given = headers[i]
                if len(given) > MAX_HEADERS:
                    raise ValueError(f"record {i} has {len(given)} headers, over {MAX_HEADERS}")
                for name in given:
                    if name not in names:
                        _check_name(name)
                        names.add(name)
                encoded.append(encode_headers(given))
            sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            blob_at = sum(map(len, parts))
            hcounts[places] = [len(headers[i]) for i in places.tolist()]
            header_len[places] = sizes
            header_at[places] = blob_at + np.cumsum(sizes) - sizes
            parts.append(np.frombuffer(b"".join(encoded), dtype=np.uint8))
        source = parts[0] if len(parts) == 1 else np.concatenate(parts)
        key_len = np.maximum(keylens, 0)
        seg_start = np.stack([key_starts, value_starts, header_at], axis=1)
        seg_len = np.stack([key_len, vallens, header_len], axis=1)
        blob = _gather(source, seg_start, seg_len)
        return cls(
            blob, keylens, vallens, hcounts, key_len + vallens + header_len, frozenset(names)
        )

    def __len__(self) -> int:
        return len(self.sizes)

    def laid_out(self) -> tuple[PackedValues, Int64Array, Int64Array, Int64Array]:
        return PackedValues(self.blob, self.sizes), self.vallens, self.keylens, self.hcounts

    def payload_bytes(self) -> int:
        return int(self.vallens.sum())

    @overload
    def __getitem__(self, index: int) -> NewRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[NewRecord]: ...
    def __getitem__(self, index: int | slice) -> NewRecord | list[NewRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if self._starts is None:
            self._starts = [0, *np.cumsum(self.sizes).tolist()]
        at = self._starts[index]
        end = self._starts[index + 1]
        keylen = int(self.keylens[index])
        key = None if keylen < 0 else self.blob[at : at + keylen]
        at += max(keylen, 0)
        value = self.blob[at : at + int(self.vallens[index])]
        at += len(value)
        count = int(self.hcounts[index])
        if not count:
            return NewRecord(value, key=key)
        return NewRecord(value, key=key, headers=decode_headers(self.blob[at:end], count))

    def records(self) -> list[NewRecord]:
        """One ``NewRecord`` per record (for the paths that need objects)."""
        return [self[i] for i in range(len(self))]

    def with_headers_on_last(self, added: Mapping[str, bytes]) -> RecordBodies:
        """The same records with ``added`` appended to the last one's headers (names it must
        not have yet: ``ValueError``). Only the last body changes: it ends the buffer."""
        if not len(self) or not added:
            return self
        last = self[-1]
        clash = [name for name in added if name in last.headers]
        if clash:
            raise ValueError(f"the last record already has the header(s) {clash}")
        if len(last.headers) + len(added) > MAX_HEADERS:
            raise ValueError(f"the last record would have more than {MAX_HEADERS} headers")
        for name in added:
            _check_name(name)
        extra = encode_headers(added)
        sizes = self.sizes.copy()
        sizes[-1] += len(extra)
        hcounts = self.hcounts.copy()
        hcounts[-1] += len(added)
        return RecordBodies(
            self.blob + extra,
            self.keylens,
            self.vallens,
            hcounts,
            sizes,
            self.header_names | frozenset(added),
        )


def _check_spans(size: int, starts: Int64Array, lengths: Int64Array, least: int, what: str) -> None:
    used = lengths > 0
    if len(lengths) and (
        int(lengths.min()) < least
        or (
            bool(used.any())
            and (int(starts[used].min()) < 0 or int((starts + lengths)[used].max()) > size)
        )
    ):
        raise ValueError(f"a {what} span lies outside the buffer of {size} bytes")


def _check_name(name: str) -> None:
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"a header name of {size} bytes (UTF-8), over {MAX_NAME_BYTES}")


def _as_array(data: bytes | memoryview | npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _gather(source: npt.NDArray[np.uint8], starts: Int64Array, lengths: Int64Array) -> bytes:
    """Per row of ``starts``/``lengths`` (``(n, k)``: k segments of each of n records), its
    segments ``source[start : start + length]`` in order, every row after the other.

    Mostly the segments of a column have similar lengths: then each column is gathered as rows
    of its widest length (a fancy index into a sliding-window view copies whole rows), the
    columns side by side in one grid, and a mask keeps each row's true bytes (none needed when
    every length equals its column's widest). Otherwise one index per byte and one take.
    """
    n = len(lengths)
    total = int(lengths.sum())
    if not total:
        return b""
    widths = lengths.max(axis=0)
    grid_width = int(widths.sum())
    if n * grid_width > 2 * total + 4096:
        flat_len = lengths.reshape(-1)
        dst = np.cumsum(flat_len) - flat_len
        index = np.repeat(starts.reshape(-1) - dst, flat_len)
        index += np.arange(total, dtype=np.int64)
        return np.take(source, index).tobytes()
    safe = np.where(lengths > 0, starts, 0)
    if int((safe + widths).max()) > len(source):
        source = np.concatenate([source, np.zeros(int(widths.max()), dtype=np.uint8)])
    grid = np.empty((n, grid_width), dtype=np.uint8)
    masks: list[npt.NDArray[np.bool_]] = []
    exact = True
    column = 0
    for j, width in enumerate(widths.tolist()):
        if not width:
            continue
        grid[:, column : column + width] = sliding_window_view(source, width)[safe[:, j]]
        column += width
        masks.append(np.arange(width) < lengths[:, j, None])
        exact = exact and bool((lengths[:, j] == width).all())
    if exact:
        return grid.tobytes()
    return grid[np.concatenate(masks, axis=1)].tobytes()
