"""What the console remembers between page views: publish rates and consumer lag over time.

The broker keeps no history of rates or lag; the console samples them itself (a sampler reads
stream metadata and cursors every ``sample_interval_s`` while it runs) and keeps the last
:data:`SAMPLES` points per series in memory, for at most :data:`MAX_SERIES` series (the least
recently updated is forgotten first), so its memory is bounded whatever the broker holds. A
restart of the console forgets the history; the broker is never written to.

Decisions are pure functions of the samples and a time passed in (tests give the clock):

- a publish **rate** is the offset growth between consecutive samples over their time apart;
- a consumer is **stalled** when its lag has been above zero and its cursor has not moved for at
  least ``stall_after_s``. A consumer with no lag is idle, never stalled.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import Enum

SAMPLES = 240
"""Points kept per series (at the default 5 s interval: the last 20 minutes)."""
MAX_SERIES = 5000
"""Series kept in all; beyond it the least recently updated is dropped."""


@dataclass(frozen=True, slots=True)
class Sample:
    time_s: float
    value: float


class Series:
    """The last :data:`SAMPLES` samples of one value, oldest first."""

    def __init__(self, samples: int = SAMPLES) -> None:
        self.samples: deque[Sample] = deque(maxlen=samples)

    def add(self, time_s: float, value: float) -> None:
        if self.samples and time_s <= self.samples[-1].time_s:
            return  # a clock that went backwards or a duplicate sample: keep the series monotonic
        self.samples.append(Sample(time_s, value))

    def rates(self) -> list[Sample]:
        """Growth per second between consecutive samples, stamped at the later one. A drop
        (a stream deleted and created again) counts as zero, not as a negative rate."""
        points = list(self.samples)
        return [
            Sample(b.time_s, max(b.value - a.value, 0.0) / (b.time_s - a.time_s))
            for a, b in itertools.pairwise(points)
        ]


class SeriesStore:
    """Series by key, at most ``max_series`` of them."""

    def __init__(self, max_series: int = MAX_SERIES, samples: int = SAMPLES) -> None:
        self.max_series = max_series
        self.sample_count = samples
        self._series: OrderedDict[Hashable, Series] = OrderedDict()

    def add(self, key: Hashable, time_s: float, value: float) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series(self.sample_count)
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(key)
        series.add(time_s, value)

    def get(self, key: Hashable) -> Series | None:
        return self._series.get(key)

    def __len__(self) -> int:
        return len(self._series)


class ConsumerState(Enum):
    CAUGHT_UP = "caught up"
    CONSUMING = "consuming"
    STALLED = "stalled"
    UNKNOWN = "unknown"
    """too few samples to tell"""


def consumer_state(
    offsets: Sequence[Sample], lags: Sequence[Sample], now_s: float, stall_after_s: float
) -> ConsumerState:
    """A cursor's state from its offset and lag samples (oldest first).

    Caught up when the latest lag is zero; stalled when the lag stayed above zero and the offset
    did not change over the samples of the last ``stall_after_s`` (which must reach back that
    far); consuming otherwise."""
    if not lags or not offsets:
        return ConsumerState.UNKNOWN
    if lags[-1].value <= 0:
        return ConsumerState.CAUGHT_UP
    since = now_s - stall_after_s
    if offsets[0].time_s > since:
        return ConsumerState.UNKNOWN
    window = [s for s in offsets if s.time_s >= since]
    before = [s for s in offsets if s.time_s < since]
    reference = before[-1].value if before else window[0].value
    recent_lags = [s for s in lags if s.time_s >= since]
    if all(s.value == reference for s in window) and all(s.value > 0 for s in recent_lags):
        return ConsumerState.STALLED
    return ConsumerState.CONSUMING
