"""A segment's index entries are the same whichever way an append builds them: entry by entry
for a handful of records, with numpy for more (``Segment._entries_of``)."""

from __future__ import annotations

import numpy as np
import pytest

from tidelog.log.filecache import FileCache
from tidelog.log.index import read_index_file
from tidelog.log.record import encode_batch
from tidelog.log.segment import Segment, index_path

CACHE = FileCache(4)


@pytest.mark.parametrize("count", [1, 2, 15, 16, 17, 40])
def test_entries_of_any_batch_size(tmp_path, count: int) -> None:
    segment = Segment.create(tmp_path, 1000, preallocate_bytes=4096, cache=CACHE)
    expected: list[tuple[int, int, int, int]] = []
    position, offset = 0, 1000
    try:
        for k, timestamp in enumerate((7, 7, 9)):
            offsets = np.arange(offset, offset + count, dtype=np.int64) + k  # gaps between
            values = [b"v" * ((i * 7 + k) % 50) for i in range(count)]
            encoded = encode_batch(values, offsets, timestamp, 1 << 20)
            segment.append(encoded)
            for o, size in zip(offsets.tolist(), encoded.sizes.tolist(), strict=True):
                expected.append((o - 1000, timestamp, position, size))
                position += size
            offset = int(offsets[-1]) + 1
        entries = segment.entries(0, segment.count)
        got = list(
            zip(
                entries["rel"].tolist(),
                entries["timestamp"].tolist(),
                entries["position"].tolist(),
                entries["size"].tolist(),
                strict=True,
            )
        )
        assert got == expected
        assert segment.size == position
        assert segment.oldest_offset == 1000 and segment.newest_offset == offset - 1
        assert (segment.oldest_timestamp, segment.newest_timestamp) == (7, 9)
        segment.seal()
        on_disk = read_index_file(index_path(tmp_path, 1000))
        assert on_disk.tobytes() == entries.tobytes()
    finally:
        segment.close()
