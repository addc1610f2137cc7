"""The records part of a record batch, laid out from columns with numpy (``records.py`` has
the byte table).

Theory of operation. Each record is five segments: its head (length, attributes, timestamp
delta, offset delta and key length varints), its key, its value length varint, its value, and its
header block (a single 0 byte when it has no headers). The varints of all records are encoded at
once (``varint.encode``) into the rows of one table; keys and values are spans of the caller's
buffers; header blocks are encoded per record, for the records that have any. One gather then
copies every record's five segments into place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tidelog.kafka import varint
from tidelog.kafka.varint import Int64Array, UInt8Array

HeaderList = Sequence[tuple[str | bytes, bytes | None]]
"""A record's headers in order: (key, value), a value of None being null."""
Columns = tuple[bytes | memoryview | UInt8Array, Int64Array, Int64Array]
"""A column of byte strings: (buffer, starts, lengths), length -1 meaning null."""
SparseHeaders = Sequence[HeaderList | None] | Mapping[int, HeaderList]
"""The header lists of the records that have any: a list with None for the others, or by place."""


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


def lay_out(
    offset_deltas: Int64Array,
    timestamp_deltas: Int64Array,
    keys: Columns | None,
    values: Columns,
    headers: SparseHeaders | None,
    n: int,
) -> bytes:
    """The records part: every record's bytes, laid out with one gather."""
    if not n:
        return b""
    value_buffer, value_start, value_len = values
    value_len = np.asarray(value_len, dtype=np.int64)
    if keys is None:
        key_buffer, key_start, key_len = value_buffer, value_start, np.full(n, -1, dtype=np.int64)
    else:
        key_buffer, key_start, key_len = keys
        key_len = np.asarray(key_len, dtype=np.int64)
    blocks = _header_blocks(headers, n)
    block_len = np.zeros(n, dtype=np.int64)
    block_at = np.zeros(n, dtype=np.int64)
    header_blob = b""
    if blocks:
        places = np.fromiter(blocks, dtype=np.int64, count=len(blocks))
        encoded = [blocks[i] for i in places.tolist()]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        block_len[places] = lengths
        block_at[places] = np.cumsum(lengths) - lengths
        header_blob = b"".join(encoded)

    # The fixed part before the key: attributes (0), timestamp delta, offset delta, key length.
    ts_bytes, ts_width = varint.encode(timestamp_deltas, varint.INT64_WIDTH)
    od_bytes, od_width = varint.encode(offset_deltas, varint.INT32_WIDTH)
    kl_bytes, kl_width = varint.encode(key_len, varint.INT32_WIDTH)
    vl_bytes, vl_width = varint.encode(value_len, varint.INT32_WIDTH)
    # Records without headers end with a count of 0 (one byte, 0x00).
    tail_len = np.where(block_len > 0, block_len, 1)
    body_len = (
        1
        + ts_width
        + od_width
        + kl_width
        + np.maximum(key_len, 0)
        + vl_width
        + np.maximum(value_len, 0)
        + tail_len
    )
    len_bytes, len_width = varint.encode(body_len, varint.INT32_WIDTH)

    # The small parts of each record as rows of one table: length, attributes, deltas and key
    # length (up to 26 bytes), then the value length (up to 5).
    head_width = len_width + 1 + ts_width + od_width + kl_width
    table = np.zeros((n, 32), dtype=np.uint8)
    _place(table, len_bytes, len_width, np.zeros(n, dtype=np.int64))
    at = len_width + 1  # attributes stay 0
    _place(table, ts_bytes, ts_width, at)
    at = at + ts_width
    _place(table, od_bytes, od_width, at)
    at = at + od_width
    _place(table, kl_bytes, kl_width, at)
    _place(table, vl_bytes, vl_width, np.full(n, 26, dtype=np.int64))

    key_src, value_src, header_src, source = _sources(table, key_buffer, value_buffer, header_blob)
    rows = np.arange(n, dtype=np.int64) * 32
    # Segments per record: head, key, value length, value, header block or the zero count.
    seg_start = np.stack(
        [
            rows,
            key_src + np.asarray(key_start, dtype=np.int64),
            rows + 26,
            value_src + np.asarray(value_start, dtype=np.int64),
            np.where(block_len > 0, header_src + block_at, rows + 31),
        ],
        axis=1,
    )
    seg_len = np.stack(
        [head_width, np.maximum(key_len, 0), vl_width, np.maximum(value_len, 0), tail_len], axis=1
    )
    return _gather(source, seg_start, seg_len)


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


def _gather(source: UInt8Array, starts: Int64Array, lengths: Int64Array) -> bytes:
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
