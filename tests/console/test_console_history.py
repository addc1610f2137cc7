"""The console's own history: publish rates from offset samples, bounded series, and when a
consumer counts as stalled."""

from __future__ import annotations

from tidelog.console.history import ConsumerState, Sample, Series, SeriesStore, consumer_state


def samples(*points: tuple[float, float]) -> list[Sample]:
    return [Sample(t, v) for t, v in points]


def test_rates_are_growth_per_second_and_never_negative() -> None:
    series = Series()
    for t, total in [(0, 100), (2, 300), (4, 300), (5, 50)]:
        series.add(t, total)
    assert [(s.time_s, s.value) for s in series.rates()] == [(2, 100.0), (4, 0.0), (5, 0.0)]
    series.add(5, 999)  # not later than the last sample: ignored
    assert len(series.samples) == 4


def test_series_are_bounded_in_points_and_in_number() -> None:
    store = SeriesStore(max_series=2, samples=3)
    for t in range(10):
        store.add("a", t, t)
    assert [s.value for s in store.get("a").samples] == [7, 8, 9]  # type: ignore[union-attr]
    store.add("b", 0, 0)
    store.add("a", 11, 1)  # a is the most recently updated now
    store.add("c", 0, 0)  # b goes
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


def test_a_consumer_with_lag_whose_cursor_does_not_move_is_stalled() -> None:
    offsets = samples((0, 5), (10, 5), (20, 5), (30, 5))
    lags = samples((0, 4), (10, 6), (20, 9), (30, 12))
    assert consumer_state(offsets, lags, 30, stall_after_s=25) is ConsumerState.STALLED
    # the cursor moved within the window: consuming, even if slower than the producers
    moving = samples((0, 5), (10, 5), (20, 6), (30, 6))
    assert consumer_state(moving, lags, 30, stall_after_s=25) is ConsumerState.CONSUMING
    # no lag: caught up, however long the cursor has stood still
    idle = samples((0, 0), (10, 0), (20, 0), (30, 0))
    assert consumer_state(offsets, idle, 30, stall_after_s=25) is ConsumerState.CAUGHT_UP
    # history shorter than the stall time: too early to tell
    assert consumer_state(offsets[-2:], lags[-2:], 30, stall_after_s=25) is ConsumerState.UNKNOWN
    assert consumer_state([], [], 30, stall_after_s=25) is ConsumerState.UNKNOWN
