"""CRC-32C of many records in one call: tidelog's native pass (``tidelog._crc32c``), typed.

What it is. The record format keeps one CRC-32C per record, over the record's bytes [4, size)
(``docs/format.md``). Every read checks every record (``record.verify_records``) and every
append computes every record's (``record.encode_batch``, ``record_layout``), so the checksum of
a batch is taken here in one call into C over the batch's buffer and its records' ranges, with no
Python object per record: about 10 ns for a 132-byte record with the CPU's crc32 instruction
(SSE4.2), where one ``crc32c`` package call per record cost about 170 ns, nearly all of it the
call and the slice.

A read checks its records with ``check_records(data, positions, sizes, offsets, timestamps)``:
every record's CRC and its header's size, offset and timestamp against the index in one pass
over the records (three CRCs in step), giving ``(0, -1)``, ``(OUTSIDE, i)`` or
``(DISAGREES, i)`` for the first bad record; the caller spells out what disagrees.

Invariants. :func:`record_crcs` gives, for every range, exactly what one ``crc32c`` call over it
gives; :func:`stamp_crcs` stores in every record's CRC field the checksum of the bytes the record
holds when it runs (so a stored CRC is always of the bytes written, whatever the caller does to
its own objects afterwards). Per-record detection is untouched: n records, n checksums, each
compared on its own. Ranges outside the buffer raise ``ValueError`` before anything is read
outside it (the C module checks every range as it goes).

Theory of operation. The C module (``src/tidelog/native/crc32c.c``, ``docs/architecture.md``,
"Native code") picks the SSE4.2 instruction at import when the CPU has it, else a portable
slicing-by-8 table pass; ``portable=True`` forces the latter (the tests compare both with the
``crc32c`` package). The ranges are taken as given: one-dimensional contiguous int64 arrays
(numpy's or ``array.array("q")``), checked by the C module, which raises ``TypeError`` for
anything else (no silent copy); the result array is allocated here, so the C code needs no
numpy.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tidelog._crc32c import check_records, crc32c_ranges, hardware, stamp_record_crcs

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12; for the types only
    from tidelog._crc32c import _Data

Int64Array = npt.NDArray[np.int64]
UInt32Array = npt.NDArray[np.uint32]
Int64s: TypeAlias = "Int64Array | array[int]"
"""Positions, sizes or range ends: one-dimensional, contiguous, int64 (``array("q")``)."""

__all__ = ["check_records", "hardware", "record_crcs", "stamp_crcs"]

OUTSIDE: Final = 1
"""``check_records``' first result when an index entry lies outside the buffer read."""
DISAGREES: Final = 2
"""``check_records``' first result when a record's CRC or header disagrees."""


def record_crcs(
    chunk: _Data, starts: Int64s, ends: Int64s, *, portable: bool = False
) -> UInt32Array:
    """CRC-32C of ``chunk[starts[i] : ends[i]]`` for every i. Raises ``ValueError`` for a range
    outside ``chunk`` or arrays of different lengths, ``TypeError`` for arrays not int64."""
    out = np.empty(len(starts), dtype=np.uint32)
    crc32c_ranges(chunk, starts, ends, out, portable=portable)
    return out


stamp_crcs: Final = stamp_record_crcs
"""``stamp_crcs(data, positions, sizes, *, portable=False)``: write into each record's CRC field
(bytes [0, 4) of ``data[positions[i]:][:sizes[i]]``, little-endian) the CRC-32C of its bytes
[4, size), in place. ``data`` must be writable; raises ``ValueError`` for a record outside it or
shorter than its CRC field, ``TypeError`` for arrays not int64. (The C function itself: a
Python wrapper would cost as much as the pass over one small record.)"""
