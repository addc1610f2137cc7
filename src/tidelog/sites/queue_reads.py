"""The delta queue's reads by offset: the records the tag index lists, from memory or the log.

:class:`DecodedRecords` keeps the records a transmit just stored and those a sender read,
decoded, oldest first, at most ``DECODED_BYTES`` of them: decoding once serves every site's
sender. :func:`records_at` gives the records at the offsets the tag index lists for a site, in
order, from memory where they are, else read from the queue a run of consecutive offsets at a
time, lazily (``SendQueue.read_for`` stops once it has enough).

Invariants: a record kept for an offset is what the queue holds there (a later write or read of
that offset replaces it); nothing past the high watermark is given (the index runs ahead of a
sync under way); and a listed record that is gone when read (retention removed it after the
index was trimmed) is never skipped: ``gone`` is called, and raises.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Final, NoReturn

from tidelog.broker import Partition
from tidelog.sites.envelope import RecordColumns, columns

DECODED_BYTES: Final = 8 << 20
"""Bytes of decoded records (payloads and columns) kept in memory (:class:`DecodedRecords`): the
records a transmit just stored, and those a sender read, so that every site's sender ships them
without reading and decoding them again; at least two senders' reads (``send_queue.READ_BYTES``)
fit."""


class DecodedRecords:
    """Offset -> the record's columns, oldest first, at most ``DECODED_BYTES`` of them."""

    def __init__(self) -> None:
        self._records: OrderedDict[int, RecordColumns] = OrderedDict()
        self._bytes = 0

    def get(self, offset: int) -> RecordColumns | None:
        return self._records.get(offset)

    def __contains__(self, offset: int) -> bool:
        return offset in self._records

    def remember(self, offset: int, record: RecordColumns) -> RecordColumns:
        """Keep ``record`` for the other senders (dropping the oldest beyond the bound). A
        record kept for ``offset`` before is replaced: what was just written or read there is
        what the queue holds."""
        previous = self._records.pop(offset, None)
        if previous is not None:
            self._bytes -= _footprint(previous)
        self._records[offset] = record
        self._bytes += _footprint(record)
        while self._bytes > DECODED_BYTES and len(self._records) > 1:
            _, dropped = self._records.popitem(last=False)
            self._bytes -= _footprint(dropped)
        return record


def records_at(
    partition: Partition,
    offsets: list[int],
    decoded: DecodedRecords,
    gone: Callable[[], NoReturn],
) -> Iterator[tuple[int, RecordColumns]]:
    """The records at ``offsets`` (ascending), decoded, in order: from memory where they are,
    else read from the queue a run at a time (lazily: the caller may stop early). ``gone``
    raises when a record listed is no longer in the queue."""
    log = partition.log
    high_watermark = log.high_watermark
    at = 0
    while at < len(offsets):
        offset = offsets[at]
        if offset > high_watermark:
            return  # not committed yet (the index runs ahead of a sync under way)
        if offset < log.oldest_offset:
            gone()
        record = decoded.get(offset)
        if record is not None:
            yield offset, record
            at += 1
            continue
        end = at + 1  # a run of consecutive offsets: one reader, no record between
        while (
            end < len(offsets)
            and offsets[end] == offsets[end - 1] + 1
            and offsets[end] not in decoded
        ):
            end += 1
        wanted = offsets[at:end]
        last = min(wanted[-1], high_watermark)
        seen = 0
        for batch in log.forward_reader(offset, stop_offset=last):
            for found, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                if seen == len(wanted) or found < wanted[seen]:
                    continue
                if found != wanted[seen]:  # retention took one since the check above
                    gone()
                record = decoded.remember(found, columns(value))
                seen += 1
                yield found, record
        if seen < len(wanted) and wanted[seen] <= last:
            gone()
        at += seen
        if seen < len(wanted):
            return


def _footprint(record: RecordColumns) -> int:
    """Bytes a decoded record holds: its payloads and its columns."""
    return (
        len(record.payloads)
        + record.masks.nbytes
        + record.mask_indexes.nbytes
        + record.sizes.nbytes
    )
