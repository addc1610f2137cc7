"""Publishes that wait for their sync share the syncs (``broker.shared_sync``): concurrent
waiters are covered by at most two syncs, none returns before a sync that started after its
record was appended has ended, a failed sync fails its waiters and the next one is tried
afresh, and a cut makes the offsets at and above it wait for a new sync."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.broker.brokertools import broker_config, running

from tidelog.broker.shared_sync import SharedSync


class FakeLog:
    """Appends are offsets; ``flush`` records the newest offset each sync saw, and can be held
    or made to fail."""

    def __init__(self) -> None:
        self.newest = -1
        self.flushed: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def append(self) -> int:
        self.newest += 1
        return self.newest

    def flush(self) -> None:
        seen = self.newest
        self.gate.wait(5)
        if self.fail:
            raise OSError("disk gone")
        self.flushed.append(seen)


def test_concurrent_waiters_share_at_most_two_syncs_and_each_is_covered() -> None:
    async def main() -> None:
        log = FakeLog()
        sync = SharedSync(log.flush, lambda: log.newest)
        log.gate.clear()
        first = asyncio.create_task(sync.through(log.append()))
        await asyncio.sleep(0.05)  # the first sync runs (held), covering offset 0 only
        later = [asyncio.create_task(sync.through(log.append())) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert not first.done() and not any(t.done() for t in later)
        log.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *later), 5)
        assert sync.syncs == 2
        assert log.flushed[-1] >= 5 and sync.synced >= 5
        await sync.through(3)  # covered already: no sync
        assert sync.syncs == 2

    asyncio.run(main())


def test_a_failed_sync_fails_its_waiters_and_the_next_is_tried_afresh() -> None:
    async def main() -> None:
        log = FakeLog()
        sync = SharedSync(log.flush, lambda: log.newest)
        log.fail = True
        waits = [asyncio.create_task(sync.through(log.append())) for _ in range(3)]
        results = await asyncio.gather(*waits, return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results)
        assert sync.synced == -1
        log.fail = False
        await sync.through(2)
        assert sync.synced == 2

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_sync_to_the_others() -> None:
    async def main() -> None:
        log = FakeLog()
        sync = SharedSync(log.flush, lambda: log.newest)
        log.gate.clear()
        one = asyncio.create_task(sync.through(log.append()))
        two = asyncio.create_task(sync.through(log.newest))
        await asyncio.sleep(0.05)
        one.cancel()
        log.gate.set()
        await asyncio.wait_for(two, 5)
        assert sync.synced == 0 and sync.syncs == 1

    asyncio.run(main())


def test_after_a_cut_offsets_at_and_above_it_wait_for_a_new_sync() -> None:
    async def main() -> None:
        log = FakeLog()
        sync = SharedSync(log.flush, lambda: log.newest)
        for _ in range(5):
            log.append()
        await sync.through(4)
        sync.forget_from(2)
        log.newest = 1
        assert sync.synced == 1
        await sync.through(log.append())
        assert sync.syncs == 2 and sync.synced == 2

        # A sync running across a cut counts nothing synced.
        log.gate.clear()
        for _ in range(3):
            log.append()
        running = asyncio.create_task(sync.through(log.newest))
        await asyncio.sleep(0.05)
        sync.forget_from(3)
        log.newest = 2
        log.gate.set()
        await asyncio.sleep(0.05)
        assert sync.synced == 2
        running.cancel()

    asyncio.run(main())


def test_durable_publishes_on_a_partition_share_syncs(tmp_path: Path) -> None:
    """Through the partition: concurrent durable publishes (idempotent or not) are each
    answered once synced, by fewer syncs than publishes."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            partition = broker.create_stream("s").partitions[0]
            syncs = partition._syncs
            published = await asyncio.gather(
                *(partition.publish([b"v%d" % n], durable=True) for n in range(4)),
                *(
                    partition.publish_idempotent([b"i%d" % n], f"p{n}", 0, durable=True)
                    for n in range(4)
                ),
            )
            newest = max(p.offsets[-1] for p in published)
            assert newest == 7 and syncs.synced >= newest
            assert 1 <= syncs.syncs < 8

    asyncio.run(main())
