"""Kafka record batches (format 2, "magic 2"): parsed into columns, and built from columns.

A batch, big-endian, as Produce (v3+) and Fetch (v4+) carry it::

    0  base_offset            i64    offset of the first record (a producer sends 0)
    8  batch_length           i32    bytes after this field
    12 partition_leader_epoch i32
    16 magic                  i8     2 (0 and 1 are the older message sets, refused)
    17 crc                    u32    CRC-32C of bytes [21, end of batch)
    21 attributes             i16    bits 0-2 codec, 3 timestamp type (1 LogAppendTime),
                                     4 transactional, 5 control
    23 last_offset_delta      i32
    27 base_timestamp         i64    ms
    35 max_timestamp          i64    ms
    43 producer_id            i64
    51 producer_epoch         i16
    53 base_sequence          i32
    57 records_count          i32
    61 records (compressed as a whole by the codec)

and each record: varint length (of what follows), i8 attributes, varlong timestamp delta, varint
offset delta, varint key length (-1 null), key, varint value length (-1 null), value, varint header
count, then per header varint key length, key (UTF-8), varint value length (-1 null), value.

Theory of operation. :func:`parse_batches` checks each batch's framing and CRC, decompresses its
records (bounded by ``max_bytes``, ``compression.py``) and reads them as columns
(:class:`KafkaBatch`). Where each record starts comes from the chain of length varints: guessed
for all records at once and proven by one vectorised decode when the records are alike (same
sizes, offset deltas 0, 1, 2, ...), else walked one Python step per record. Then every field is
one vectorised varint decode over all records (``varint.py``). Header lists are checked for all
records together, one header position at a time, but become Python objects only on request
(:meth:`KafkaBatch.headers_of`). :func:`build_batch` is the reverse: the records part is laid out
from columns by ``layout.py``, compressed, and framed with its header and one CRC.

Invariant: a :class:`KafkaBatch` only exists for bytes that passed every check: its spans lie in
its ``records`` buffer and every record's fields add up to its length.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
from crc32c import crc32c

from tidelog.kafka import varint
from tidelog.kafka.compression import Codec, codec_of, compress, decompress
from tidelog.kafka.errors import CorruptBatch, InvalidRecord, UnsupportedMessageFormat
from tidelog.kafka.layout import (
    Columns,
    HeaderList,
    SparseHeaders,
    encode_headers,
    lay_out,
    lay_out_into,
)
from tidelog.kafka.varint import Int64Array, UInt8Array

MAGIC: Final = 2
HEADER_SIZE: Final = 61
LENGTH_END: Final = 12
"""``batch_length`` counts the bytes after this position."""
CRC_START: Final = 21
"""The CRC covers the batch from here (the attributes) to its end."""
TIMESTAMP_TYPE: Final = 0x08
TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20
CREATE_TIME: Final = 0
LOG_APPEND_TIME: Final = 1
DEFAULT_MAX_RECORDS_BYTES: Final = 64 * 1024 * 1024
"""What a batch's records may decompress to, unless the caller bounds it otherwise."""
MIN_RECORD_SIZE: Final = 7
"""The smallest record: a length byte and six one-byte fields (no key, no value, no headers)."""

_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
_TAIL: Final = struct.Struct(">hiqqqhii")  # attributes .. records_count, what the CRC covers
_PREFIX: Final = struct.Struct(">qiib")  # base offset, length, leader epoch, magic
_CRC: Final = struct.Struct(">I")
_GUESSES: Final = 4
"""Guesses of where records start (``_record_bodies``) before walking the rest."""
_GUESS_PAYS: Final = 64
"""A guess that proves fewer records than this is not tried again: walk instead."""
_SPREAD_ENOUGH: Final = 32
"""Check headers column-wise while at least this many records still have one left to check."""

Header = tuple[str, bytes | None]
RawHeader = tuple[bytes, bytes | None]


@dataclass(frozen=True, eq=False)
class KafkaBatch:
    """One parsed record batch: its header fields, and its records as columns.

    ``records`` is the (decompressed) records part; every ``*_start`` is a position in it.
    ``key_len``/``value_len`` are -1 for a null key/value. ``headers_start``/``headers_end``
    span each record's header block in Kafka's wire form, the count varint included.
    """

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    codec: Codec
    timestamp_type: int
    is_transactional: bool
    is_control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    records: bytes
    timestamp: Int64Array
    offset_delta: Int64Array
    key_start: Int64Array
    key_len: Int64Array
    value_start: Int64Array
    value_len: Int64Array
    header_count: Int64Array
    headers_start: Int64Array
    headers_end: Int64Array

    def __len__(self) -> int:
        return self.count

    def keys(self) -> list[bytes | None]:
        data = self.records
        return [
            None if n < 0 else data[a : a + n]
            for a, n in zip(self.key_start.tolist(), self.key_len.tolist(), strict=True)
        ]

    def values(self) -> list[bytes | None]:
        data = self.records
        return [
            None if n < 0 else data[a : a + n]
            for a, n in zip(self.value_start.tolist(), self.value_len.tolist(), strict=True)
        ]

    def raw_headers_of(self, index: int) -> list[RawHeader]:
        """Record ``index``'s headers with their keys as the bytes sent."""
        if not self.header_count[index]:
            return []
        return read_headers(
            self.records, int(self.headers_start[index]), int(self.headers_end[index])
        )

    def headers_of(self, index: int) -> list[Header]:
        """Record ``index``'s headers in order (duplicates and null values kept); keys decoded
        as UTF-8 the way Java clients do (malformed bytes become U+FFFD)."""
        return [(k.decode(errors="replace"), v) for k, v in self.raw_headers_of(index)]


def read_headers(data: bytes | memoryview, at: int, end: int) -> list[RawHeader]:
    """A header block (count varint, then the headers) spanning ``[at, end)`` of ``data``;
    ``ValueError`` unless it is well formed and fills the span exactly."""
    count, at = varint.read(data, at, end)
    if count < 0 or count > (end - at) // 2:
        raise ValueError(f"a header count of {count} does not fit in {end - at} bytes")
    out: list[RawHeader] = []
    for _ in range(count):
        size, at = varint.read(data, at, end)
        if size < 0 or at + size > end:
            raise ValueError(f"a header key of {size} bytes does not fit its record")
        key = bytes(data[at : at + size])
        at += size
        size, at = varint.read(data, at, end)
        if size < -1 or at + max(size, 0) > end:
            raise ValueError(f"a header value of {size} bytes does not fit its record")
        value = None if size < 0 else bytes(data[at : at + size])
        at += max(size, 0)
        out.append((key, value))
    if at != end:
        raise ValueError(f"{end - at} bytes follow the headers of a record")
    return out


def parse_batches(
    data: bytes | memoryview, *, max_bytes: int = DEFAULT_MAX_RECORDS_BYTES
) -> list[KafkaBatch]:
    """Every record batch in ``data`` (one partition's ``records``: batches back to back).

    Raises :class:`UnsupportedMessageFormat` for magic 0 or 1, :class:`CorruptBatch` when a
    batch's length does not fit or its CRC-32C does not match, ``UnsupportedCompression`` for a
    codec above 4, and :class:`InvalidRecord` when the records disagree with their count or
    their own lengths, or decompress (or, uncompressed, amount) to more than ``max_bytes``.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    batches: list[KafkaBatch] = []
    at = 0
    while at < len(view):
        batch, at = _parse_one(view, at, max_bytes)
        batches.append(batch)
    return batches


def _parse_one(view: memoryview, at: int, max_bytes: int) -> tuple[KafkaBatch, int]:
    available = len(view) - at
    if available < _PREFIX.size:
        raise CorruptBatch(
            f"{available} bytes at byte {at} are too few for a record batch header "
            f"({HEADER_SIZE} bytes): the records are truncated"
        )
    _, length, _, magic = _PREFIX.unpack_from(view, at)
    if magic != MAGIC:
        raise UnsupportedMessageFormat(
            f"a message set of format {magic} (magic byte {magic}); only record batches of "
            f"format 2 (Kafka 0.11 and later) are accepted: produce with a newer client or "
            f"protocol version"
        )
    end = at + LENGTH_END + length
    if length < HEADER_SIZE - LENGTH_END or end > len(view):
        raise CorruptBatch(
            f"the record batch at byte {at} claims {length} bytes after its length field but "
            f"{available - LENGTH_END} follow (at least {HEADER_SIZE - LENGTH_END} are needed): "
            f"the batch is truncated or its length is wrong"
        )
    (
        base_offset,
        _,
        leader_epoch,
        _,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEADER.unpack_from(view, at)
    actual = crc32c(view[at + CRC_START : end])
    if actual != crc:
        raise CorruptBatch(
            f"the record batch at byte {at} has CRC-32C {actual:#010x} but its header says "
            f"{crc:#010x}: the bytes were damaged (or built wrongly)"
        )
    codec = codec_of(attributes)
    body = view[at + HEADER_SIZE : end]
    if codec is Codec.NONE and len(body) > max_bytes:
        raise InvalidRecord(
            f"the records of a batch take {len(body)} bytes, over the limit of {max_bytes}"
        )
    records = decompress(codec, body, max_bytes)
    columns = _read_records(records, count, base_timestamp)
    batch = KafkaBatch(
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        attributes=attributes,
        codec=codec,
        timestamp_type=LOG_APPEND_TIME if attributes & TIMESTAMP_TYPE else CREATE_TIME,
        is_transactional=bool(attributes & TRANSACTIONAL),
        is_control=bool(attributes & CONTROL),
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        count=count,
        records=records,
        **columns,
    )
    return batch, end


def _invalid(detail: str, index: int | None = None) -> InvalidRecord:
    where = "" if index is None else f"record {index} of a batch: "
    return InvalidRecord(f"{where}{detail}; the batch's records do not add up and were refused")


def _record_bodies(
    records: bytes, padded: bytes, buffer: UInt8Array, count: int
) -> tuple[Int64Array, Int64Array]:
    """Where each record's body (after its length varint) starts and where the record ends.

    Each record's place follows from the one before, so the chain is guessed, then checked at
    once: record i is assumed as long as the first unchecked record, give or take the width of
    its offset delta (producers number records 0, 1, 2, ...). Decoding the length at every
    guessed place and finding it as guessed proves the chain up to the first miss; the guess
    restarts there, a few times, and a batch whose records differ in length is walked record by
    record (the length varint's one- and two-byte forms inline)."""
    size = len(records)
    bodies: list[Int64Array] = []
    ends: list[Int64Array] = []
    done, at = 0, 0
    delta_width = varint.widths(np.arange(count, dtype=np.int64))
    for _ in range(_GUESSES):
        if done == count or at >= size:
            break
        first, _ = varint.decode(
            buffer, np.array([at], dtype=np.int64), varint.INT32_WIDTH, strict=False
        )
        lengths = int(first[0]) + delta_width[done:] - delta_width[done]
        widths = varint.widths(lengths)
        sizes = widths + lengths
        starts = at + np.cumsum(sizes) - sizes
        found, found_width = varint.decode(
            buffer, np.minimum(starts, size), varint.INT32_WIDTH, strict=False
        )
        right = (found == lengths) & (found_width == widths) & (lengths >= MIN_RECORD_SIZE - 1)
        right &= starts + sizes <= size
        proven = int(np.argmin(right)) if not bool(right.all()) else len(right)
        if proven < _GUESS_PAYS:
            break
        bodies.append(starts[:proven] + widths[:proven])
        ends.append(starts[:proven] + sizes[:proven])
        done += proven
        at = int(ends[-1][-1])
    if done < count:
        walked, walked_ends, at = _walk(records, padded, count, done, at)
        bodies.append(walked)
        ends.append(walked_ends)
    if at != size:
        raise _invalid(
            f"the batch says {count} records but they take {at} of its {size} bytes of records"
        )
    if len(bodies) == 1:
        return bodies[0], ends[0]
    return np.concatenate(bodies), np.concatenate(ends)


def _walk(
    records: bytes, padded: bytes, count: int, done: int, at: int
) -> tuple[Int64Array, Int64Array, int]:
    """Records ``done`` to ``count`` from byte ``at``, one length varint after the other."""
    size = len(records)
    bodies = [0] * (count - done)
    ends = [0] * (count - done)
    for i in range(count - done):
        if at >= size:
            raise _invalid(f"the batch says {count} records but its bytes hold {done + i}")
        byte = padded[at]
        if byte < 0x80:
            at += 1
        elif padded[at + 1] < 0x80:
            byte = (byte & 0x7F) | (padded[at + 1] << 7)
            at += 2
        else:
            try:
                length, at = varint.read(records, at, size)
            except ValueError as error:
                raise _invalid(str(error), done + i) from None
            byte = (length << 1) ^ (length >> 63)
        length = (byte >> 1) ^ -(byte & 1)
        if length < MIN_RECORD_SIZE - 1:
            raise _invalid(f"a length of {length} bytes", done + i)
        bodies[i] = at
        at += length
        ends[i] = at
    return np.array(bodies, dtype=np.int64), np.array(ends, dtype=np.int64), at


def _read_records(records: bytes, count: int, base_timestamp: int) -> dict[str, Int64Array]:
    """The columns of ``count`` records laid out back to back in ``records``."""
    if count < 0 or count * MIN_RECORD_SIZE > len(records):
        raise _invalid(f"a record count of {count} cannot fit in {len(records)} bytes of records")
    padded = records + bytes(varint.PAD)  # reads past the records see zeros
    buffer = np.frombuffer(padded, dtype=np.uint8)
    at, ends = _record_bodies(records, padded, buffer, count)
    decode = varint.decode
    try:
        at = at + 1  # the record's attributes (unused in format 2)
        delta, width = decode(buffer, at, varint.INT64_WIDTH)
        at = at + width
        offset_delta, width = decode(buffer, at, varint.INT32_WIDTH)
        at = at + width
        _check_inside(at, ends)
        key_len, width = decode(buffer, at, varint.INT32_WIDTH)
        key_start = at + width
        at = key_start + np.maximum(key_len, 0)
        _check_lengths(key_len, at, ends, "key")
        value_len, width = decode(buffer, at, varint.INT32_WIDTH)
        value_start = at + width
        headers_start = value_start + np.maximum(value_len, 0)
        _check_lengths(value_len, headers_start, ends, "value")
        header_count, width = decode(buffer, headers_start, varint.INT32_WIDTH)
    except varint.VarintError as error:
        raise _invalid("a varint runs past its maximum length", error.index) from None
    at = headers_start + width
    _check_inside(at, ends)
    bad = (header_count < 0) | ((header_count == 0) & (at != ends))
    if bool(bad.any()):
        i = int(np.argmax(bad))
        raise _invalid(
            f"{int(header_count[i])} headers and {int(ends[i] - at[i])} bytes after them", i
        )
    _check_headers(buffer, header_count, at, ends)
    return {
        "timestamp": base_timestamp + delta,
        "offset_delta": offset_delta,
        "key_start": key_start,
        "key_len": key_len,
        "value_start": value_start,
        "value_len": value_len,
        "header_count": header_count,
        "headers_start": headers_start,
        "headers_end": ends,
    }


def _check_inside(at: Int64Array, ends: Int64Array) -> None:
    over = at > ends
    if bool(over.any()):
        raise _invalid("its fields run past its length", int(np.argmax(over)))


def _check_lengths(lengths: Int64Array, at: Int64Array, ends: Int64Array, what: str) -> None:
    bad = (lengths < -1) | (at > ends)
    if bool(bad.any()):
        i = int(np.argmax(bad))
        raise _invalid(f"a {what} length of {int(lengths[i])} does not fit its record", i)


def _check_headers(
    buffer: UInt8Array, counts: Int64Array, at: Int64Array, ends: Int64Array
) -> None:
    """Check every header of every record: keys of length >= 0 and values of length >= -1 that
    stay inside their record, which the last header must end exactly. Column-wise (the j-th
    header of every record that has one, at once) while many records remain, then per record."""
    rows = np.flatnonzero(counts)
    if not len(rows):
        return
    counts = counts[rows]
    at = at[rows]
    ends = ends[rows]
    j = 0
    try:
        while len(rows) >= _SPREAD_ENOUGH:
            key_len, width = varint.decode(buffer, at, varint.INT32_WIDTH)
            at = at + width + np.maximum(key_len, 0)
            _check_header_field(key_len, 0, at, ends, rows)
            value_len, width = varint.decode(buffer, at, varint.INT32_WIDTH)
            at = at + width + np.maximum(value_len, 0)
            _check_header_field(value_len, -1, at, ends, rows)
            j += 1
            done = counts == j
            if bool((at[done] != ends[done]).any()):
                raise _invalid(
                    "bytes follow its headers", int(rows[done][at[done] != ends[done]][0])
                )
            keep = ~done
            rows, counts, at, ends = rows[keep], counts[keep], at[keep], ends[keep]
    except varint.VarintError as error:
        raise _invalid(
            "a header varint runs past its maximum length", int(rows[error.index])
        ) from None
    data = buffer.data
    for row, count, start, end in zip(
        rows.tolist(), counts.tolist(), at.tolist(), ends.tolist(), strict=True
    ):
        try:
            _read_header_run(data, start, end, count - j)
        except ValueError as error:
            raise _invalid(str(error), row) from None


def _check_header_field(
    lengths: Int64Array, least: int, at: Int64Array, ends: Int64Array, rows: Int64Array
) -> None:
    bad = (lengths < least) | (at > ends)
    if bool(bad.any()):
        i = int(np.argmax(bad))
        raise _invalid(f"a header field of length {int(lengths[i])} does not fit", int(rows[i]))


def _read_header_run(data: memoryview, at: int, end: int, count: int) -> None:
    for _ in range(count):
        size, at = varint.read(data, at, end)
        if size < 0 or at + size > end:
            raise ValueError(f"a header key of {size} bytes does not fit")
        size, at = varint.read(data, at + size, end)
        if size < -1 or at + max(size, 0) > end:
            raise ValueError(f"a header value of {size} bytes does not fit")
        at += max(size, 0)
    if at != end:
        raise ValueError(f"{end - at} bytes follow its headers")


# -- building --------------------------------------------------------------------------------------


def build_batch(
    *,
    offsets: Int64Array,
    timestamps: Int64Array,
    values: Columns,
    keys: Columns | None = None,
    headers: SparseHeaders | None = None,
    base_offset: int | None = None,
    timestamp_type: int = CREATE_TIME,
    codec: Codec = Codec.NONE,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
) -> bytes:
    """One record batch holding the records given as columns.

    ``offsets`` are absolute (gaps allowed: each record stores its delta from ``base_offset``,
    by default the first offset); ``timestamps`` are ms, one per record (the batch's base is the
    first, so deltas may be negative). ``keys``/``values`` are (buffer, starts, lengths) with
    length -1 for null; ``keys`` None means every key is null. ``headers`` gives the header lists
    of the records that have any, by place (a list with None for the others, or a mapping).
    ``codec`` compresses the records (a fetch answer is usually uncompressed: NONE). The
    producer fields default to -1, as in a fetch answer.
    """
    n = len(offsets)
    offsets = np.asarray(offsets, dtype=np.int64)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    base = int(offsets[0]) if base_offset is None and n else int(base_offset or 0)
    base_timestamp = int(timestamps[0]) if n else -1
    attributes = int(codec) | (TIMESTAMP_TYPE if timestamp_type == LOG_APPEND_TIME else 0)
    if is_transactional:
        attributes |= TRANSACTIONAL
    tail = _TAIL.pack(
        attributes,
        int(offsets[-1]) - base if n else -1,
        base_timestamp,
        int(timestamps.max()) if n else -1,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    offset_deltas, timestamp_deltas = offsets - base, timestamps - base_timestamp
    if codec is Codec.NONE:  # the records laid out after room for the header: no copy to frame
        out = lay_out_into(offset_deltas, timestamp_deltas, keys, values, headers, n, HEADER_SIZE)
        frame = out.data
        frame[CRC_START:HEADER_SIZE] = tail
        length = len(out) - LENGTH_END
        _PREFIX.pack_into(frame, 0, base, length, partition_leader_epoch, MAGIC)
        _CRC.pack_into(frame, CRC_START - _CRC.size, crc32c(frame[CRC_START:]))
        return out.tobytes()
    records = lay_out(offset_deltas, timestamp_deltas, keys, values, headers, n)
    body = compress(codec, records)
    crc = crc32c(body, crc32c(tail))
    length = HEADER_SIZE - LENGTH_END + len(body)
    return b"".join(
        (_PREFIX.pack(base, length, partition_leader_epoch, MAGIC), _CRC.pack(crc), tail, body)
    )


__all__ = [
    "CREATE_TIME",
    "DEFAULT_MAX_RECORDS_BYTES",
    "LOG_APPEND_TIME",
    "Columns",
    "Header",
    "HeaderList",
    "KafkaBatch",
    "RawHeader",
    "build_batch",
    "encode_headers",
    "parse_batches",
    "read_headers",
]
