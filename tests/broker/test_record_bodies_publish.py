"""Publishing ``RecordBodies`` (the log's columnar records, what the Kafka front appends) through
the broker: every path a publish takes stores what the same ``NewRecord`` list would store.

Each check reads the partition's log back rather than trusting what publish answered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker, NewRecord, RecordBodies
from tidelog.broker.producers import PRODUCER_HEADER, decode_producer
from tidelog.errors import InvalidArgument

NAME = "__col"


def bodies() -> RecordBodies:
    data = b"k0v0v1k2v2"
    rows = np.array([[0, 0], [1, 1], [2, 2]], dtype=np.uint8)
    return RecordBodies.from_columns(
        data,
        (np.array([0, 0, 6]), np.array([2, -1, 2])),
        (np.array([2, 4, 8]), np.array([2, 2, 2])),
        first_header=(NAME, rows),
        headers={1: {NAME: b"\x01\x01", "h": b"x"}},
    )


def stored(broker: Broker, stream: str) -> list[tuple[bytes | None, bytes, dict[str, bytes]]]:
    log = broker.partition(stream, 0).log
    return [
        (r.key, r.value, dict(r.headers))
        for batch in log.forward_reader(0)
        for r in batch.records()
    ]


def test_publish_stores_the_records_and_counts_their_values(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("cols")
            broker.create_stream("objs")
            published = await broker.publish("cols", 0, bodies())
            await broker.publish("objs", 0, bodies().records())
            assert published.offsets == range(3)
            assert stored(broker, "cols") == stored(broker, "objs")
            assert stored(broker, "cols")[1] == (None, b"v1", {NAME: b"\x01\x01", "h": b"x"})
            stats = broker.partition("cols", 0).stats
            assert (stats.messages_in, stats.bytes_in) == (3, 6)
            assert broker.partition("objs", 0).stats.bytes_in == 6

    asyncio.run(body())


def test_an_idempotent_publish_marks_the_last_record_and_drops_a_retry(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("cols")
            broker.create_stream("objs")
            first = await broker.publish_idempotent("cols", 0, bodies(), "p", 3, owner="alice")
            again = await broker.publish_idempotent("cols", 0, bodies(), "p", 3, owner="alice")
            await broker.publish_idempotent("objs", 0, bodies().records(), "p", 3, owner="alice")
            assert (first.offsets, again.offsets, again.duplicate) == (range(3), range(3), True)
            assert stored(broker, "cols") == stored(broker, "objs")
            last = stored(broker, "cols")[-1][2]
            assert list(last)[:1] == [NAME] and last["__owner"] == b"alice"
            assert decode_producer(last[PRODUCER_HEADER]) == ("p", 3, 3)

    asyncio.run(body())


def test_reserved_names_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s")
            forged = RecordBodies.from_columns(
                b"v", None, (np.array([0]), np.array([1])), headers={0: {PRODUCER_HEADER: b"x"}}
            )
            with pytest.raises(InvalidArgument, match=PRODUCER_HEADER):
                await broker.publish("s", 0, forged)
            with pytest.raises(InvalidArgument, match=PRODUCER_HEADER):
                await broker.publish_idempotent("s", 0, forged, "p", 1)
            assert broker.partition("s", 0).log.newest_offset == -1
            assert isinstance(bodies()[0], NewRecord)

    asyncio.run(body())
