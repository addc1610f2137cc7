"""What a browse keeps: a filter given as data (never code), evaluated over whole batches.

A :class:`BrowseFilter` is a conjunction of plain comparisons — key equals, key prefix, header
``name=value`` (each one given), value contains, a time range — so no caller-supplied expression is
ever evaluated. :meth:`BrowseFilter.mask` answers for a whole verified batch at once with numpy over
the record headers and the raw segment bytes: a key test gathers the key bytes of the candidates
into one array and compares columns; a value test searches the batch's bytes with ``bytes.find``
and maps each hit to the record it lies in. Only the header test decodes anything, and only for
records that passed the others and carry headers.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tidelog.errors import InvalidArgument
from tidelog.log import MessageBatch

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class BrowseFilter:
    """Every condition given must hold (None / empty: no condition). Times are broker timestamps
    in ns since the Unix epoch, both bounds inclusive."""

    key: bytes | None = None
    key_prefix: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    """Each (name, value) must be among the record's headers."""
    contains: bytes | None = None
    """The value holds these bytes somewhere (a UTF-8 text is its encoding)."""
    since_ns: int | None = None
    until_ns: int | None = None

    def __post_init__(self) -> None:
        since, until = self.since_ns, self.until_ns
        if since is not None and until is not None and since > until:
            raise InvalidArgument(
                f"since ({since} ns) is after until ({until} ns): swap them or drop one"
            )
        for name, _ in self.headers:
            if not name:
                raise InvalidArgument("a header filter needs a name (name=value)")

    @property
    def selects_all(self) -> bool:
        """Whether every record passes (a plain newest-first or oldest-first page)."""
        return (
            self.key is None
            and self.key_prefix is None
            and not self.headers
            and self.contains is None
            and self.since_ns is None
            and self.until_ns is None
        )

    def mask(self, batch: MessageBatch) -> BoolArray | None:
        """Which records of ``batch`` pass, in delivery order; None when all of them do."""
        if self.selects_all or not batch:
            return None
        keep = np.ones(len(batch), dtype=np.bool_)
        if self.since_ns is not None:
            keep &= batch.timestamps >= self.since_ns
        if self.until_ns is not None:
            keep &= batch.timestamps <= self.until_ns
        if self.key is not None or self.key_prefix is not None:
            raw = np.frombuffer(batch.data, dtype=np.uint8)
            starts, lengths = batch.key_spans()
            if self.key is not None:
                keep &= _starts_with(raw, starts, lengths, self.key, keep, exact=True)
            if self.key_prefix is not None:
                keep &= _starts_with(raw, starts, lengths, self.key_prefix, keep, exact=False)
        if self.contains is not None and keep.any():
            keep &= _values_containing(batch, self.contains)
        if self.headers and keep.any():
            keep &= _with_headers(batch, self.headers, keep)
        return keep


def _starts_with(
    raw: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    wanted: bytes,
    alive: BoolArray,
    *,
    exact: bool,
) -> BoolArray:
    """Records whose key is ``wanted`` (``exact``) or begins with it; only ``alive`` ones are
    looked at."""
    size = len(wanted)
    fits = (lengths == size) if exact else (lengths >= size)
    fits &= alive
    if size == 0 or not fits.any():
        return fits
    candidates = np.flatnonzero(fits)
    columns = starts[candidates][:, None] + np.arange(size, dtype=np.int64)
    same = (raw[columns] == np.frombuffer(wanted, dtype=np.uint8)).all(axis=1)
    out = np.zeros(len(lengths), dtype=np.bool_)
    out[candidates[same]] = True
    return out


def _values_containing(batch: MessageBatch, needle: bytes) -> BoolArray:
    """Records whose value holds ``needle``: one ``bytes.find`` pass over the batch's bytes, each
    hit mapped to the value it lies in (a hit in a key or header, or across two records, is
    skipped)."""
    count = len(batch)
    if not needle:
        return np.ones(count, dtype=np.bool_)
    starts, sizes = batch.value_spans()
    order = np.argsort(starts, kind="stable")
    sorted_starts = starts[order].tolist()
    sorted_ends = (starts + sizes)[order].tolist()
    found = np.zeros(count, dtype=np.bool_)
    data, width = batch.data, len(needle)
    first, last = (sorted_starts[0], sorted_ends[-1]) if count else (0, 0)
    at = data.find(needle, first, last)
    while at != -1:
        i = bisect.bisect_right(sorted_starts, at) - 1
        if i >= 0 and at + width <= sorted_ends[i]:
            found[order[i]] = True
            if i + 1 >= count:
                break
            at = data.find(needle, sorted_starts[i + 1], last)
        else:
            at = data.find(needle, at + 1, last)
    return found


def _with_headers(
    batch: MessageBatch, wanted: tuple[tuple[str, bytes], ...], alive: BoolArray
) -> BoolArray:
    candidates = np.flatnonzero(alive & (batch.header_counts() > 0))
    out = np.zeros(len(batch), dtype=np.bool_)
    if not len(candidates):
        return out
    headers: list[Mapping[str, bytes]] = batch.take(candidates).headers()
    for index, found in zip(candidates.tolist(), headers, strict=True):
        if all(found.get(name) == value for name, value in wanted):
            out[index] = True
    return out
