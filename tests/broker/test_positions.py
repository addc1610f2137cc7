"""Subscribe positions in-process: ``resolve()`` and what a subscription delivers, for every
start/stop position in both directions, against the model of docs/api.md.

Four partitions: empty; dense (a three-message batch shares one timestamp); trimmed by retention
(the oldest retained offset is above 0); and gappy (offsets written with ``append_at``, gaps at
3-4 and 7-9). Subscriptions read two messages per batch so stop bounds fall inside batches. One
broker serves the module; every test builds its partition in a stream of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.broker.brokertools import (
    MS,
    LoopBroker,
    Partition0,
    broker_config,
    settle,
    start_run,
    value_of,
)
from tests.broker.subscribe_model import CASES, Case, End, Plan, expect, outcome, plan

from tidelog.broker import StreamConfig
from tidelog.broker.subscription import resolve
from tidelog.errors import InvalidArgument, StreamEmpty

KINDS = ("empty", "dense", "trimmed", "gappy")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopBroker]:
    broker = LoopBroker(broker_config(Path(tmp_path_factory.mktemp("positions"))))
    try:
        yield broker
    finally:
        broker.close()


def build(shared: LoopBroker, kind: str) -> Partition0:
    broker = shared.broker
    name = shared.new_stream_name()
    if kind == "trimmed":
        broker.create_stream(name, StreamConfig(segment_max_bytes=4096, retention_messages=6))
        part = Partition0(broker, name, value_bytes=1000)
        part.append(*([o] for o in range(20)))
        oldest = part.retain()
        assert oldest > 0, "retention should have removed the first segments"
        return part
    broker.create_stream(name)
    part = Partition0(broker, name)
    if kind == "dense":
        part.append([0], [1], [2, 3, 4], [5], [6, 7], [8], [9])
    elif kind == "gappy":
        part.append([0], [1], [2], [5], [6], [10], [11], [12])
    return part


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_resolve_start(shared: LoopBroker, kind: str, case: Case) -> None:
    """``resolve`` picks the start offset of the docs table, or raises the documented error."""
    part = build(shared, kind)
    request = case.request(part.records)
    expected = plan(part.records, request)
    log = shared.broker.partition(part.stream, 0).log
    if expected is End.INVALID:
        with pytest.raises(InvalidArgument):
            resolve(log, request)
        return
    if expected is End.EMPTY:
        with pytest.raises(StreamEmpty, match="stream is empty"):
            resolve(log, request)
        return
    bounds = resolve(log, request)
    assert bounds.reverse is case.reverse
    if expected is End.STOP:  # the stop time has passed before the start: nothing to deliver
        assert bounds.empty, "the stop lies before the start: the subscription ends at once"
        return
    assert isinstance(expected, Plan)
    assert (bounds.stop_offset, bounds.stop_timestamp) == (
        expected.stop_offset,
        expected.stop_timestamp,
    )
    if expected.start is None:
        assert bounds.empty, "nothing can be delivered: the subscription ends at once"
    else:
        assert not bounds.empty
        assert bounds.start_offset == expected.start


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_delivery(shared: LoopBroker, kind: str, case: Case) -> None:
    """Delivered offsets and the way the subscription ends match the model; a subscription that
    waits gets exactly the later messages its bounds allow (three are appended 1 ms apart)."""
    part = build(shared, kind)

    async def body() -> None:
        request = case.request(part.records)
        expected = expect(part.records, request)
        run = await start_run(shared.broker, part.stream, request)
        try:
            assert run.end() is expected.end, run.error
            assert tuple(run.offsets) == expected.offsets
            assert run.values == [value_of(o, part.value_bytes) for o in run.offsets]
            if expected.end is not End.WAITS:
                return
            resolved = plan(part.records, request)
            assert isinstance(resolved, Plan)
            newest = part.records[-1][0] if part.records else -1
            part.append([newest + 1])
            part.append([newest + 2], [newest + 3])
            assert run.task is not None and run.subscription is not None
            await settle(run.task, run.subscription)
            later = outcome(part.records, resolved)
            assert tuple(run.offsets) == later.offsets
            assert run.end() is later.end
        finally:
            await run.cancel()

    shared.run(body())


def test_trimmed_partition_really_lost_its_head(shared: LoopBroker) -> None:
    """The ``trimmed`` partition is what the table relies on: offset 0 is gone, EARLIEST is not."""
    part = build(shared, "trimmed")
    log = shared.broker.partition(part.stream, 0).log
    assert log.oldest_offset == part.records[0][0] > 0
    assert log.high_watermark == 19


def test_timestamps_are_as_written(shared: LoopBroker) -> None:
    """Stored timestamps are the ones the model wrote (the table's timestamp rows rely on it)."""
    part = build(shared, "dense")
    got = [
        (o, t)
        for b in shared.broker.partition(part.stream, 0).log.forward_reader(0)
        for o, t in zip(b.offsets.tolist(), b.timestamps.tolist(), strict=True)
    ]
    assert got == part.records
    assert part.records[2][1] == part.records[4][1] == part.records[1][1] + MS
