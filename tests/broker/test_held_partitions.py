"""A broker of a cluster (``BrokerConfig.clustered``) opens every partition's log with readers
held at the high watermark the replica last saved (``replication-hw``): what it holds above that
may be a tail no leader committed (cut when it follows its leader), and nothing may read it
before the cluster has given the partition its role — not a subscriber, not a view, not browse,
not compaction. Before, the logs opened with everything visible, views indexed the tail at
start, and kept it after the cut."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker import HW_CHECKPOINT, NewRecord, ViewKind, ViewSpec


def test_a_clustered_brokers_partition_opens_held_at_its_saved_high_watermark(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            for n in range(10):
                await broker.publish("s", 0, [NewRecord(b"v%d" % n, key=b"k%d" % n)])
        (tmp_path / "streams" / "s" / "0" / HW_CHECKPOINT).write_text("2")
        async with running(broker_config(tmp_path, clustered=True)) as broker:
            partition = broker.find_stream("s").partitions[0]  # type: ignore[union-attr]
            assert partition.log.committed_offset == 9, "the records are all there"
            assert partition.high_watermark == 2, "readers see what was committed"
            await broker.declare_view("s", ViewSpec("latest", ViewKind.TABLE))
            await asyncio.sleep(0.3)  # a view indexes what readers see, no more
            ((_, applied, _),) = await broker.views("s").status()
            assert applied == [3], "the view applied 0..2 and waits"
        async with running(broker_config(tmp_path)) as broker:  # a single broker: no hold
            assert broker.find_stream("s").partitions[0].high_watermark == 9  # type: ignore[union-attr]

    asyncio.run(main())
