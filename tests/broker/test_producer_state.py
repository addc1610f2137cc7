"""The producer table follows its partition's log, as Kafka's producer state follows its log:
a follower's copies fill it, a follower's cut takes back what it removed, retention trims it,
and none of that (nor a leadership gain after it) reads the log. The oracle everywhere is a
rebuild from the log's own ``__producer`` headers, computed here independently of the table.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker import producers as producers_module
from tidelog.broker.partition import Partition
from tidelog.broker.producers import (
    SNAPSHOT_FILE,
    ProducerTable,
    StoredBatch,
    producer_batches,
    with_producer_header,
)
from tidelog.log import CommitLog, FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.record import Int64Array, encode_batch

CONFIG = LogConfig(flush_policy=FlushPolicy.NEVER, retention_age_s=None)


def copied(
    first: int, values: Sequence[bytes], producer: tuple[str, int] | None = None
) -> tuple[bytes, Int64Array]:
    """Records as a leader stores them from offset ``first`` (and sends them to a follower):
    one producer's atomic batch when ``producer`` (id, sequence) is given, else plain ones."""
    items: list[bytes | NewRecord] = list(values)
    if producer is not None:
        items = with_producer_header(items, *producer)
    offsets = np.arange(first, first + len(items), dtype=np.int64)
    batch = encode_batch(items, offsets, time.time_ns(), 1 << 20, atomic=producer is not None)
    return batch.data.tobytes(), batch.sizes


def rebuilt(log: CommitLog) -> dict[str, StoredBatch]:
    """What the log's records say: each producer's latest batch."""
    return {
        producer_id: stored
        for batch in log.forward_reader(0, past_limit=True)
        for producer_id, stored in producer_batches(batch)
    }


def entries(partition: Partition) -> dict[str, StoredBatch]:
    assert partition.producers is not None
    return partition.producers.entries


def scanned(*_: object) -> NoReturn:
    raise AssertionError("the producer table read the log")


@contextmanager
def no_scan() -> Iterator[None]:
    with mock.patch.object(ProducerTable, "_replay", scanned):
        yield


def open_partition(directory: Path, config: LogConfig = CONFIG) -> Partition:
    return Partition("s", 0, directory, config, asyncio.get_running_loop())


def test_a_followers_copies_and_cut_keep_the_table_the_logs_and_a_new_leader_reads_nothing(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        partition = open_partition(tmp_path)
        log = partition.log
        log.set_commit_limit(-1)  # a follower not yet told a high watermark
        with no_scan():
            partition.append_stored(*copied(0, [b"a", b"b"], ("p", 1)))
            partition.append_stored(*copied(2, [b"plain"]))
            partition.append_stored(*copied(3, [b"c"], ("q", 4)))
            log.set_commit_limit(3)  # the leader's high watermark reached offset 3
            partition.append_stored(*copied(4, [b"d", b"e"], ("p", 2)))
            partition.append_stored(*copied(6, [b"f"], ("r", 0)))
            expected = {
                "p": StoredBatch(2, 4, 2),
                "q": StoredBatch(4, 3, 1),
                "r": StoredBatch(0, 6, 1),
            }
            assert entries(partition) == rebuilt(log) == expected
            # A new leader never had offset 5 on: the cut tears p's batch 2 and removes r's.
            partition.truncate_to(5)
            expected = {"p": StoredBatch(1, 0, 2), "q": StoredBatch(4, 3, 1)}
            assert entries(partition) == rebuilt(log) == expected
            # This replica is elected: nothing to rebuild, and the table answers retries.
            log.set_commit_limit(None)
            retried = await partition.publish_idempotent([b"a", b"b"], "p", 1)
            assert (retried.duplicate, retried.offsets) == (True, range(0, 2))
            assert (await partition.publish_idempotent([b"c"], "q", 4)).duplicate
            cut = await partition.publish_idempotent([b"d", b"e"], "p", 2)
            assert (cut.duplicate, cut.offsets) == (False, range(5, 7))
            assert not (await partition.publish_idempotent([b"f"], "r", 0)).duplicate
            assert entries(partition) == rebuilt(log)
        partition.close()

    asyncio.run(body())


def test_the_snapshot_written_at_a_cut_describes_the_cut_log(tmp_path: Path) -> None:
    """A snapshot covering cut records would pass for the records appended in their place
    after a restart: the cut rewrites it before anything else is appended."""

    async def body() -> None:
        partition = open_partition(tmp_path)
        partition.log.set_commit_limit(-1)
        partition.append_stored(*copied(0, [b"a"], ("p", 1)))
        partition.append_stored(*copied(1, [b"b"], ("p", 2)))
        partition.save_producers()
        partition.truncate_to(1)
        snapshot = json.loads((tmp_path / SNAPSHOT_FILE).read_text())
        assert (snapshot["covered"], snapshot["producers"]) == (0, [["p", 1, 0, 1]])
        partition.append_stored(*copied(1, [b"other"]))  # the new leader's offset 1
        partition.close()
        reopened = open_partition(tmp_path)
        assert entries(reopened) == rebuilt(reopened.log) == {"p": StoredBatch(1, 0, 1)}
        reopened.close()

    asyncio.run(body())


def test_a_cut_below_the_journal_restores_from_the_snapshot_and_a_short_tail(
    tmp_path: Path,
) -> None:
    """A single broker's table settles at once (its high watermark is its log end); only a
    damaged log is cut below it, and then the table reads the records after its snapshot, not
    the whole log."""

    async def body() -> None:
        partition = open_partition(tmp_path)
        for n in range(10):
            partition.append_stored(*copied(n, [b"v"], (f"p{n % 3}", n)))
        partition.save_producers()  # covers offsets 0-9
        for n in range(10, 15):
            partition.append_stored(*copied(n, [b"v"], (f"p{n % 3}", n)))
        table = partition.producers
        assert table is not None and table.undo_length == 0 and table.floor == 15
        partition.truncate_to(12)
        assert entries(partition) == rebuilt(partition.log)
        restored = partition.producers
        assert restored is not table and restored is not None
        assert restored.replayed == 2  # offsets 10 and 11, after the snapshot
        partition.close()

    asyncio.run(body())


def test_retention_trims_the_table_and_a_cut_never_brings_a_trimmed_producer_back(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        partition = open_partition(tmp_path)
        log = partition.log
        heard: list[tuple[int, bool]] = []
        loop_thread = threading.get_ident()
        partition.add_start_listener(
            lambda oldest: heard.append((oldest, threading.get_ident() == loop_thread))
        )
        log.set_commit_limit(-1)  # a follower not yet told a high watermark
        with no_scan():
            partition.append_stored(*copied(0, [b"a"], ("p", 1)))
            partition.append_stored(*copied(1, [b"b"], ("gone", 1)))
            log.roll()
            partition.append_stored(*copied(2, [b"plain"]))
            partition.append_stored(*copied(3, [b"c"], ("p", 2)))
            log.set_commit_limit(2)  # offsets 0-2 committed, 3 not
            assert await partition.release_before(2) == [0]  # in a thread, as retention runs
            await asyncio.sleep(0.05)
            assert heard == [(2, True)]  # on the event loop, with the new oldest offset
            assert entries(partition) == rebuilt(log) == {"p": StoredBatch(2, 3, 1)}
            partition.truncate_to(3)  # p's batch 1 went with retention: not brought back
            assert entries(partition) == rebuilt(log) == {}
            fresh = await partition.publish_idempotent([b"a"], "p", 1)
            assert (fresh.duplicate, fresh.offsets) == (False, range(3, 4))
        partition.close()

    asyncio.run(body())


def test_a_restart_cuts_a_lost_tail_with_the_saved_journal(tmp_path: Path) -> None:
    """A replica's snapshot keeps what a cut may still take back: when recovery cut the log's
    tail (a crash), the table is cut with it at the open, reading nothing."""

    async def body() -> None:
        partition = open_partition(tmp_path)
        partition.log.set_commit_limit(0)
        partition.append_stored(*copied(0, [b"a"], ("p", 1)))
        partition.append_stored(*copied(1, [b"b", b"c"], ("q", 1)))
        partition.append_stored(*copied(3, [b"d"], ("p", 2)))
        partition.close()
        with SegmentedLog(tmp_path, CONFIG, lock_directory=False) as log:
            log.truncate_to(2)  # as recovery cuts a torn tail
        reopened = open_partition(tmp_path)
        table = reopened.producers
        assert table is not None and table.replayed == 0
        assert entries(reopened) == rebuilt(reopened.log) == {"p": StoredBatch(1, 0, 1)}
        reopened.close()

    asyncio.run(body())


def test_the_undo_journal_is_bounded_and_settles_at_the_high_watermark() -> None:
    table = ProducerTable()
    with mock.patch.object(producers_module, "MAX_UNDO", 3):
        for n in range(5):
            table.apply("p", StoredBatch(n, n, 1))
    assert (table.undo_length, table.floor) == (3, 2)
    assert not table.truncate(1)  # below the floor: the caller restores from the log
    assert table.truncate(3)
    assert table.entries == {"p": StoredBatch(2, 2, 1)}
    table.settle(2)
    assert (table.undo_length, table.floor) == (0, 3)
    table.apply("q", StoredBatch(3, 5, 2))
    table.apply("q", StoredBatch(0, 7, 1))  # a producer that started again after retention
    assert table.undo_length == 2 and table.entries["q"] == StoredBatch(0, 7, 1)
    assert table.truncate(7) and table.entries["q"] == StoredBatch(3, 5, 2)


# -- the table against the log it follows, whatever happens to it ---------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 2), st.integers(0, 6), st.integers(1, 3)),
        st.tuples(st.just("copy"), st.integers(-1, 2), st.integers(0, 6), st.integers(1, 3)),
        st.tuples(st.just("limit"), st.floats(0, 1)),
        st.tuples(st.just("cut"), st.floats(0, 1)),
        st.tuples(st.just("release"), st.floats(0, 1)),
        st.tuples(st.just("roll")),
        st.tuples(st.just("save")),
        st.tuples(st.just("restart")),
    ),
    max_size=30,
)


def _between(low: int, high: int, fraction: float) -> int:
    return low + round((high - low) * fraction)


async def _run(directory: Path, ops: list[tuple[object, ...]]) -> None:
    partition = open_partition(directory)
    for op in ops:
        log = partition.log
        kind = op[0]
        if kind == "publish":
            _, who, sequence, count = op
            await partition.publish_idempotent([b"x"] * int(count), f"p{who}", int(sequence))
        elif kind == "copy":
            _, who, sequence, count = op
            producer = None if who == -1 else (f"p{who}", int(sequence))
            partition.append_stored(*copied(log.next_offset, [b"y"] * int(count), producer))
        elif kind == "limit":
            log.set_commit_limit(_between(log.oldest_offset - 1, log.newest_offset, op[1]))
        elif kind == "cut":
            partition.truncate_to(_between(log.oldest_offset, log.next_offset, op[1]))
        elif kind == "release":
            log.release_before(_between(log.oldest_offset, log.next_offset, op[1]))
        elif kind == "roll":
            log.roll()
        elif kind == "save":
            partition.save_producers()
        else:
            partition.close()
            partition = open_partition(directory)
        assert entries(partition) == rebuilt(partition.log), op
    partition.close()


@settings(max_examples=60, deadline=None)
@given(OPS, st.sampled_from([2, 10_000]))
def test_the_table_is_always_what_a_rebuild_from_the_log_gives(
    ops: list[tuple[object, ...]], max_undo: int
) -> None:
    with (
        tempfile.TemporaryDirectory() as directory,
        mock.patch.object(producers_module, "MAX_UNDO", max_undo),
    ):
        asyncio.run(_run(Path(directory), ops))


@pytest.mark.parametrize("cut_at", [3, 5, 6])
def test_a_cut_above_the_high_watermark_never_reads_the_log(tmp_path: Path, cut_at: int) -> None:
    async def body() -> None:
        partition = open_partition(tmp_path)
        partition.log.set_commit_limit(2)
        with no_scan():
            for n in range(7):
                partition.append_stored(*copied(n, [b"v"], (f"p{n % 2}", n)))
            partition.truncate_to(cut_at)
            assert entries(partition) == rebuilt(partition.log)
        partition.close()

    asyncio.run(body())


def test_a_producer_that_started_again_after_retention_is_known_by_its_latest_batch(
    tmp_path: Path,
) -> None:
    """The leader forgot ``p`` (retention removed its batches there) and took its sequence 0
    again; a follower whose retention has not yet removed the old batch knows ``p`` as the
    leader does, so a retry after a failover is a duplicate, not a second copy."""

    async def body() -> None:
        partition = open_partition(tmp_path)
        partition.append_stored(*copied(0, [b"old"], ("p", 5)))
        partition.append_stored(*copied(1, [b"new"], ("p", 0)))
        assert entries(partition) == rebuilt(partition.log) == {"p": StoredBatch(0, 1, 1)}
        retried = await partition.publish_idempotent([b"new"], "p", 0)
        assert (retried.duplicate, retried.offsets) == (True, range(1, 2))
        partition.close()

    asyncio.run(body())
