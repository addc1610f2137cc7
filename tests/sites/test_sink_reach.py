"""How far a delta batch may reach past what a sink applied (``windows.py``, "How far a batch may
reach"): the window's rule as a table, and the sink refusing a forged jump whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running
from tests.sites.test_sink import batch, received

from tidelog.errors import PositionJump
from tidelog.sites.negotiation import NONE
from tidelog.sites.routed import RoutedColumns, RoutedEntry
from tidelog.sites.sender_deltas import next_frame
from tidelog.sites.sink import Sink
from tidelog.sites.windows import RECORD_POSITIONS, WINDOW_RECORDS, ApplyWindow, Framed

JUMP = 100


@pytest.mark.parametrize(
    ("last_applied", "prev", "current", "too_far"),
    [
        (50, 50, 150, False),  # exactly the window
        (50, 50, 151, True),  # one past it
        (50, 10, 151, True),  # an overlap reaches from what was applied, not from its prev
        (50, 120, 220, False),  # an early batch: its own span (its gap must close first)
        (50, 120, 221, True),
        (NONE, 1000, 1100, False),  # nothing applied: the sender's starting point
        (NONE, 1000, 1101, True),
        (50, 50, 10**12, True),  # the forged entry far ahead
    ],
)
def test_a_batch_reaches_at_most_the_window_past_what_was_applied(
    last_applied: int, prev: int, current: int, too_far: bool
) -> None:
    window: ApplyWindow[None] = ApplyWindow(last_applied, max_jump=JUMP)
    assert window.too_far(Framed(prev, current, None)) is too_far


def test_the_default_window_refuses_a_position_of_ten_to_the_twelve_from_the_start() -> None:
    window: ApplyWindow[None] = ApplyWindow(0)
    assert WINDOW_RECORDS * RECORD_POSITIONS < 10**12
    assert window.too_far(Framed(0, 10**12, None))
    assert not window.too_far(Framed(0, 1000 * RECORD_POSITIONS, None))


def test_a_forged_jump_is_refused_whole_and_later_batches_apply(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b", max_jump=JUMP)
            assert await sink.receive("a", batch(NONE, (3, "orders", b"o3"))) == 3
            forged = batch(3, (40, "orders", b"f40"), (10**12, "orders", b"forged"))
            with pytest.raises(PositionJump, match="nothing applied"):
                await sink.receive("a", forged)
            assert sink.last_processed("a") == 3
            assert await sink.receive("a", batch(3, (7, "orders", b"o7"))) == 7
            assert received(broker, "orders", "a") == [(3, b"o3"), (7, b"o7")]

    asyncio.run(main())


def columns(*positions: int) -> RoutedColumns:
    return RoutedColumns.from_entries([RoutedEntry(p, "orders", b"x") for p in positions])


@pytest.mark.parametrize(
    ("cursor", "positions", "expected"),
    [
        (0, (5, 9), (0, 9, [5, 9])),  # all within the step
        (0, (5, 100, 101), (0, 100, [5, 100])),  # cut at the step
        (0, (101, 102), (0, 100, [])),  # the first lies further: a step without entries
        (100, (101, 102), (100, 102, [101, 102])),
        (NONE, (99,), (NONE, 99, [99])),
    ],
)
def test_a_sender_batch_reaches_at_most_its_step(
    cursor: int, positions: tuple[int, ...], expected: tuple[int, int, list[int]]
) -> None:
    framed = next_frame(cursor, columns(*positions), 100)
    assert (framed.prev, framed.current, list(framed.entries.positions)) == expected


def test_a_rarely_receiving_site_never_trips_the_window_of_its_sink() -> None:
    """Positions grow with every record the source stores for other sites: a site's entries
    lie far apart, and its sender steps over the gaps instead of jumping (R2)."""
    window: ApplyWindow[RoutedColumns] = ApplyWindow(NONE, max_jump=JUMP)
    pending = [3, 1000, 1005, 7000]
    cursor, applied = NONE, []
    for _ in range(1000):  # bounded: about 140 steps reach the last entry
        if not pending:
            break
        framed = next_frame(cursor, columns(*pending), JUMP // 2)
        assert not window.too_far(framed), framed
        for ready in window.offer(framed):
            applied += [int(p) for p in ready.batch.entries.positions]
        pending = [p for p in pending if p > framed.current]
        cursor = framed.current
    assert applied == [3, 1000, 1005, 7000]


def test_a_sink_takes_a_step_without_entries_and_the_entries_after_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            sink = Sink(broker, "b", max_jump=JUMP)
            assert await sink.receive("a", batch(NONE, (3, "orders", b"o3"))) == 3
            assert await sink.receive("a", Framed(3, 3 + JUMP, ())) == 3 + JUMP
            assert await sink.receive("a", batch(3 + JUMP, (150, "orders", b"o150"))) == 150
            assert received(broker, "orders", "a") == [(3, b"o3"), (150, b"o150")]

    asyncio.run(main())
