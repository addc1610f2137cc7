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
