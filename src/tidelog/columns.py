"""The columnar batch codec of the ``tidelog.v1`` protocol, shared by the server and the client.

A batch of n messages travels as a few bytes fields (see ``proto/tidelog/v1/tidelog.proto``):
values back to back with their sizes as a little-endian u32 array, keys likewise with i32 sizes
(-1 = no key; the column is empty when no message has a key), and one header list per message
(empty when none has headers). Packing and unpacking cost one join and one numpy pass per
column, plus one slice per value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1

_U32: Final = np.dtype("<u4")
_I32: Final = np.dtype("<i4")
_I64: Final = np.dtype("<i8")


def pack(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Mapping[str, bytes]] | None = None,
) -> v1.Messages:
    """Columns for ``values`` with optional per-message keys and headers."""
    n = len(values)
    sizes = np.fromiter(map(len, values), dtype=_U32, count=n)
    columns = v1.Messages(values=b"".join(values), value_sizes=sizes.tobytes())
    _add_keys_and_headers(columns, n, keys, headers)
    return columns


def _add_keys_and_headers(
    columns: v1.Messages,
    n: int,
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Mapping[str, bytes]] | None,
) -> None:
    if keys is not None and any(k is not None for k in keys):
        columns.keys = b"".join(k for k in keys if k)
        columns.key_sizes = np.fromiter(
            (-1 if k is None else len(k) for k in keys), dtype=_I32, count=n
        ).tobytes()
    if headers is not None and any(headers):
        columns.headers.extend(
            v1.HeaderList(headers=[v1.Header(name=k, value=v) for k, v in h.items()])
            for h in headers
        )


def pack_at(
    data: bytes,
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Mapping[str, bytes]] | None = None,
) -> v1.Messages:
    """Columns whose values stay where they are in ``data`` (``value_positions``)."""
    columns = v1.Messages(
        values=data,
        value_sizes=sizes.astype(_U32).tobytes(),
        value_positions=starts.astype(_U32).tobytes(),
    )
    _add_keys_and_headers(columns, len(sizes), keys, headers)
    return columns


def plain_values(columns: v1.Messages) -> tuple[bytes, npt.NDArray[np.int64]] | None:
    """The values buffer and sizes of a batch without keys or headers (None if it has some);
    ``ValueError`` if the sizes do not fit the buffer."""
    if columns.keys or columns.key_sizes or len(columns.headers) or columns.value_positions:
        return None
    if len(columns.value_sizes) % 4:
        raise ValueError("malformed batch: value_sizes is not a whole number of u32 entries")
    sizes = np.frombuffer(columns.value_sizes, dtype=_U32).astype(np.int64)
    if int(sizes.sum()) != len(columns.values):
        raise ValueError(
            f"malformed batch: value sizes add up to {int(sizes.sum())} bytes but "
            f"{len(columns.values)} bytes of values were sent"
        )
    return columns.values, sizes


def _split(blob: bytes, sizes: npt.NDArray[np.int64]) -> list[bytes]:
    ends = np.cumsum(sizes)
    starts = (ends - sizes).tolist()
    return [blob[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]


def unpack(
    columns: v1.Messages,
) -> tuple[list[bytes], list[bytes | None] | None, list[dict[str, bytes]] | None]:
    """Values, keys (None: no keys) and headers (None: no headers) of a batch.

    Raises ``ValueError`` naming the inconsistency when the columns do not fit together.
    """
    if len(columns.value_sizes) % 4:
        raise ValueError("malformed batch: value_sizes is not a whole number of u32 entries")
    value_sizes = np.frombuffer(columns.value_sizes, dtype=_U32).astype(np.int64)
    n = len(value_sizes)
    if columns.value_positions:
        if len(columns.value_positions) != 4 * n:
            raise ValueError(f"malformed batch: value_positions must hold {n} u32 entries")
        starts = np.frombuffer(columns.value_positions, dtype=_U32).astype(np.int64)
        if n and int((starts + value_sizes).max()) > len(columns.values):
            raise ValueError("malformed batch: a value position points past the values sent")
        blob = columns.values
        values = [
            blob[a:b] for a, b in zip(starts.tolist(), (starts + value_sizes).tolist(), strict=True)
        ]
    elif int(value_sizes.sum()) != len(columns.values):
        raise ValueError(
            f"malformed batch: value sizes add up to {int(value_sizes.sum())} bytes but "
            f"{len(columns.values)} bytes of values were sent"
        )
    else:
        values = _split(columns.values, value_sizes)
    keys: list[bytes | None] | None = None
    if columns.keys and not columns.key_sizes:
        raise ValueError("malformed batch: keys were sent without key_sizes")
    if columns.key_sizes:
        if len(columns.key_sizes) != 4 * n:
            raise ValueError(f"malformed batch: key_sizes must hold {n} i32 entries")
        key_sizes = np.frombuffer(columns.key_sizes, dtype=_I32).astype(np.int64)
        if int(key_sizes.min(initial=0)) < -1:
            raise ValueError("malformed batch: a key size below -1")
        present = np.maximum(key_sizes, 0)
        if int(present.sum()) != len(columns.keys):
            raise ValueError("malformed batch: key sizes do not add up to the keys sent")
        split = _split(columns.keys, present)
        keys = [None if s < 0 else k for k, s in zip(split, key_sizes.tolist(), strict=True)]
    headers: list[dict[str, bytes]] | None = None
    if len(columns.headers):
        if len(columns.headers) != n:
            raise ValueError(f"malformed batch: {len(columns.headers)} header lists for {n} values")
        headers = [{h.name: h.value for h in lst.headers} for lst in columns.headers]
    return values, keys, headers


def pack_int64(array: npt.NDArray[np.int64]) -> bytes:
    return array.astype(_I64, copy=False).tobytes()


def unpack_int64(blob: bytes) -> npt.NDArray[np.int64]:
    if len(blob) % 8:
        raise ValueError("malformed batch: an int64 column is not a whole number of entries")
    return np.frombuffer(blob, dtype=_I64).astype(np.int64)
