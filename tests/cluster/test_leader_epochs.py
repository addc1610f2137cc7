"""The leader-epoch cache (``tidelog/cluster/leader_epochs.py``): the scenarios of KIP-101 and
KIP-279 in which truncating to the high watermark loses an acknowledged record or keeps a
divergent one, and the cache's own rules (epochs with no records, retention, a round trip), and
the partition's start listener that retention trims it through."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.broker.brokertools import broker_config, running

from tidelog.broker import StreamConfig
from tidelog.cluster.leader_epochs import (
    UNDEFINED,
    EpochEnd,
    EpochEntry,
    LeaderEpochCache,
    truncation_offset,
)


def cache(*entries: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache([EpochEntry(e, s) for e, s in entries])


def test_a_restarted_follower_keeps_what_the_leader_has_beyond_its_high_watermark() -> None:
    # Leader A (epoch 0) wrote offsets 0 and 1 and acked both; follower B has both, but its
    # high watermark says 1. Truncating to it would drop offset 1, and if A then died and B
    # were elected, an acknowledged record would be gone.
    leader, follower = cache((0, 0)), cache((0, 0))
    answer = leader.end_offset_for(follower.latest_epoch, log_end=2)
    assert truncation_offset(follower, 2, answer) == 2


def test_a_follower_drops_the_tail_the_new_leader_never_had() -> None:
    # A (epoch 0) wrote offsets 0 and 1; B had only offset 0. Both restart, B is elected
    # (epoch 1) and writes its own offset 1. A rejoins as a follower: its offset 1 diverges.
    new_leader, old_leader = cache((0, 0), (1, 1)), cache((0, 0))
    answer = new_leader.end_offset_for(old_leader.latest_epoch, log_end=2)
    assert answer == EpochEnd(0, 1)
    assert truncation_offset(old_leader, 2, answer) == 1


def test_a_deposed_leader_of_an_epoch_the_new_leader_never_saw() -> None:
    # The follower led epoch 2 from offset 8; the new leader (epoch 3, from offset 7) never had
    # epoch 2. The answer names epoch 1 ending at 7; the follower cuts there.
    follower = cache((0, 0), (1, 5), (2, 8))
    leader = cache((0, 0), (1, 5), (3, 7))
    answer = leader.end_offset_for(follower.latest_epoch, log_end=9)
    assert answer == EpochEnd(1, 7)
    assert truncation_offset(follower, 10, answer) == 7


def test_a_leader_that_knows_no_epoch_so_old_leaves_the_choice_to_the_caller() -> None:
    assert truncation_offset(cache((4, 0)), 3, cache((6, 0)).end_offset_for(4, 9)) is None
    assert cache().end_offset_for(0, 5) == EpochEnd(UNDEFINED, UNDEFINED)


def test_an_epoch_without_records_ends_where_the_next_one_starts() -> None:
    epochs = cache((0, 0), (1, 10), (2, 10), (3, 25))
    assert epochs.entries == [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(3, 25)]
    assert epochs.end_offset_for(1, 40) == EpochEnd(0, 10)
    assert epochs.end_offset_for(2, 40) == EpochEnd(2, 25)
    assert epochs.end_offset_for(3, 40) == EpochEnd(3, 40)
    assert epochs.end_offset_for(9, 40) == EpochEnd(3, 40)


def test_assign_drops_what_a_new_history_contradicts_and_keeps_a_known_epoch() -> None:
    epochs = cache((0, 0), (1, 10), (2, 20))
    epochs.assign(2, 25)  # the same epoch seen again later: its start does not move
    assert epochs.entries[-1] == EpochEntry(2, 20)
    epochs.assign(3, 15)  # a leader whose log diverged at 15
    assert epochs.entries == [EpochEntry(0, 0), EpochEntry(1, 10), EpochEntry(3, 15)]
    with pytest.raises(ValueError, match=">= 0"):
        epochs.assign(-1, 0)


def test_truncation_at_either_end() -> None:
    epochs = cache((0, 0), (1, 10), (2, 20))
    epochs.truncate_from_end(20)
    assert epochs.entries == [EpochEntry(0, 0), EpochEntry(1, 10)]
    epochs.truncate_from_start(12)
    assert epochs.entries == [EpochEntry(1, 12)]
    epochs.truncate_from_start(5)  # nothing older to cut
    assert epochs.entries == [EpochEntry(1, 12)]


def test_a_saved_cache_loads_equal_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    epochs = cache((0, 0), (3, 7))
    written: dict[Path, Any] = {}
    epochs.save(tmp_path / "e.json", lambda path, data: written.__setitem__(path, data))
    (tmp_path / "e.json").write_text(json.dumps(written[tmp_path / "e.json"]))
    assert LeaderEpochCache.load(tmp_path / "e.json").entries == epochs.entries
    assert LeaderEpochCache.load(tmp_path / "absent.json").entries == []
    with pytest.raises(ValueError, match="not increasing"):
        LeaderEpochCache.from_json({"version": 1, "entries": [[3, 7], [1, 9]]})


@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 100)), max_size=30),
    st.integers(0, 25),
)
def test_entries_always_increase_and_answers_stay_in_the_log(
    assigned: list[tuple[int, int]], asked: int
) -> None:
    epochs = LeaderEpochCache()
    for epoch, start in assigned:
        epochs.assign(epoch, start)
        entries = epochs.entries
        assert all(a.epoch < b.epoch for a, b in itertools.pairwise(entries))
        assert all(a.start_offset < b.start_offset for a, b in itertools.pairwise(entries))
    log_end = max((e.start_offset for e in epochs.entries), default=0) + 5
    answer = epochs.end_offset_for(asked, log_end)
    if answer.epoch != UNDEFINED:
        assert answer.epoch <= asked
        assert 0 <= answer.end_offset <= log_end


def test_retention_trims_the_cache_through_the_partitions_start_listener(tmp_path: Path) -> None:
    """The hook a replica subscribes its cache to: each time retention moves the log's oldest
    offset, the epochs wholly before it go and the one covering it starts there (Kafka's
    ``truncateFromStart``), on the event loop the cache lives on."""

    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(segment_max_bytes=4096, retention_messages=50))
            partition = broker.partition("s", 0)
            epochs = cache((0, 0), (1, 40), (2, 160), (3, 190))
            partition.add_start_listener(epochs.truncate_from_start)
            for _ in range(20):
                await broker.publish("s", 0, [b"y" * 100] * 10)
            await broker.maintain()  # retention runs in a thread
            await asyncio.sleep(0.05)
            oldest = partition.log.oldest_offset
            assert 40 < oldest < 160
            assert epochs.entries == [EpochEntry(1, oldest), EpochEntry(2, 160), EpochEntry(3, 190)]

    asyncio.run(body())


def test_truncation_reports_whether_the_cache_changed() -> None:
    epochs = cache((0, 0), (1, 10))
    assert not epochs.truncate_from_start(0)
    assert epochs.truncate_from_start(4)
    assert not epochs.truncate_from_start(4)
    assert not epochs.truncate_from_end(11)
    assert epochs.truncate_from_end(10)
    assert epochs.entries == [EpochEntry(0, 4)]
