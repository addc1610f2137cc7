"""The columnar batch codec of the ``tidelog.v1`` protocol, shared by the server and the client.

A batch of n messages travels as a few bytes fields (see ``proto/tidelog/v1/tidelog.proto``):
values back to back with their sizes as a little-endian u32 array, keys likewise with i32 sizes
(-1 = no key; the column is empty when no message has a key), and one header list per message
(empty when none has headers); offsets and timestamps are little-endian int64 arrays. Packing and
unpacking cost one join and one pass per column, plus one slice per value.

The forms that take or give Python values (:func:`pack`, :func:`unpack`, :func:`int64_list`,
:func:`int32_list`, :func:`pack_u32`) use the standard library's ``array`` only: as fast as numpy
here (one Python object per value costs the same either way), and a client that only publishes
never loads numpy. The server's forms work on numpy arrays: :func:`pack_at` and
:func:`pack_int64` take them (calling their methods, without importing numpy), and
:func:`plain_values` and :func:`unpack_int64`, which hand them out, import numpy when called.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, chain, pairwise
from operator import add
from typing import TYPE_CHECKING, Final, cast

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.errors import ValuesOmitted

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_U32: Final = "I"
_I32: Final = "i"
_I64: Final = "q"
_KINDS: Final = {_U32: "u32", _I32: "i32", _I64: "int64"}
if array(_I32).itemsize != 4 or array(_I64).itemsize != 8:  # C's widths vary, the wire's do not
    raise ImportError("tidelog.wire.columns needs 4-byte C ints and 8-byte C long longs")
_SWAP: Final = sys.byteorder == "big"
"""The wire is little-endian; ``array`` holds the machine's order."""


class FrameBytes:
    """The byte columns of one ``RecordBatch`` frame, each read from the message once, when
    first asked for.

    Reading a bytes field of a parsed protobuf message makes a new ``bytes`` object (a copy)
    every time: whoever views a frame's columns (numpy arrays, Arrow buffers) goes through one
    of these, so that each column is copied out of the message at most once, and a column
    nobody asks for (the values, for a read of offsets only) never is."""

    __slots__ = ("_frame", "_read")

    def __init__(self, frame: v1.RecordBatch) -> None:
        self._frame = frame
        self._read: dict[str, bytes] = {}

    @property
    def frame(self) -> v1.RecordBatch:
        """The frame as a protobuf message."""
        return self._frame

    @classmethod
    def of(cls, frame: v1.RecordBatch) -> FrameBytes:
        return cls(frame)

    def _field(self, name: str, holder: object) -> bytes:
        got = self._read.get(name)
        if got is None:
            got = self._read[name] = getattr(holder, name)
        return got

    @property
    def offsets(self) -> bytes:
        return self._field("offsets", self.frame)

    @property
    def timestamps(self) -> bytes:
        return self._field("timestamps", self.frame)

    @property
    def values(self) -> bytes:
        return self._field("values", self.frame.messages)

    def values_span(self) -> tuple[bytes, int, int]:
        """The value bytes without a copy where the frame allows: a buffer, where the values
        start in it and their length (the buffer may hold other data around them)."""
        values = self.values
        return values, 0, len(values)

    @property
    def values_omitted(self) -> bool:
        """Whether the frame was sent without its value bytes (``values`` is then empty)."""
        return self.frame.messages.values_omitted

    @property
    def value_sizes(self) -> bytes:
        return self._field("value_sizes", self.frame.messages)

    @property
    def value_positions(self) -> bytes:
        return self._field("value_positions", self.frame.messages)

    @property
    def keys(self) -> bytes:
        return self._field("keys", self.frame.messages)

    @property
    def key_sizes(self) -> bytes:
        return self._field("key_sizes", self.frame.messages)

    @property
    def headers(self) -> Sequence[v1.HeaderList]:
        """One list per message, or none at all (not copied: protobuf lists)."""
        return self.frame.messages.headers


OMITTED_IN_PUBLISH: Final = (
    "malformed batch: values_omitted is set (only subscription frames may omit their values)"
)


def _encoded(column: array[int]) -> bytes:
    if _SWAP:
        column.byteswap()
    return column.tobytes()


def _decoded(typecode: str, blob: bytes, name: str) -> array[int]:
    """``blob`` as a column of ``typecode``; ``ValueError`` if it is not whole entries."""
    column = array(typecode)
    if len(blob) % column.itemsize:
        raise ValueError(
            f"malformed batch: {name} is not a whole number of {_KINDS[typecode]} entries"
        )
    column.frombytes(blob)
    if _SWAP:
        column.byteswap()
    return column


def pack(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Mapping[str, bytes]] | None = None,
) -> v1.Messages:
    """Columns for ``values`` with optional per-message keys and headers."""
    columns = v1.Messages(
        values=b"".join(values), value_sizes=_encoded(array(_U32, map(len, values)))
    )
    add_keys_and_headers(columns, len(values), keys, headers)
    return columns


def add_keys_and_headers(
    columns: v1.Messages,
    n: int,
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Mapping[str, bytes]] | None,
) -> None:
    """Set the key and header columns of ``columns`` (n messages); none when no message has
    one."""
    if keys is not None and any(k is not None for k in keys):
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} values")
        columns.keys = b"".join(k for k in keys if k)
        columns.key_sizes = _encoded(array(_I32, [-1 if k is None else len(k) for k in keys]))
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
        value_sizes=sizes.astype("<u4").tobytes(),
        value_positions=starts.astype("<u4").tobytes(),
    )
    add_keys_and_headers(columns, len(sizes), keys, headers)
    return columns


def pack_without_values(
    sizes: npt.NDArray[np.int64] | None,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Mapping[str, bytes]] | None = None,
    *,
    count: int | None = None,
) -> v1.Messages:
    """Columns without the value bytes (``values_omitted``): each value's size, keys, headers;
    ``sizes=None``: without the sizes either (``value_sizes_omitted``; ``count`` records)."""
    if sizes is None:
        columns = v1.Messages(values_omitted=True, value_sizes_omitted=True)
        n = count if count is not None else 0
    else:
        columns = v1.Messages(value_sizes=sizes.astype("<u4").tobytes(), values_omitted=True)
        n = len(sizes)
    add_keys_and_headers(columns, n, keys, headers)
    return columns


def plain_values(columns: v1.Messages) -> tuple[bytes, npt.NDArray[np.int64]] | None:
    """The values buffer and sizes of a batch without keys or headers (None if it has some);
    ``ValueError`` if the sizes do not fit the buffer."""
    import numpy as np  # the server's form: see the module's docstring

    if columns.values_omitted:  # a refused request (INVALID_ARGUMENT), as any malformed batch
        raise ValueError(OMITTED_IN_PUBLISH)
    if columns.keys or columns.key_sizes or len(columns.headers) or columns.value_positions:
        return None
    if len(columns.value_sizes) % 4:
        raise ValueError("malformed batch: value_sizes is not a whole number of u32 entries")
    sizes = np.frombuffer(columns.value_sizes, dtype="<u4").astype(np.int64)
    if int(sizes.sum()) != len(columns.values):
        raise ValueError(
            f"malformed batch: value sizes add up to {int(sizes.sum())} bytes but "
            f"{len(columns.values)} bytes of values were sent"
        )
    return columns.values, sizes


def _split(blob: bytes, sizes: Iterable[int]) -> tuple[list[bytes], int]:
    """``blob`` cut into pieces of ``sizes`` from its start, and how many bytes they take."""
    ends = list(accumulate(sizes))
    return [blob[a:b] for a, b in pairwise(chain((0,), ends))], ends[-1] if ends else 0


def unpack(
    columns: v1.Messages | FrameBytes,
) -> tuple[list[bytes], list[bytes | None] | None, list[dict[str, bytes]] | None]:
    """Values, keys (None: no keys) and headers (None: no headers) of a batch (its ``Messages``,
    or the :class:`FrameBytes` of its frame, which read each column once).

    Raises ``ValueError`` naming the inconsistency when the columns do not fit together.
    """
    if columns.values_omitted:
        raise ValuesOmitted(
            "this batch was read without its values (without_values): it has no messages to "
            "build; read its offsets, timestamps, keys and value sizes as columns"
        )
    value_sizes = _decoded(_U32, columns.value_sizes, "value_sizes")
    n = len(value_sizes)
    blob = columns.values
    if columns.value_positions:
        if len(columns.value_positions) != 4 * n:
            raise ValueError(f"malformed batch: value_positions must hold {n} u32 entries")
        starts = _decoded(_U32, columns.value_positions, "value_positions")
        ends = list(map(add, starts, value_sizes))
        if n and max(ends) > len(blob):
            raise ValueError("malformed batch: a value position points past the values sent")
        values = [blob[a:b] for a, b in zip(starts, ends, strict=True)]
    else:
        values, total = _split(blob, value_sizes)
        if total != len(blob):
            raise ValueError(
                f"malformed batch: value sizes add up to {total} bytes but "
                f"{len(blob)} bytes of values were sent"
            )
    keys: list[bytes | None] | None = None
    if columns.keys and not columns.key_sizes:
        raise ValueError("malformed batch: keys were sent without key_sizes")
    if columns.key_sizes:
        if len(columns.key_sizes) != 4 * n:
            raise ValueError(f"malformed batch: key_sizes must hold {n} i32 entries")
        key_sizes = _decoded(_I32, columns.key_sizes, "key_sizes")
        lowest = min(key_sizes, default=0)
        if lowest < -1:
            raise ValueError("malformed batch: a key size below -1")
        every_key = lowest >= 0  # the usual case: no None to put back
        present = key_sizes if every_key else [max(s, 0) for s in key_sizes]
        split, total = _split(columns.keys, present)
        if total != len(columns.keys):
            raise ValueError("malformed batch: key sizes do not add up to the keys sent")
        keys = (
            cast("list[bytes | None]", split)
            if every_key
            else [None if s < 0 else k for k, s in zip(split, key_sizes, strict=True)]
        )
    headers: list[dict[str, bytes]] | None = None
    if len(columns.headers):
        if len(columns.headers) != n:
            raise ValueError(f"malformed batch: {len(columns.headers)} header lists for {n} values")
        headers = [{h.name: h.value for h in lst.headers} for lst in columns.headers]
    return values, keys, headers


def pack_int64(column: npt.NDArray[np.int64]) -> bytes:
    """An int64 column (offsets, timestamps) from a numpy array."""
    return column.astype("<i8", copy=False).tobytes()


def unpack_int64(blob: bytes) -> npt.NDArray[np.int64]:
    """An int64 column as a numpy array (the server's form; :func:`int64_list` is the client's)."""
    import numpy as np  # the server's form: see the module's docstring

    if len(blob) % 8:
        raise ValueError("malformed batch: an int64 column is not a whole number of entries")
    return np.frombuffer(blob, dtype="<i8").astype(np.int64)


def int64_list(blob: bytes) -> list[int]:
    """An int64 column (offsets, timestamps) as Python ints."""
    return _decoded(_I64, blob, "an int64 column").tolist()


def int32_list(blob: bytes) -> list[int]:
    """An int32 column (a browse page's partitions) as Python ints."""
    return _decoded(_I32, blob, "an int32 column").tolist()


def pack_u32(numbers: Iterable[int]) -> bytes:
    """A u32 column (a transmit's payload sizes and destination indexes)."""
    return _encoded(array(_U32, numbers))
