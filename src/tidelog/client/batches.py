"""Received batches: one subscription frame (or browse page) as columns, messages on demand.

What ``subscribe_batches`` hands out (and a browse page holds): a :class:`ReceivedBatch` is the
frame's columns, viewed where they arrived, with no Python object per message until a caller
asks for one.

- ``offsets``, ``timestamps`` (ns) and ``partitions``: numpy ``int64``/``int32`` arrays over the
  frame's own little-endian columns (read-only views, no copy);
- ``values`` and ``keys``: :class:`BinaryColumn` s, a numpy ``uint8`` view of the buffer the
  bytes arrived in, with each entry's start and size as numpy arrays (views of the frame's size
  and position columns; starts are computed when the frame sends values back to back);
  ``column[i]`` slices one entry, ``column.to_list()`` all of them;
- ``headers``: one mapping per message, built when asked (the protocol carries a protobuf list
  per message, so there is nothing to view), and ``header(name)``, one header's values;
- ``to_arrow(columns)``: a ``pyarrow.RecordBatch`` of those columns (``tidelog.wire.arrow``:
  built from the same buffers; pyarrow is the ``spark`` extra, loaded on the first call, and
  missing it raises :class:`~tidelog.errors.MissingExtra`).

Indexing one message builds that one from the columns (which loads numpy). Iterating, slicing or
``messages()`` builds every message of the batch once, as the client always did (``ReceivedMessage``
named tuples made at C level: no Python call per message), and keeps them: old code that iterated a
batch's decoded messages iterates the batch itself.

Each byte column is read out of the protobuf message at most once (``FrameBytes``; reading a bytes
field of a parsed message copies it), and only when something needs it. A subscription's frames are
not parsed by protobuf at all (``tidelog.wire.received``): their columns are found in the bytes
received, and the values are used there (``BinaryColumn.buffer`` is then the frame). numpy is loaded
by the column accessors only: iterating messages loads neither numpy nor pyarrow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, overload

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client.models import ReceivedMessage
from tidelog.errors import ValuesOmitted
from tidelog.wire import columns
from tidelog.wire.arrow import COLUMNS, MalformedBatch, arrow_batch
from tidelog.wire.columns import FrameBytes

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

NO_HEADERS: Mapping[str, bytes] = MappingProxyType({})


def decode_frame(
    frame: v1.RecordBatch | FrameBytes,
    stream: str,
    partition: int,
    partitions: bytes | None = None,
) -> list[ReceivedMessage]:
    """The messages of one frame, in delivery order. ``ValueError`` for columns that do not fit.

    ``partitions``: a browse page's n int32 partitions, in place of ``partition``; its messages'
    headers are read-only mappings (as ``browse`` always gave them), a subscription's dicts."""
    got = frame if isinstance(frame, FrameBytes) else FrameBytes(frame)
    offsets = columns.int64_list(got.offsets)
    timestamps = columns.int64_list(got.timestamps)
    values, keys, headers = columns.unpack(got)
    n = len(values)
    if len(offsets) != n or len(timestamps) != n:
        raise MalformedBatch("malformed batch: its columns have different lengths")
    if partitions is None:
        where: Any = repeat(partition, n)
    else:
        where = columns.int32_list(partitions)
        if len(where) != n:
            raise MalformedBatch("malformed page: its columns have different lengths")
    # tuple.__new__ through map stays in C: no Python call per message.
    return list(
        map(
            tuple.__new__,
            repeat(ReceivedMessage, n),
            zip(
                offsets,
                timestamps,
                repeat(None, n) if keys is None else keys,
                values,
                repeat(NO_HEADERS, n)
                if headers is None
                else headers
                if partitions is None
                else map(MappingProxyType, headers),
                where,
                repeat(stream, n),
                strict=True,
            ),
        )
    )


class BinaryColumn(Sequence["bytes | None"]):
    """Byte strings that lie in one buffer: entry i is ``buffer[starts[i] : starts[i] +
    sizes[i]]``, or None where ``sizes[i]`` is -1 (a message without a key).

    ``buffer``, ``starts`` and ``sizes`` are numpy arrays (views of what arrived where they can
    be); indexing slices one entry out of the buffer, ``to_list()`` all of them."""

    __slots__ = ("_blob", "_listed", "_sizes", "_starts")

    def __init__(self, blob: bytes, starts: npt.NDArray[np.int64], sizes: npt.NDArray[Any]) -> None:
        self._blob = blob
        self._starts = starts
        self._sizes = sizes
        self._listed: list[bytes | None] | None = None

    @property
    def buffer(self) -> npt.NDArray[np.uint8]:
        """The bytes the entries lie in (read-only; a value's neighbours may be other data)."""
        import numpy as np  # see the module's docstring: columns load numpy, messages do not

        return np.frombuffer(self._blob, dtype=np.uint8)

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        return self._starts

    @property
    def sizes(self) -> npt.NDArray[Any]:
        """Each entry's size in bytes (-1: None)."""
        return self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def to_list(self) -> list[bytes | None]:
        """Every entry as ``bytes`` (None where absent), made once and kept."""
        if self._listed is None:
            starts = self._starts.tolist()
            sizes = self._sizes.tolist()
            blob = self._blob
            self._listed = [
                None if size < 0 else blob[start : start + size]
                for start, size in zip(starts, sizes, strict=True)
            ]
        return self._listed

    def __iter__(self) -> Iterator[bytes | None]:
        return iter(self.to_list())

    @overload
    def __getitem__(self, index: int) -> bytes | None: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes | None]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes | None] | None:
        if isinstance(index, slice):
            return self.to_list()[index]
        size = int(self._sizes[index])
        if size < 0:
            return None
        start = int(self._starts[index])
        return self._blob[start : start + size]


def _value_column(got: FrameBytes, n: int) -> BinaryColumn:
    import numpy as np

    if got.values_omitted:
        raise ValuesOmitted(
            "this batch was read without its values (subscribe_batches(values=False)): "
            "its value_sizes are there, its values are not"
        )
    if len(got.value_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: value_sizes must hold {n} u32 entries")
    sizes = np.frombuffer(got.value_sizes, dtype="<u4")
    # The values where they arrived: in a frame received serialised, at their place in it.
    blob, at, length = got.values_span()
    if got.value_positions:
        if len(got.value_positions) != 4 * n:
            raise MalformedBatch(f"malformed batch: value_positions must hold {n} u32 entries")
        starts = np.add(np.frombuffer(got.value_positions, dtype="<u4"), at, dtype=np.int64)
        if n and int((starts + sizes).max()) > at + length:
            raise MalformedBatch("malformed batch: a value position points past the values sent")
        return BinaryColumn(blob, starts, sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    if (int(ends[-1]) if n else 0) != length:
        raise MalformedBatch(
            f"malformed batch: value sizes add up to {int(ends[-1]) if n else 0} bytes but "
            f"{length} bytes of values were sent"
        )
    return BinaryColumn(blob, ends - sizes + at, sizes)


def _key_column(got: FrameBytes, n: int) -> BinaryColumn | None:
    import numpy as np

    if not got.key_sizes:
        if got.keys:
            raise MalformedBatch("malformed batch: keys were sent without key_sizes")
        return None
    if len(got.key_sizes) != 4 * n:
        raise MalformedBatch(f"malformed batch: key_sizes must hold {n} i32 entries")
    sizes = np.frombuffer(got.key_sizes, dtype="<i4")
    present = np.maximum(sizes, 0).astype(np.int64)
    ends = np.cumsum(present)
    if (int(ends[-1]) if n else 0) != len(got.keys) or int(sizes.min(initial=0)) < -1:
        raise MalformedBatch("malformed batch: key sizes do not add up to the keys sent")
    return BinaryColumn(got.keys, ends - present, sizes)


class ReceivedBatch(Sequence[ReceivedMessage]):
    """One frame of ``stream``'s ``partition`` (a browse page: of several partitions) as
    columns; iterate it (or index it) for its messages. See the module's docstring."""

    __slots__ = (
        "_bytes",
        "_keys",
        "_messages",
        "_n",
        "_partitions",
        "_values",
        "partition",
        "stream",
    )

    def __init__(
        self,
        frame: v1.RecordBatch | FrameBytes,
        stream: str,
        partition: int,
        *,
        partitions: bytes | None = None,
    ) -> None:
        self._bytes = frame if isinstance(frame, FrameBytes) else FrameBytes(frame)
        self.stream = stream
        self.partition = partition
        """The partition of every message (a browse page: the first message's, or -1 when
        empty; ``partitions`` has each message's)."""
        self._partitions = partitions
        offsets = self._bytes.offsets
        if len(offsets) % 8 or len(self._bytes.timestamps) != len(offsets):
            raise MalformedBatch(
                "malformed batch: offsets and timestamps must be n int64 each (this client never"
                " asks for frames without timestamps, SubscribeBatchesRequest.without_timestamps)"
            )
        self._n = len(offsets) // 8
        if partitions is not None and len(partitions) != 4 * self._n:
            raise MalformedBatch("malformed page: partitions is not one int32 per message")
        self._messages: list[ReceivedMessage] | None = None
        self._values: BinaryColumn | None = None
        self._keys: BinaryColumn | bool | None = False  # False: not looked at yet

    @property
    def frame(self) -> v1.RecordBatch:
        """The ``tidelog.v1.RecordBatch`` as received (``tidelog.wire.columns`` reads it)."""
        return self._bytes.frame

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        span = f", offsets {self.first_offset}..{self.last_offset}" if self._n else ""
        return (
            f"ReceivedBatch({self.stream!r}, partition={self.partition}, {self._n} messages{span})"
        )

    # -- columns -------------------------------------------------------------------------------

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """Each message's offset, in delivery order (a view of the frame: read-only)."""
        import numpy as np

        return np.frombuffer(self._bytes.offsets, dtype="<i8")

    @property
    def timestamps(self) -> npt.NDArray[np.int64]:
        """Each message's broker timestamp, ns since the Unix epoch (read-only view)."""
        import numpy as np

        return np.frombuffer(self._bytes.timestamps, dtype="<i8")

    @property
    def partitions(self) -> npt.NDArray[np.int32]:
        """Each message's partition (a browse page's view of its column; else one value)."""
        import numpy as np

        if self._partitions is not None:
            return np.frombuffer(self._partitions, dtype="<i4")
        return np.full(self._n, self.partition, dtype=np.int32)

    @property
    def first_offset(self) -> int:
        return int.from_bytes(self._bytes.offsets[:8], "little", signed=True)

    @property
    def last_offset(self) -> int:
        return int.from_bytes(self._bytes.offsets[-8:], "little", signed=True)

    @property
    def values(self) -> BinaryColumn:
        """Each message's value, where it arrived (see :class:`BinaryColumn`)."""
        if self._values is None:
            self._values = _value_column(self._bytes, self._n)
        return self._values

    @property
    def values_omitted(self) -> bool:
        """Whether the batch was read without its values (``subscribe_batches(values=False)``):
        then ``values``, ``messages()`` and an Arrow ``value`` column raise
        :class:`~tidelog.errors.ValuesOmitted`, and ``value_sizes`` still holds every size."""
        return self._bytes.values_omitted

    @property
    def value_sizes(self) -> npt.NDArray[np.uint32]:
        """Each message's value size in bytes (a read-only view of the frame's column; there
        also when the batch was read without its values)."""
        import numpy as np

        sizes = self._bytes.value_sizes
        if len(sizes) != 4 * self._n:
            raise MalformedBatch(f"malformed batch: value_sizes must hold {self._n} u32 entries")
        return np.frombuffer(sizes, dtype="<u4")

    @property
    def keys(self) -> BinaryColumn | None:
        """Each message's key (None where it has none), or None when no message has one."""
        if self._keys is False:
            self._keys = _key_column(self._bytes, self._n)
        return self._keys  # type: ignore[return-value]

    @property
    def has_headers(self) -> bool:
        return len(self._bytes.headers) > 0

    @property
    def headers(self) -> list[Mapping[str, bytes]]:
        """Each message's headers (built now: the protocol has one protobuf list each)."""
        lists = self._bytes.headers
        if not len(lists):
            return [NO_HEADERS] * self._n
        if len(lists) != self._n:
            raise MalformedBatch(f"malformed batch: {len(lists)} header lists for {self._n}")
        return [MappingProxyType({h.name: h.value for h in hs.headers}) for hs in lists]

    def header(self, name: str) -> list[bytes | None]:
        """Header ``name`` of each message (None where a message does not have it)."""
        return self.headers_named((name,))[name]

    def headers_named(self, names: Sequence[str]) -> dict[str, list[bytes | None]]:
        """Headers ``names`` of each message, one list per name (None where a message does not
        have it), in one pass over the messages' header lists."""
        found: dict[str, list[bytes | None]] = {name: [None] * self._n for name in names}
        lists = self._bytes.headers
        if not len(lists):
            return found
        if len(lists) != self._n:
            raise MalformedBatch(f"malformed batch: {len(lists)} header lists for {self._n}")
        for i, hs in enumerate(lists):
            for h in hs.headers:
                column = found.get(h.name)
                if column is not None:
                    column[i] = h.value
        return found

    def to_arrow(self, columns: Sequence[str] = COLUMNS) -> Any:
        """The batch as a ``pyarrow.RecordBatch`` of ``columns`` (names and types of the Spark
        source's schema, ``tidelog.wire.arrow.arrow_schema``; all of them by default).
        Needs pyarrow (the ``spark`` extra): :class:`~tidelog.errors.MissingExtra` without."""
        return arrow_batch(
            self._bytes, self.stream, self.partition, columns, partitions=self._partitions
        )

    # -- messages ------------------------------------------------------------------------------

    def messages(self) -> list[ReceivedMessage]:
        """Every message of the batch, built on the first call and kept."""
        if self._messages is None:
            self._messages = decode_frame(
                self._bytes, self.stream, self.partition, self._partitions
            )
        return self._messages

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return iter(self.messages())

    @overload
    def __getitem__(self, index: int) -> ReceivedMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ReceivedMessage]: ...
    def __getitem__(self, index: int | slice) -> ReceivedMessage | list[ReceivedMessage]:
        if isinstance(index, slice) or self._messages is not None:
            return self.messages()[index]
        return self._message_at(index)

    def _message_at(self, index: int) -> ReceivedMessage:
        """Message ``index`` alone, built from the columns: the message ``messages()[index]``
        would be, without building the others (a catch-up's frame holds thousands)."""
        n = self._n
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"message {index} of a batch of {n}")
        got = self._bytes
        lists = got.headers
        if len(lists) and len(lists) != n:
            raise MalformedBatch(f"malformed batch: {len(lists)} header lists for {n}")
        headers: Mapping[str, bytes] = (
            {h.name: h.value for h in lists[i].headers} if len(lists) else NO_HEADERS
        )
        partition = self.partition
        if self._partitions is not None:
            headers = MappingProxyType(dict(headers)) if len(lists) else NO_HEADERS
            partition = int.from_bytes(self._partitions[4 * i : 4 * i + 4], "little", signed=True)
        keys = self.keys
        return ReceivedMessage(
            int.from_bytes(got.offsets[8 * i : 8 * i + 8], "little", signed=True),
            int.from_bytes(got.timestamps[8 * i : 8 * i + 8], "little", signed=True),
            None if keys is None else keys[i],
            self.values[i],  # type: ignore[arg-type]  # a value is never None
            headers,
            partition,
            self.stream,
        )


__all__ = ["BinaryColumn", "ReceivedBatch", "decode_frame"]
