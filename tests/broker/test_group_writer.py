"""The consumer groups are saved off the event loop, a flood of changes in few writes
(``broker/group_writer.py``): counts of writes and the thread that made them, never timings."""

from __future__ import annotations

import asyncio
import errno
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker.group_writer import GroupWriter
from tidelog.broker.groups import GROUPS_FILE, GroupCoordinator
from tidelog.durable import faults
from tidelog.errors import DiskFull, LimitReached

JOINS = 50


class Gate:
    """A write that records its thread and the documents it got, and can be held shut."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.threads: list[int] = []
        self.documents: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def __call__(self, document: dict[str, Any]) -> None:
        self.threads.append(threading.get_ident())
        assert self.open.wait(30), "the test never opened the gate"
        if self.fail is not None:
            raise self.fail
        self.documents.append(document)


def coordinator() -> GroupCoordinator:
    return GroupCoordinator(lambda stream: 2)


def test_a_flood_of_joins_is_written_off_the_loop_in_two_writes() -> None:
    async def body() -> None:
        groups, gate = coordinator(), Gate()
        writer = GroupWriter(groups, gate)
        gate.open.clear()

        async def join(i: int) -> None:
            groups.join("g", f"c{i:02d}", ["s"])
            await writer.saved()

        first = asyncio.create_task(join(0))
        while not gate.threads:  # the first write is under way (and held)
            await asyncio.sleep(0.01)
        rest = [asyncio.create_task(join(i)) for i in range(1, JOINS)]
        await asyncio.sleep(0)
        assert not any(t.done() for t in [first, *rest]), "nobody is answered before its write"
        gate.open.set()
        await asyncio.gather(first, *rest)
        assert writer.writes == 2, "the 49 joins made during the first write share the second"
        assert threading.get_ident() not in gate.threads, "no write ran on the loop's thread"
        last = gate.documents[-1]["groups"]["g"]
        assert len(last["members"]) == JOINS and last["epoch"] == JOINS

    asyncio.run(body())


def test_a_failed_write_undoes_every_change_since_the_last_durable_one() -> None:
    async def body() -> None:
        groups, gate = coordinator(), Gate()
        writer = GroupWriter(groups, gate)
        groups.join("g", "kept", ["s"])
        await writer.saved()
        gate.fail = DiskFull("groups.json")
        groups.join("g", "lost", ["s"])
        groups.join("h", "lost", ["s"])
        with pytest.raises(DiskFull):
            await writer.saved()
        assert set(groups.groups) == {"g"} and set(groups.groups["g"].members) == {"kept"}
        assert groups.epoch("g") == 1
        gate.fail = None
        groups.join("g", "again", ["s"])  # a later change is saved as usual
        await writer.saved()
        assert set(gate.documents[-1]["groups"]["g"]["members"]) == {"kept", "again"}

    asyncio.run(body())


def test_the_broker_saves_joins_through_its_writer_and_caps_the_groups(tmp_path: Path) -> None:
    config = broker_config(tmp_path, max_groups=2)

    async def body() -> None:
        async with running(config) as broker:
            broker.create_stream("s")
            loop_thread = threading.get_ident()
            seen: list[int] = []
            write = broker.group_writer._write

            def spy(document: dict[str, Any]) -> None:
                seen.append(threading.get_ident())
                write(document)

            broker.group_writer._write = spy
            for group in ("a", "b"):
                broker.groups.join(group, "c", ["s"])
            await broker.group_writer.saved()
            with pytest.raises(LimitReached, match="max_groups"):
                broker.groups.join("c", "c", ["s"])
            broker.groups.join("a", "d", ["s"])  # a new member of a known group is fine
            await broker.group_writer.saved()
            assert seen and loop_thread not in seen
            faults.fail(GROUPS_FILE, error=errno.ENOSPC)
            broker.groups.join("b", "d", ["s"])
            with pytest.raises(DiskFull):
                await broker.group_writer.saved()
            faults.clear()
            assert set(broker.groups.groups["b"].members) == {"c"}
        saved = json.loads((tmp_path / GROUPS_FILE).read_text())
        assert set(saved["groups"]) == {"a", "b"}
        assert set(saved["groups"]["a"]["members"]) == {"c", "d"}

    asyncio.run(body())
