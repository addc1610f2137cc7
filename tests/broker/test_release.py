"""``Partition.release_before``: the owner of a partition deletes the sealed segments it no
longer needs, whole, below an offset; the active segment and anything at or above stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig


def test_a_partition_releases_whole_sealed_segments_below_an_offset(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            stream = broker.internal_stream("__owned", StreamConfig(segment_max_bytes=200))
            partition = stream.partitions[0]
            for _ in range(10):
                await partition.publish([b"x" * 60])
            log = partition.log
            assert log.segment_count > 3
            first_kept = 6
            released = await partition.release_before(first_kept)
            assert released and released[0] == 0
            assert log.oldest_offset <= first_kept  # never past the offset asked for
            values = [int(o) for batch in log.forward_reader(0) for o in batch.offsets]
            assert values == list(range(log.oldest_offset, 10))
            assert await partition.release_before(first_kept) == []
            await partition.release_before(10**9)
            assert log.segment_count == 1 and log.newest_offset == 9  # the active segment stays
            partition.pause()
            assert await partition.release_before(10**9) == []  # paused: nothing to release

    asyncio.run(main())
