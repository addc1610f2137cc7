"""The records part of a record batch, laid out from columns with numpy (``records.py`` has
the byte table).

Each record is five segments: its head (length, attributes, timestamp delta, offset delta and key
length varints), its key, its value length varint, its value, and its header block (a single 0
byte when it has no headers). Header blocks are encoded per record, for the records that have
any; everything else is whole-column work.

Theory of operation. Records come in *runs*: neighbours whose segments all have the same
lengths (same key and value lengths, same header block length, same varint widths), so they
take the same number of bytes. A batch read back from a log is mostly a few long runs: the
widths of the offset and timestamp deltas change only at powers of 128, and a producer that sends
values of one size sends records of one size. A run's output is then an ``(m, width)`` array in
place, and each segment is a column block of it: the two varying varints (timestamp and offset
deltas) are written column by column, the constant ones as one broadcast row, and the keys,
values and header blocks as one strided copy each (a fixed stride when their starts are evenly
spaced, as records stored back to back are, else a row gather). :func:`lay_out_in_runs` does
that; when the records change shape too often for runs to pay, :func:`lay_out_gathered` copies
every record's five segments with one gather. Both give the same bytes.

Invariant: the records part depends only on the columns, never on the path taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from tidelog.kafka import varint
from tidelog.kafka.varint import Int64Array, UInt8Array

HeaderList = Sequence[tuple[str | bytes, bytes | None]]
"""A record's headers in order: (key, value), a value of None being null."""
Columns = tuple[bytes | memoryview | UInt8Array, Int64Array, Int64Array]
"""A column of byte strings: (buffer, starts, lengths), length -1 meaning null."""
SparseHeaders = Sequence[HeaderList | None] | Mapping[int, HeaderList]
"""The header lists of the records that have any: a list with None for the others, or by place."""

FEW_RUNS: Final = 8
RECORDS_PER_RUN: Final = 32
"""A batch is laid out in runs when it has at most ``FEW_RUNS`` more runs than one per
``RECORDS_PER_RUN`` records, else gathered. A run costs ~20 numpy calls (~20 us), the gather
~180 us plus ~0.85 us a record of varying size (measured: 6 records in one run 60 us against
180 us gathered; 1,024 records in runs of 32: 0.70 ms against 1.03 ms; in runs of 16: 1.31 ms
against 1.06 ms)."""
_MAX_HEAD: Final = 26
"""The widest head: a length (5), attributes (1), timestamp delta (10), offset delta (5) and key
length (5)."""


def encode_headers(headers: HeaderList) -> bytes:
    """A header block in Kafka's wire form: the count, then each key and value (None: null)."""
    parts = [varint.encode_one(len(headers))]
    for key, value in headers:
        raw = key.encode() if isinstance(key, str) else key
        parts += (varint.encode_one(len(raw)), raw)
        if value is None:
            parts.append(varint.encode_one(-1))
        else:
            parts += (varint.encode_one(len(value)), value)
    return b"".join(parts)


class _Plan:
    """What both paths need: every segment's length, the header blocks, each record's width."""

    __slots__ = (
        "block_at",
        "block_len",
        "body_len",
        "header_blob",
        "key_buffer",
        "key_len",
        "key_start",
        "len_width",
        "n",
        "od_width",
        "offset_deltas",
        "tail_len",
        "timestamp_deltas",
        "ts_width",
        "value_buffer",
        "value_len",
        "value_start",
        "width",
    )

    def __init__(
        self,
        offset_deltas: Int64Array,
        timestamp_deltas: Int64Array,
        keys: Columns | None,
        values: Columns,
        headers: SparseHeaders | None,
        n: int,
    ) -> None:
        self.n = n
        self.offset_deltas = np.asarray(offset_deltas, dtype=np.int64)
        self.timestamp_deltas = np.asarray(timestamp_deltas, dtype=np.int64)
        value_buffer, value_start, value_len = values
        self.value_buffer = value_buffer
        self.value_start = np.asarray(value_start, dtype=np.int64)
        self.value_len = np.asarray(value_len, dtype=np.int64)
        if keys is None:
            self.key_buffer = value_buffer
            self.key_start = self.value_start
            self.key_len = np.full(n, -1, dtype=np.int64)
        else:
            self.key_buffer = keys[0]
            self.key_start = np.asarray(keys[1], dtype=np.int64)
            self.key_len = np.asarray(keys[2], dtype=np.int64)
        blocks = _header_blocks(headers, n)
        self.block_len = np.zeros(n, dtype=np.int64)
        self.block_at = np.zeros(n, dtype=np.int64)
        self.header_blob = b""
        if blocks:
            places = np.fromiter(blocks, dtype=np.int64, count=len(blocks))
            encoded = [blocks[i] for i in places.tolist()]
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            self.block_len[places] = lengths
            self.block_at[places] = np.cumsum(lengths) - lengths
            self.header_blob = b"".join(encoded)
        # Records without headers end with a count of 0 (one byte, 0x00).
        self.tail_len = np.where(self.block_len > 0, self.block_len, 1)
        self.ts_width = varint.widths(self.timestamp_deltas)
        self.od_width = varint.widths(self.offset_deltas)
        self.body_len = (
            1
            + self.ts_width
            + self.od_width
            + varint.widths(self.key_len)
            + np.maximum(self.key_len, 0)
            + varint.widths(self.value_len)
            + np.maximum(self.value_len, 0)
            + self.tail_len
        )
        self.len_width = varint.widths(self.body_len)
        self.width = self.len_width + self.body_len

    def run_starts(self) -> Int64Array:
        """Where each run begins (the first record of every run, ascending, 0 first). Every
        other width and the record's own width follow from these four columns."""
        n = self.n
        changed = np.zeros(n, dtype=np.bool_)
        packed = self.ts_width | (self.od_width << 4)
        for column in (packed, self.key_len, self.value_len, self.tail_len):
            changed[1:] |= column[1:] != column[:-1]
        changed[0] = True
        return np.flatnonzero(changed)


def lay_out(
    offset_deltas: Int64Array,
    timestamp_deltas: Int64Array,
    keys: Columns | None,
    values: Columns,
    headers: SparseHeaders | None,
    n: int,
) -> bytes:
    """The records part: every record's bytes, in runs where they pay, else gathered."""
    return lay_out_into(offset_deltas, timestamp_deltas, keys, values, headers, n, 0).tobytes()


def lay_out_into(
    offset_deltas: Int64Array,
    timestamp_deltas: Int64Array,
    keys: Columns | None,
    values: Columns,
    headers: SparseHeaders | None,
    n: int,
    front: int,
) -> UInt8Array:
    """The records part after ``front`` bytes left for the caller (a batch header), as one
    array: the caller fills the front and sends the array without another copy."""
    plan = _Plan(offset_deltas, timestamp_deltas, keys, values, headers, n)
    starts = plan.run_starts() if n else np.zeros(0, dtype=np.int64)
    if n and len(starts) <= FEW_RUNS + n // RECORDS_PER_RUN:
        return _in_runs(plan, starts, front)
    return _gathered(plan, front)


def lay_out_in_runs(
    offset_deltas: Int64Array,
    timestamp_deltas: Int64Array,
    keys: Columns | None,
    values: Columns,
    headers: SparseHeaders | None,
    n: int,
) -> bytes:
    """The records part, run by run whatever the runs' lengths (module docstring)."""
    plan = _Plan(offset_deltas, timestamp_deltas, keys, values, headers, n)
    if not n:
        return b""
    return _in_runs(plan, plan.run_starts(), 0).tobytes()


def lay_out_gathered(
    offset_deltas: Int64Array,
    timestamp_deltas: Int64Array,
    keys: Columns | None,
    values: Columns,
    headers: SparseHeaders | None,
    n: int,
) -> bytes:
    """The records part, every segment of every record gathered at once (module docstring)."""
    return _gathered(_Plan(offset_deltas, timestamp_deltas, keys, values, headers, n), 0).tobytes()


# -- runs ------------------------------------------------------------------------------------------


def _in_runs(plan: _Plan, starts: Int64Array, front: int) -> UInt8Array:
    width = plan.width
    ends = np.append(starts[1:], plan.n)
    run_width = width[starts]
    run_bytes = run_width * (ends - starts)
    run_at = front + np.cumsum(run_bytes) - run_bytes
    out = np.empty(front + int(run_bytes.sum()), dtype=np.uint8)
    value_source = np.frombuffer(plan.value_buffer, dtype=np.uint8)
    if plan.key_buffer is plan.value_buffer:
        key_source = value_source
    else:
        key_source = np.frombuffer(plan.key_buffer, dtype=np.uint8)
    blob = np.frombuffer(plan.header_blob, dtype=np.uint8)
    for a, b, w, at in zip(
        starts.tolist(), ends.tolist(), run_width.tolist(), run_at.tolist(), strict=True
    ):
        grid = out[at : at + (b - a) * w].reshape(b - a, w)
        _run(plan, a, b, grid, key_source, value_source, blob)
    return out


def _run(
    plan: _Plan,
    a: int,
    b: int,
    grid: UInt8Array,
    key_source: UInt8Array,
    value_source: UInt8Array,
    blob: UInt8Array,
) -> None:
    """Records ``[a, b)``, all of one shape, into the rows of ``grid``."""
    key_len = int(plan.key_len[a])
    value_len = int(plan.value_len[a])
    length = varint.encode_one(int(plan.body_len[a]))
    key_width = len(varint.encode_one(key_len))
    ts_width = int(plan.ts_width[a])
    od_width = int(plan.od_width[a])
    grid[:, : len(length)] = np.frombuffer(length, dtype=np.uint8)
    at = len(length)
    grid[:, at] = 0  # attributes
    at += 1
    _varint_columns(grid, at, plan.timestamp_deltas[a:b], ts_width)
    at += ts_width
    _varint_columns(grid, at, plan.offset_deltas[a:b], od_width)
    at += od_width
    grid[:, at : at + key_width] = np.frombuffer(varint.encode_one(key_len), dtype=np.uint8)
    at += key_width
    if key_len > 0:
        grid[:, at : at + key_len] = _rows(key_source, plan.key_start[a:b], key_len)
        at += key_len
    value_length = varint.encode_one(value_len)
    grid[:, at : at + len(value_length)] = np.frombuffer(value_length, dtype=np.uint8)
    at += len(value_length)
    if value_len > 0:
        grid[:, at : at + value_len] = _rows(value_source, plan.value_start[a:b], value_len)
        at += value_len
    if plan.block_len[a]:
        grid[:, at:] = _rows(blob, plan.block_at[a:b], int(plan.block_len[a]))
    else:
        grid[:, at] = 0  # no headers


def _varint_columns(grid: UInt8Array, at: int, values: Int64Array, width: int) -> None:
    """Each of ``values`` as a varint of exactly ``width`` bytes in ``grid[:, at : at + width]``
    (every value of a run has the same width)."""
    raw = varint.zigzag(values)
    if width == 1:
        grid[:, at] = raw
        return
    for k in range(width):
        septet = (raw >> np.uint64(7 * k)) & np.uint64(0x7F)
        grid[:, at + k] = septet | np.uint64(0x80) if k < width - 1 else septet


def _rows(source: UInt8Array, starts: Int64Array, length: int) -> UInt8Array:
    """``source[start : start + length]`` for each start, as the rows of an ``(m, length)``
    view when the starts are evenly spaced (no copy), else gathered."""
    first = int(starts[0])
    if len(starts) == 1:
        return source[first : first + length].reshape(1, length)
    stride = int(starts[1]) - first
    last = int(starts[-1])
    if stride > 0 and last == first + stride * (len(starts) - 1):
        steps = np.diff(starts)
        if bool((steps == stride).all()):
            view: UInt8Array = as_strided(
                source[first:], shape=(len(starts), length), strides=(stride, 1), writeable=False
            )
            return view
    gathered: UInt8Array = sliding_window_view(source, length)[starts]
    return gathered


# -- gathered --------------------------------------------------------------------------------------


def _gathered(plan: _Plan, front: int) -> UInt8Array:
    n = plan.n
    if not n:
        return np.empty(front, dtype=np.uint8)
    key_len, value_len = plan.key_len, plan.value_len
    ts_bytes, _ = varint.encode(plan.timestamp_deltas, varint.INT64_WIDTH)
    od_bytes, _ = varint.encode(plan.offset_deltas, varint.INT32_WIDTH)
    kl_bytes, kl_width = varint.encode(key_len, varint.INT32_WIDTH)
    vl_bytes, vl_width = varint.encode(value_len, varint.INT32_WIDTH)
    len_bytes, len_width = varint.encode(plan.body_len, varint.INT32_WIDTH)

    # The small parts of each record as rows of one table: length, attributes, deltas and key
    # length (up to 26 bytes), then the value length (up to 5).
    head_width = len_width + 1 + plan.ts_width + plan.od_width + kl_width
    table = np.zeros((n, 32), dtype=np.uint8)
    _place(table, len_bytes, len_width, np.zeros(n, dtype=np.int64))
    at = len_width + 1  # attributes stay 0
    _place(table, ts_bytes, plan.ts_width, at)
    at = at + plan.ts_width
    _place(table, od_bytes, plan.od_width, at)
    at = at + plan.od_width
    _place(table, kl_bytes, kl_width, at)
    _place(table, vl_bytes, vl_width, np.full(n, _MAX_HEAD, dtype=np.int64))

    key_src, value_src, header_src, source = _sources(
        table, plan.key_buffer, plan.value_buffer, plan.header_blob
    )
    rows = np.arange(n, dtype=np.int64) * 32
    # Segments per record: head, key, value length, value, header block or the zero count.
    seg_start = np.stack(
        [
            rows,
            key_src + plan.key_start,
            rows + _MAX_HEAD,
            value_src + plan.value_start,
            np.where(plan.block_len > 0, header_src + plan.block_at, rows + 31),
        ],
        axis=1,
    )
    seg_len = np.stack(
        [head_width, np.maximum(key_len, 0), vl_width, np.maximum(value_len, 0), plan.tail_len],
        axis=1,
    )
    out = np.empty(front + int(seg_len.sum()), dtype=np.uint8)
    out[front:] = _gather(source, seg_start, seg_len)
    return out


def _sources(
    table: UInt8Array, key_buffer: object, value_buffer: object, header_blob: bytes
) -> tuple[int, int, int, UInt8Array]:
    """One array holding the table, the key and value buffers (once if they are the same
    object) and the header blocks; the places where each begins in it."""
    flat = table.reshape(-1)
    parts: list[UInt8Array] = [flat]
    at = len(flat)
    value = np.frombuffer(value_buffer, dtype=np.uint8)  # type: ignore[call-overload]
    value_src = at
    parts.append(value)
    at += len(value)
    if key_buffer is value_buffer:
        key_src = value_src
    else:
        key = np.frombuffer(key_buffer, dtype=np.uint8)  # type: ignore[call-overload]
        key_src = at
        parts.append(key)
        at += len(key)
    header_src = at
    parts.append(np.frombuffer(header_blob, dtype=np.uint8))
    return key_src, value_src, header_src, np.concatenate(parts)


def _place(table: UInt8Array, rows: UInt8Array, width: Int64Array, at: Int64Array | int) -> None:
    """Write each varint's ``width`` bytes (``rows[i]``) into ``table[i]`` from column ``at[i]``."""
    columns = np.arange(rows.shape[1], dtype=np.int64)
    mask = columns < width[:, None]
    r, c = np.nonzero(mask)
    table[r, c + (at[r] if isinstance(at, np.ndarray) else at)] = rows[r, c]


def _gather(source: UInt8Array, starts: Int64Array, lengths: Int64Array) -> UInt8Array:
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
        return np.empty(0, dtype=np.uint8)
    widths = lengths.max(axis=0)
    grid_width = int(widths.sum())
    if n * grid_width > 2 * total + 4096:
        flat_len = lengths.reshape(-1)
        dst = np.cumsum(flat_len) - flat_len
        index = np.repeat(starts.reshape(-1) - dst, flat_len)
        index += np.arange(total, dtype=np.int64)
        taken: UInt8Array = np.take(source, index)
        return taken
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
        return grid.reshape(-1)
    kept: UInt8Array = grid[np.concatenate(masks, axis=1)]
    return kept


def _header_blocks(headers: SparseHeaders | None, n: int) -> dict[int, bytes]:
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else enumerate(headers)
    out: dict[int, bytes] = {}
    for i, h in items:
        if h:
            if not 0 <= i < n:
                raise IndexError(f"headers for record {i} of {n}")
            out[i] = encode_headers(h)
    return out
