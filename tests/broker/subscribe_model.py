"""The "Subscribe positions" tables of ``docs/api.md`` as a small Python model.

The model never asks the broker anything: it works on a list of ``(offset, timestamp)`` pairs
(the retained, committed records, ascending, timestamps never decreasing) and a request, and says
what a subscriber must receive and how the subscription must end. Tests in ``tests/broker`` drive
the broker in-process against it; ``tests/api/test_subscribe_semantics.py`` drives a real server.

Two steps, so a test can extend the partition after subscribing and ask again:
``plan(records, request)`` resolves the request at subscribe time (or names the error), and
``outcome(records, plan)`` says what is deliverable from ``records`` and whether the subscription
has ended.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.broker import StartPosition, StopPosition, SubscribeRequest

Rec = tuple[int, int]
"""(offset, timestamp in ns)"""


class End(enum.Enum):
    STOP = "forward stop bound passed: RESOURCE_EXHAUSTED 'stop offset reached'"
    OLDEST = "reverse passed the oldest message or its stop: OK"
    WAITS = "forward, caught up and still open: waits for more"
    INVALID = "INVALID_ARGUMENT before any frame"
    EMPTY = "RESOURCE_EXHAUSTED 'stream is empty' before any frame"


@dataclass(frozen=True, slots=True)
class Plan:
    """A request resolved at subscribe time. ``start is None``: nothing can ever be delivered."""

    start: int | None
    stop_offset: int | None
    stop_timestamp: int | None
    reverse: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    offsets: tuple[int, ...]
    end: End


def high_watermark(records: Sequence[Rec]) -> int:
    return records[-1][0] if records else -1


def oldest_offset(records: Sequence[Rec], next_offset: int = 0) -> int:
    """The oldest retained offset; ``next_offset`` when nothing is retained."""
    return records[0][0] if records else next_offset


def plan(records: Sequence[Rec], request: SubscribeRequest) -> Plan | End:
    """Resolve ``request`` against ``records`` per docs/api.md, or return the error it gets."""
    if request.start is StartPosition.OFFSET and request.start_offset < 0:
        return End.INVALID
    if request.stop is StopPosition.OFFSET and request.stop_offset < 0:
        return End.INVALID
    hw = high_watermark(records)
    stop_offset: int | None = None
    stop_timestamp: int | None = None
    if request.stop is StopPosition.OFFSET:
        stop_offset = request.stop_offset
    elif request.stop is StopPosition.TIMESTAMP:
        stop_timestamp = request.stop_timestamp
    elif request.stop is StopPosition.LATEST and not request.reverse:
        if hw < 0:
            return End.EMPTY
        stop_offset = hw
    # STOP_LATEST reverse: "after the oldest message (HW is already the start)": no extra bound.

    if request.reverse:
        if hw < 0:
            return Plan(None, stop_offset, stop_timestamp, reverse=True)
        if request.start in (StartPosition.NEW_ONLY, StartPosition.LATEST):
            start: int | None = hw
        elif request.start is StartPosition.EARLIEST:
            start = oldest_offset(records)
        elif request.start is StartPosition.OFFSET:
            start = min(request.start_offset, hw)
        else:
            at_or_before = [o for o, t in records if t <= request.start_timestamp]
            start = at_or_before[-1] if at_or_before else None
        if start is not None and stop_offset is not None and stop_offset > start:
            return End.INVALID
        return Plan(start, stop_offset, stop_timestamp, reverse=True)

    if request.start is StartPosition.NEW_ONLY:
        start = hw + 1
    elif request.start is StartPosition.EARLIEST:
        start = oldest_offset(records)
    elif request.start is StartPosition.LATEST:
        start = max(hw, 0)
    elif request.start is StartPosition.OFFSET:
        start = max(request.start_offset, oldest_offset(records))
    else:
        at_or_after = [o for o, t in records if t >= request.start_timestamp]
        start = at_or_after[0] if at_or_after else hw + 1
    if stop_timestamp is not None and records and records[-1][1] >= stop_timestamp:
        # The partition has reached the stop time: the stop is the last message at or before it.
        at_or_before = [o for o, t in records if t <= stop_timestamp]
        if not at_or_before or at_or_before[-1] < start:
            return End.STOP
        stop_offset, stop_timestamp = at_or_before[-1], None
    if stop_offset is not None and stop_offset < start:
        return End.INVALID
    return Plan(start, stop_offset, stop_timestamp, reverse=False)


def outcome(records: Sequence[Rec], resolved: Plan) -> Outcome:
    """What a subscription resolved as ``resolved`` delivers from ``records``, and its end."""
    p = resolved
    if p.reverse:
        if p.start is None:
            return Outcome((), End.OLDEST)
        delivered = tuple(
            o
            for o, t in reversed(records)
            if o <= p.start
            and (p.stop_offset is None or o >= p.stop_offset)
            and (p.stop_timestamp is None or t >= p.stop_timestamp)
        )
        return Outcome(delivered, End.OLDEST)
    assert p.start is not None
    delivered = tuple(
        o
        for o, t in records
        if o >= p.start
        and (p.stop_offset is None or o <= p.stop_offset)
        and (p.stop_timestamp is None or t <= p.stop_timestamp)
    )
    hw = high_watermark(records)
    # Timestamps never decrease, so once the newest is past the time stop nothing more can come.
    ended = (p.stop_offset is not None and hw >= p.stop_offset) or (
        p.stop_timestamp is not None and bool(records) and records[-1][1] > p.stop_timestamp
    )
    return Outcome(delivered, End.STOP if ended else End.WAITS)


def expect(records: Sequence[Rec], request: SubscribeRequest) -> Outcome:
    resolved = plan(records, request)
    if isinstance(resolved, End):
        return Outcome((), resolved)
    return outcome(records, resolved)


# -- symbolic positions, resolved against a model when a test runs ---------------------------------


EMPTY_PARTITION_TIME = 1_700_000_000 * 10**9


@dataclass(frozen=True, slots=True)
class Pos:
    """An offset or timestamp named relative to the partition, so one table fits every partition.

    kinds: ``"offset"`` (``n``, or ``hw + n`` with ``from_hw``), ``"ts"`` (the timestamp of the
    record at index ``n`` plus ``delta`` ns; negative ``n`` counts from the end), ``"mid"`` (halfway
    between the timestamps of records ``n - 1`` and ``n``: strictly between two messages).
    """

    kind: str
    n: int = 0
    delta: int = 0
    from_hw: bool = False

    def value(self, records: Sequence[Rec]) -> int:
        """The concrete value; on an empty partition timestamps are an arbitrary fixed time."""
        if self.kind != "offset" and not records:
            return EMPTY_PARTITION_TIME + self.delta
        if self.kind == "offset":
            return (high_watermark(records) + self.n) if self.from_hw else self.n
        if self.kind == "ts":
            return records[self.n][1] + self.delta
        if self.kind == "mid":
            before, after = records[self.n - 1][1], records[self.n][1]
            assert after - before >= 20_000, "the model needs 20 us between these messages"
            return (before + after) // 2
        raise AssertionError(self.kind)

    def label(self) -> str:
        if self.kind == "offset":
            return f"hw{self.n:+d}" if self.from_hw else str(self.n)
        if self.kind == "ts":
            return f"ts[{self.n}]{self.delta:+d}" if self.delta else f"ts[{self.n}]"
        return f"mid[{self.n}]"


def request_for(
    records: Sequence[Rec],
    start: StartPosition,
    start_at: Pos | None,
    stop: StopPosition,
    stop_at: Pos | None,
    reverse: bool,
) -> SubscribeRequest:
    """A concrete request from a table row."""
    fields: dict[str, int] = {}
    if start_at is not None:
        key = "start_offset" if start is StartPosition.OFFSET else "start_timestamp"
        fields[key] = start_at.value(records)
    if stop_at is not None:
        key = "stop_offset" if stop is StopPosition.OFFSET else "stop_timestamp"
        fields[key] = stop_at.value(records)
    return SubscribeRequest(start=start, stop=stop, reverse=reverse, **fields)


# -- the table both test suites run ----------------------------------------------------------------

S = StartPosition
P = StopPosition


@dataclass(frozen=True, slots=True)
class Case:
    start: StartPosition
    start_at: Pos | None = None
    stop: StopPosition = StopPosition.ON_CANCEL
    stop_at: Pos | None = None
    reverse: bool = False

    @property
    def exact_timestamps(self) -> bool:
        """Uses a timestamp only nanosecond requests can express (not a client ``datetime``)."""
        return any(
            p is not None and p.kind == "ts" and abs(p.delta) < 20_000
            for p in (self.start_at, self.stop_at)
        )

    @property
    def id(self) -> str:
        start = self.start.name + (f"={self.start_at.label()}" if self.start_at else "")
        stop = self.stop.name + (f"={self.stop_at.label()}" if self.stop_at else "")
        return f"{'rev' if self.reverse else 'fwd'}-{start}-{stop}"

    def request(self, records: Sequence[Rec]) -> SubscribeRequest:
        return request_for(
            records, self.start, self.start_at, self.stop, self.stop_at, self.reverse
        )


def _off(n: int) -> Pos:
    return Pos("offset", n)


def _hw(n: int) -> Pos:
    return Pos("offset", n, from_hw=True)


BEFORE_FIRST = Pos("ts", 0, -50_000)
AFTER_NEWEST = Pos("ts", -1, 50_000)

CASES: tuple[Case, ...] = (
    # forward starts
    Case(S.NEW_ONLY),
    Case(S.EARLIEST),
    Case(S.LATEST),
    Case(S.OFFSET, _off(0)),
    Case(S.OFFSET, _off(3)),  # a gap at 3 (gappy): the next message
    Case(S.OFFSET, _hw(0)),
    Case(S.OFFSET, _hw(3)),  # beyond HW: waits for exactly that offset
    Case(S.TIMESTAMP, BEFORE_FIRST),
    Case(S.TIMESTAMP, Pos("ts", 3)),  # equal to a timestamp a whole batch shares (dense)
    Case(S.TIMESTAMP, Pos("mid", 5)),
    Case(S.TIMESTAMP, AFTER_NEWEST),  # waits for the next message
    # forward stops
    Case(S.EARLIEST, None, P.OFFSET, _off(4)),
    Case(S.EARLIEST, None, P.OFFSET, _off(8)),  # a gap at 8 (gappy)
    Case(S.EARLIEST, None, P.OFFSET, _hw(0)),
    Case(S.EARLIEST, None, P.OFFSET, _hw(2)),  # not there yet: waits, then stops
    Case(S.OFFSET, _off(5), P.OFFSET, _off(5)),
    Case(S.OFFSET, _off(6), P.OFFSET, _off(5)),  # stop before start
    Case(S.NEW_ONLY, None, P.OFFSET, _hw(0)),  # stop before the resolved start (HW + 1)
    Case(S.OFFSET, _off(0), P.OFFSET, _off(1)),  # below the oldest after retention: invalid
    Case(S.EARLIEST, None, P.LATEST),
    Case(S.LATEST, None, P.LATEST),
    Case(S.OFFSET, _off(2), P.TIMESTAMP, Pos("mid", 5)),
    Case(S.EARLIEST, None, P.TIMESTAMP, Pos("ts", 3)),
    Case(S.EARLIEST, None, P.TIMESTAMP, BEFORE_FIRST),
    Case(S.EARLIEST, None, P.TIMESTAMP, AFTER_NEWEST),  # waits until a later message
    # the stop is the newest message's time (a batch may share it): ends after it, as Liftbridge
    Case(S.EARLIEST, None, P.TIMESTAMP, Pos("ts", -1)),
    Case(S.OFFSET, _off(-1)),
    Case(S.EARLIEST, None, P.OFFSET, _off(-1)),
    # reverse
    Case(S.NEW_ONLY, reverse=True),
    Case(S.LATEST, reverse=True),
    Case(S.EARLIEST, reverse=True),
    Case(S.OFFSET, _off(3), reverse=True),
    Case(S.OFFSET, _off(8), reverse=True),
    Case(S.OFFSET, _hw(5), reverse=True),
    Case(S.OFFSET, _off(0), reverse=True),
    Case(S.TIMESTAMP, Pos("mid", 5), reverse=True),
    Case(S.TIMESTAMP, Pos("ts", 3), reverse=True),
    Case(S.TIMESTAMP, BEFORE_FIRST, reverse=True),
    Case(S.TIMESTAMP, AFTER_NEWEST, reverse=True),
    Case(S.LATEST, None, P.OFFSET, _off(4), reverse=True),
    Case(S.LATEST, None, P.OFFSET, _hw(0), reverse=True),
    Case(S.OFFSET, _off(2), P.OFFSET, _off(5), reverse=True),  # stop above start
    Case(S.EARLIEST, None, P.OFFSET, _hw(1), reverse=True),
    Case(S.LATEST, None, P.LATEST, reverse=True),
    Case(S.LATEST, None, P.TIMESTAMP, Pos("mid", 5), reverse=True),
    Case(S.LATEST, None, P.TIMESTAMP, Pos("ts", 3), reverse=True),
    Case(S.LATEST, None, P.TIMESTAMP, AFTER_NEWEST, reverse=True),
    Case(S.OFFSET, _off(-1), reverse=True),
    Case(S.LATEST, None, P.OFFSET, _off(-1), reverse=True),
)
