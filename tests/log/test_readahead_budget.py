"""The read-ahead budget: forward readers hold at most the budget ahead, however many there are,
and give it back when a span is handed out, a read finds nothing, or a reader is dropped."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.subscription import READAHEAD_BYTES
from tidelog.log import LogConfig, SegmentedLog
from tidelog.log import readahead as readahead_module
from tidelog.log.readahead import ReadAheadBudget

SPAN = 64 * 1024
PIECE = 8 * 1024


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> ReadAheadBudget:
    small = ReadAheadBudget(2 * SPAN)  # room for two readers' spans
    monkeypatch.setattr("tidelog.log.reader.READAHEAD", small)
    return small


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SegmentedLog]:
    opened = SegmentedLog(tmp_path / "log", LogConfig())
    opened.append([b"v" * 100] * 3000)
    try:
        yield opened
    finally:
        opened.close()


def test_readers_beyond_the_budget_read_piece_by_piece(
    budget: ReadAheadBudget, log: SegmentedLog
) -> None:
    readers = [log.forward_reader(0, readahead_bytes=SPAN) for _ in range(4)]
    pieces = [reader.read(max_bytes=PIECE) for reader in readers]
    assert budget.leased == 2 * SPAN  # two hold a span ahead; the other two read a piece
    for piece in pieces:
        assert piece.offsets[0] == 0 and piece.byte_size <= PIECE
    # Every reader hands out the same records whichever way it read them.
    seen = [[int(o) for o in piece.offsets] for piece in pieces]
    assert all(s == seen[0] for s in seen)


def test_a_span_handed_out_gives_its_lease_back(budget: ReadAheadBudget, log: SegmentedLog) -> None:
    reader = log.forward_reader(0, readahead_bytes=SPAN)
    offsets: list[int] = []
    while len(offsets) < 3000:
        batch = reader.read(max_bytes=PIECE)
        offsets += [int(o) for o in batch.offsets]
        assert budget.leased in (0, SPAN)
    assert offsets == list(range(3000))
    assert not reader.read(max_bytes=PIECE)  # caught up: the empty read ahead holds nothing
    assert budget.leased == 0


def test_a_dropped_reader_gives_its_lease_back(budget: ReadAheadBudget, log: SegmentedLog) -> None:
    reader = log.forward_reader(0, readahead_bytes=SPAN)
    reader.read(max_bytes=PIECE)
    assert budget.leased == SPAN
    del reader
    gc.collect()
    assert budget.leased == 0


def test_the_process_budget_takes_a_catching_up_subscription_s_span_and_no_more() -> None:
    budget = readahead_module.READAHEAD
    held = []
    while (lease := budget.lease(READAHEAD_BYTES)) is not None:
        held.append(lease)
    try:  # a 1 MiB span at least once, and the budget's worth at most
        assert 1 <= len(held) <= readahead_module.BUDGET_BYTES // READAHEAD_BYTES
        assert budget.leased <= budget.budget_bytes
    finally:
        for lease in held:
            lease.release()
