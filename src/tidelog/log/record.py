"""The on-disk record format: encoding a batch, verifying and decoding stored records.

The record's byte layout (its fixed 36-byte header, then key, value and headers) is in
``record_layout.py``, with the encoders that lay whole batches out by it; its names are
re-exported here. Invariants: ``size == 36 + max(keylen, 0) + vallen + len(headers)``; the CRC
covers the offset, so a record copied to the wrong place fails its check. A record with CONTINUES
set is followed, in the same segment, by the rest of its batch; a log whose newest record has it
set holds a torn batch (recovery cuts it, see ``recovery.py``).

Theory of operation. Everything here works on whole batches: :func:`encode_batch` takes the
shapes a batch comes in (plain values, :class:`NewRecord`, the columnar :class:`PackedValues`,
:class:`HeaderedValues` and :class:`LaidOutRecords`), turns them into bodies and lays them out
by one of ``record_layout``'s paths; header fields are packed and gathered with numpy, every
record's CRC is computed (appending) or checked (reading) in one native call per batch
(``crcs.py``), and the only per-record Python work is, when decoding, one slice per field that
is asked for.
"""

from __future__ import annotations

import struct
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, cast, overload

import numpy as np
import numpy.typing as npt
from crc32c import crc32c
from numpy.lib.stride_tricks import as_strided

from tidelog.errors import CorruptRecord, MessageTooLarge
from tidelog.log.crcs import DISAGREES, OUTSIDE, check_records, record_crcs, stamp_crcs
from tidelog.log.record_layout import CONTINUES as CONTINUES
from tidelog.log.record_layout import HEADER_DTYPE as HEADER_DTYPE
from tidelog.log.record_layout import HEADER_SIZE as HEADER_SIZE
from tidelog.log.record_layout import (
    HEADER_STRUCT,
    encode_one_size,
    encode_small,
    header_rows,
    one_size,
)
from tidelog.log.record_layout import MAGIC as MAGIC
from tidelog.log.record_layout import EncodedBatch as EncodedBatch
from tidelog.log.record_layout import Int64Array as Int64Array

NO_HEADERS: Final[Mapping[str, bytes]] = MappingProxyType({})

_SMALL_BATCH: Final = 16
_NAME_LEN: Final = struct.Struct("<H")
_VALUE_LEN: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to append, before it has an offset and a timestamp: a value with an optional key
    and ordered headers (name -> bytes). Read back, it is a :class:`Record`. (The client's
    ``tidelog.Message`` is the client's own type; the log never sees it.)"""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=lambda: NO_HEADERS)


@dataclass(frozen=True, slots=True)
class Record:
    """A stored message as read back: its offset and broker timestamp (ns) with the message."""

    offset: int
    timestamp: int
    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=lambda: NO_HEADERS)


def encode_headers(headers: Mapping[str, bytes]) -> bytes:
    """Headers as a record stores them after its value (the module docstring's byte table)."""
    parts: list[bytes] = []
    for name, value in headers.items():
        raw = name.encode()
        parts += (_NAME_LEN.pack(len(raw)), raw, _VALUE_LEN.pack(len(value)), value)
    return b"".join(parts)


def header_prefix(name: str, value_length: int) -> bytes:
    """The stored bytes of a header named ``name`` before its value of ``value_length`` bytes."""
    raw = name.encode()
    return _NAME_LEN.pack(len(raw)) + raw + _VALUE_LEN.pack(value_length)


class PackedValues(Sequence[bytes]):
    """Plain values (no keys, no headers) carried as one buffer and their sizes.

    What a batch arrives as over the wire: appending it skips splitting the buffer into one
    object per value and joining them again.
    """

    __slots__ = ("_starts", "blob", "sizes")

    def __init__(self, blob: bytes, sizes: Int64Array) -> None:
        if int(sizes.sum()) != len(blob):
            raise ValueError(f"value sizes add up to {int(sizes.sum())}, not {len(blob)} bytes")
        self.blob = blob
        self.sizes = sizes
        self._starts: list[int] | None = None

    def __len__(self) -> int:
        return len(self.sizes)

    def split(self) -> list[bytes]:
        ends = np.cumsum(self.sizes)
        blob = self.blob
        return [blob[a:b] for a, b in zip((ends - self.sizes).tolist(), ends.tolist(), strict=True)]

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return self.split()[index]
        if self._starts is None:
            self._starts = [0, *np.cumsum(self.sizes).tolist()]
        if index < 0:
            index += len(self)
        return self.blob[self._starts[index] : self._starts[index + 1]]


class HeaderedValues(Sequence[NewRecord]):
    """Values that each carry one header of the same name and a fixed-width value, as columns:
    the values back to back (``blob``, ``sizes``) and the header values back to back
    (``header_values``, ``width`` bytes each).

    What a sink appends to a receive queue (each payload with its ``__position``): the records
    are laid out with a few numpy calls instead of a ``NewRecord`` and a header dict per value.
    Stored, they are byte for byte the records those ``NewRecord`` would make.
    """

    __slots__ = ("blob", "header_name", "header_values", "sizes", "width")

    def __init__(
        self, blob: bytes, sizes: Int64Array, header_name: str, header_values: bytes, width: int
    ) -> None:
        if int(sizes.sum()) != len(blob):
            raise ValueError(f"value sizes add up to {int(sizes.sum())}, not {len(blob)} bytes")
        if width < 0 or len(header_values) != width * len(sizes):
            raise ValueError(
                f"{len(header_values)} bytes of header values for {len(sizes)} x {width}"
            )
        self.blob = blob
        self.sizes = sizes
        self.header_name = header_name
        self.header_values = header_values
        self.width = width

    def __len__(self) -> int:
        return len(self.sizes)

    def records(self) -> list[NewRecord]:
        """One ``NewRecord`` per value (for the paths that need objects)."""
        values = PackedValues(self.blob, self.sizes).split()
        w = self.width
        name = self.header_name
        return [
            NewRecord(v, headers={name: self.header_values[i * w : (i + 1) * w]})
            for i, v in enumerate(values)
        ]

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
        start = int(self.sizes[:index].sum())
        value = self.blob[start : start + int(self.sizes[index])]
        header = self.header_values[index * self.width : (index + 1) * self.width]
        return NewRecord(value, headers={self.header_name: header})

    def bodies(self) -> PackedValues:
        """Each record's body (its value, then its one encoded header), back to back."""
        name = self.header_name.encode()
        prefix = np.frombuffer(
            _NAME_LEN.pack(len(name)) + name + _VALUE_LEN.pack(self.width), dtype=np.uint8
        )
        n = len(self.sizes)
        suffix_len = len(prefix) + self.width
        sizes = self.sizes.astype(np.int64)
        body_sizes = sizes + suffix_len
        suffix = np.empty((n, suffix_len), dtype=np.uint8)
        suffix[:, : len(prefix)] = prefix
        suffix[:, len(prefix) :] = np.frombuffer(self.header_values, dtype=np.uint8).reshape(
            n, self.width
        )
        if n and int(sizes.min()) == int(sizes.max()):
            # Every value the same size: the bodies are the rows of one 2-D array.
            size = int(sizes[0])
            grid = np.empty((n, size + suffix_len), dtype=np.uint8)
            grid[:, :size] = np.frombuffer(self.blob, dtype=np.uint8).reshape(n, size)
            grid[:, size:] = suffix
            return PackedValues(grid.tobytes(), body_sizes)
        ends = np.cumsum(sizes).tolist()
        blob = self.blob
        tails = suffix.tobytes()
        parts: list[bytes] = [b""] * (2 * n)
        parts[0::2] = [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        parts[1::2] = [tails[i : i + suffix_len] for i in range(0, n * suffix_len, suffix_len)]
        return PackedValues(b"".join(parts), body_sizes)


class LaidOutRecords(Sequence[NewRecord]):
    """Records that come with their bodies laid out already (``bodies.RecordBodies``): the
    encoder takes the columns as they are, with no object per record."""

    __slots__ = ()

    @abstractmethod
    def laid_out(self) -> tuple[PackedValues, Int64Array, Int64Array, Int64Array]:
        """(the bodies back to back with their sizes, value lengths, key lengths (-1: no key),
        header counts)."""

    @abstractmethod
    def payload_bytes(self) -> int:
        """The bytes of the values (what a publish counts as its payload)."""


def _bodies(
    messages: Sequence[bytes | NewRecord],
) -> tuple[Sequence[bytes], Int64Array, Int64Array | int, Int64Array | int]:
    """Bodies (key + value + encoded headers), value lengths, key lengths and header counts.

    Plain byte strings (or any bytes-like values) take the fast path: their body is the value.
    """
    if isinstance(messages, PackedValues):
        return messages, messages.sizes.astype(np.int64), -1, 0
    if isinstance(messages, HeaderedValues):
        return messages.bodies(), messages.sizes.astype(np.int64), -1, 1
    if isinstance(messages, LaidOutRecords):
        return messages.laid_out()
    n = len(messages)
    try:
        vallens = np.fromiter(map(len, cast(Sequence[bytes], messages)), dtype=np.int64, count=n)
    except TypeError:
        pass
    else:
        if not any(isinstance(m, NewRecord | str) for m in messages[:1]):
            return messages, vallens, -1, 0  # type: ignore[return-value]
    msgs = [_as_message(m, i) for i, m in enumerate(messages)]
    keys = [m.key for m in msgs]
    blobs = [encode_headers(m.headers) if m.headers else b"" for m in msgs]
    bodies = [
        b"".join((k or b"", m.value, h)) if k or h else m.value
        for k, m, h in zip(keys, msgs, blobs, strict=True)
    ]
    vallens = np.fromiter((len(m.value) for m in msgs), dtype=np.int64, count=n)
    keylens = np.fromiter((-1 if k is None else len(k) for k in keys), dtype=np.int64, count=n)
    hcounts = np.fromiter((len(m.headers) for m in msgs), dtype=np.int64, count=n)
    return bodies, vallens, keylens, hcounts


def _as_message(m: object, index: int) -> NewRecord:
    if isinstance(m, NewRecord):
        return m
    if isinstance(m, bytes | bytearray | memoryview):
        return NewRecord(bytes(m))
    raise TypeError(
        f"message {index} of the batch is a {type(m).__name__}; append takes bytes or "
        f"tidelog.log.NewRecord values"
    )


def encode_batch(
    messages: Sequence[bytes | NewRecord],
    offsets: Int64Array,
    timestamp: int,
    max_message_bytes: int,
    *,
    atomic: bool = False,
) -> EncodedBatch:
    """Encode ``messages`` as records with the given offsets and one broker timestamp.

    ``atomic`` sets CONTINUES on every record but the last, so recovery can tell a torn batch;
    without it every record's ``attrs`` is 0 (the bytes are exactly those of format version 1
    before the flag existed).

    Raises :class:`MessageTooLarge` (naming the message and both sizes) or ``TypeError`` before
    anything is built. The work is vectorised: headers are packed as one numpy array, records
    laid out once with one join (one reshape when all bodies have the same length), and their
    CRCs then stamped in one native pass over the laid-out bytes (``crcs.stamp_crcs``): what is
    checksummed is what is written, even for a mutable body the caller changes later.
    """
    n = len(messages)
    if n > _SMALL_BATCH:
        size = one_size(messages)
        if size >= 0:
            return encode_one_size(
                cast(Sequence[bytes], messages), size, offsets, timestamp, max_message_bytes, atomic
            )
    bodies, vallens, keylens, hcounts = _bodies(messages)
    if isinstance(bodies, PackedValues):
        body_lens = bodies.sizes.astype(np.int64)
    elif isinstance(keylens, int):
        body_lens = vallens
    else:
        body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if n and int(body_lens.max()) > max_message_bytes:
        index = int(np.argmax(body_lens > max_message_bytes))
        raise MessageTooLarge(int(body_lens[index]), max_message_bytes, index)

    sizes = body_lens + HEADER_SIZE
    if n <= _SMALL_BATCH:
        return encode_small(bodies, offsets, sizes, timestamp, vallens, keylens, hcounts, atomic)
    same_size = int(body_lens.min()) == int(body_lens.max())
    if same_size:  # and so, for plain values (the value is the body), one value length
        header = header_rows(
            offsets,
            timestamp,
            int(sizes[0]),
            int(vallens[0]) if vallens is body_lens else vallens,
            keylens,
            hcounts,
            atomic,
        )
    else:
        header = header_rows(offsets, timestamp, sizes, vallens, keylens, hcounts, atomic)
    try:
        if same_size:
            # Every record has the same size: lay the batch out as one 2-D array.
            joined = bodies.blob if isinstance(bodies, PackedValues) else b"".join(bodies)
            width = int(sizes[0])
            grid = np.empty((n, width), dtype=np.uint8)
            grid[:, :HEADER_SIZE] = header.view(np.uint8).reshape(n, HEADER_SIZE)
            grid[:, HEADER_SIZE:] = np.frombuffer(joined, dtype=np.uint8).reshape(
                n, width - HEADER_SIZE
            )
            flat = grid.reshape(-1)
        else:
            heads = header.tobytes()
            parts: list[bytes] = [b""] * (2 * n)
            parts[0::2] = [
                heads[i : i + HEADER_SIZE] for i in range(0, HEADER_SIZE * n, HEADER_SIZE)
            ]
            parts[1::2] = bodies.split() if isinstance(bodies, PackedValues) else bodies
            # One copy, into the writable buffer the CRCs are stamped into.
            flat = np.frombuffer(bytearray().join(parts), dtype=np.uint8)
    except TypeError:
        for i, m in enumerate(bodies):
            _as_message(m, i)
        raise
    stamp_crcs(flat, np.cumsum(sizes) - sizes, sizes)
    return EncodedBatch(flat, offsets, sizes, timestamp)


def gather_headers(chunk: bytes, positions: Int64Array) -> npt.NDArray[np.void]:
    """The fixed 36-byte headers of the records starting at ``positions`` in ``chunk``: when the
    records lie at a fixed stride (records of one size), a read-only strided view of ``chunk``
    (no copy: a copy of a 1 MiB read's headers cost ~0.02 µs per record, an eighth of a catch-up's
    server CPU; it keeps ``chunk`` alive, which the batch holding the headers does anyway), or
    a strided copy if ``chunk`` could change; else a gather."""
    count = len(positions)
    if count > 1:
        first = int(positions[0])
        stride = int(positions[1]) - first
        if (
            stride >= HEADER_SIZE
            and int(positions[-1]) == first + stride * (count - 1)
            and bool((np.diff(positions) == stride).all())
        ):
            strided: npt.NDArray[np.void] = np.ndarray(
                (count,), dtype=HEADER_DTYPE, buffer=chunk, offset=first, strides=(stride,)
            )
            return strided if memoryview(chunk).readonly else strided.copy()
    if not count:
        return np.empty(0, dtype=HEADER_DTYPE)
    raw = np.frombuffer(chunk, dtype=np.uint8)
    if len(raw) < HEADER_SIZE:
        raise IndexError(f"record header at {int(positions[0])}: past a {len(raw)}-byte chunk")
    # Every HEADER_SIZE-byte window of the chunk as a row (a view, nothing copied): taking the
    # rows at ``positions`` copies 36 bytes per record, with no index per byte.
    windows = as_strided(
        raw, shape=(len(raw) - HEADER_SIZE + 1, HEADER_SIZE), strides=(1, 1), writeable=False
    )
    header: npt.NDArray[np.void] = windows[positions].view(HEADER_DTYPE)
    return header.reshape(-1)


def verify_records(
    chunk: bytes,
    positions: Int64Array,
    sizes: Int64Array,
    offsets: Int64Array,
    timestamps: npt.NDArray[np.int64],
    segment: str,
    chunk_position: int,
    header: npt.NDArray[np.void] | None = None,
) -> npt.NDArray[np.void]:
    """Check every record in ``chunk`` against its CRC and its index entry; return the headers.

    ``positions`` are relative to ``chunk``, which starts at byte ``chunk_position`` of ``segment``.
    ``header``: the records' headers when the caller gathered them already (``gather_headers``
    of the same chunk and positions), else they are gathered here.
    Raises :class:`CorruptRecord` naming the first bad record; the caller never sees its bytes.
    """
    kind, i = check_records(chunk, positions, sizes, offsets, timestamps)
    if kind == OUTSIDE:
        raise CorruptRecord(
            segment, chunk_position, "index entries point outside the segment file (short read)"
        )
    if header is None:
        header = gather_headers(chunk, positions)
    if kind == DISAGREES:
        where = chunk_position + int(positions[i])
        crc = int(record_crcs(chunk, positions[i : i + 1] + 4, positions[i : i + 1] + sizes[i])[0])
        if crc != header["crc"][i]:
            detail = f"CRC-32C {crc:#010x} does not match stored {int(header['crc'][i]):#010x}"
        else:
            detail = (
                f"record header (offset {int(header['offset'][i])}, size {int(header['size'][i])}, "
                f"timestamp {int(header['timestamp'][i])}) disagrees with the index (offset "
                f"{int(offsets[i])}, size {int(sizes[i])}, timestamp {int(timestamps[i])})"
            )
        raise CorruptRecord(segment, where, detail)
    return header


def decode_headers(blob: bytes | memoryview, count: int) -> Mapping[str, bytes]:
    """Decode ``count`` encoded headers from ``blob`` (already CRC-verified)."""
    out: dict[str, bytes] = {}
    at = 0
    for _ in range(count):
        (name_len,) = _NAME_LEN.unpack_from(blob, at)
        at += 2
        name = bytes(blob[at : at + name_len]).decode()
        at += name_len
        (value_len,) = _VALUE_LEN.unpack_from(blob, at)
        at += 4
        out[name] = bytes(blob[at : at + value_len])
        at += value_len
    return out


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """What recovery learns about one intact record while scanning a segment file."""

    offset: int
    timestamp: int
    position: int
    size: int
    continues: bool = False
    """CONTINUES is set: the record is not the last of its atomic batch."""


def scan_records(
    data: bytes, start: int, previous_offset: int, previous_timestamp: int
) -> tuple[list[ScannedRecord], int]:
    """Walk records in ``data`` from byte ``start``, verifying framing, CRC and ordering.

    Stops at the first record that is incomplete, fails its CRC, has a bad magic byte, or whose
    offset does not increase or timestamp decreases. Returns the intact records and the byte
    position where the intact prefix ends (the cut point for a torn or corrupt tail).
    """
    found: list[ScannedRecord] = []
    at = start
    end = len(data)
    view = memoryview(data)
    while at + HEADER_SIZE <= end:
        crc, size, offset, timestamp, magic, attrs, hcount, keylen, vallen = (
            HEADER_STRUCT.unpack_from(data, at)
        )
        body = max(keylen, 0) + vallen
        if (
            magic != MAGIC
            or size < HEADER_SIZE
            or vallen < 0
            or keylen < -1
            or HEADER_SIZE + body > size
            or (hcount == 0 and HEADER_SIZE + body != size)
            or at + size > end
            or offset <= previous_offset
            or timestamp < previous_timestamp
            or crc32c(view[at + 4 : at + size]) != crc
        ):
            break
        found.append(ScannedRecord(offset, timestamp, at, size, bool(attrs & CONTINUES)))
        previous_offset, previous_timestamp = offset, timestamp
        at += size
    return found, at


@dataclass(frozen=True, slots=True)
class StoredCheck:
    """Stored records that passed :func:`stored_batches`' checks: the runs to write, and where
    each record starts in the data with its header as gathered (for the caller's own reading of
    the headers, without gathering them again)."""

    batches: list[EncodedBatch]
    positions: Int64Array
    sizes: Int64Array
    header: npt.NDArray[np.void]


def stored_batches(data: bytes, sizes: Int64Array, source: str) -> StoredCheck:
    """Records as another log stored them (``data``: whole records back to back, ``sizes[i]``
    bytes each), checked and cut into runs of one timestamp, ready to be written as they are.

    Each record must pass its CRC and size checks and the offsets must strictly increase;
    otherwise :class:`CorruptRecord` names ``source`` and the first bad record, and nothing is
    returned. The attrs (an atomic batch's CONTINUES flags) travel unchanged. Every header is
    gathered once, for all the checks and for the caller (``StoredCheck.header``)."""
    sizes = sizes.astype(np.int64)
    n = len(sizes)
    if not n:
        return StoredCheck([], sizes, sizes, np.empty(0, dtype=HEADER_DTYPE))
    ends = np.cumsum(sizes)
    if int(ends[-1]) != len(data) or int(sizes.min()) < HEADER_SIZE:
        raise CorruptRecord(source, 0, f"record sizes add up to {int(ends[-1])}, not {len(data)}")
    positions = ends - sizes
    header = gather_headers(data, positions)
    offsets = header["offset"].astype(np.int64)
    stamps = header["timestamp"].astype(np.int64)
    verify_records(data, positions, sizes, offsets, stamps, source, 0, header)
    if n > 1 and not bool((np.diff(offsets) > 0).all()):
        raise CorruptRecord(source, 0, "record offsets do not strictly increase")
    flat = np.frombuffer(data, dtype=np.uint8)
    cuts = (np.flatnonzero(np.diff(stamps)) + 1).tolist()
    batches = [
        EncodedBatch(
            flat[int(positions[a]) : int(ends[b - 1])], offsets[a:b], sizes[a:b], int(stamps[a])
        )
        for a, b in zip([0, *cuts], [*cuts, n], strict=True)
    ]
    return StoredCheck(batches, positions, sizes, header)
