"""Consumer groups across restarts: what is saved in ``groups.json`` comes back with the same
epochs and assignments, members get a full consumer timeout from the restart, an unreadable file
stops the start naming it, and a change that cannot be saved (a full disk) is undone."""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker, StreamConfig
from tidelog.broker.groups import (
    GROUPS_FILE,
    GroupCoordinator,
    decode,
    encode,
    read_groups,
    write_groups,
)
from tidelog.durable import SYNC, WRITE, faults
from tidelog.errors import DiskFull, FailedPrecondition, GroupStateUnreadable

PARTITIONS = {"a": 3, "b": 2}


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    faults.clear()
    yield
    faults.clear()


def saved_at(path: Path, clock: Clock) -> GroupCoordinator:
    """A coordinator that saves to ``path`` and starts from what is there (a broker's start)."""
    groups = GroupCoordinator(
        PARTITIONS.__getitem__,
        consumer_timeout_s=10,
        clock=clock,
        save=functools.partial(write_groups, path),
    )
    groups.restore(read_groups(path))
    return groups


def state(groups: GroupCoordinator) -> dict[str, Any]:
    return groups.document()


def test_a_missing_file_means_no_groups(tmp_path: Path) -> None:
    assert read_groups(tmp_path / GROUPS_FILE) == {}
    assert saved_at(tmp_path / GROUPS_FILE, Clock()).groups == {}


def test_the_saved_document_round_trips(tmp_path: Path) -> None:
    path = tmp_path / GROUPS_FILE
    groups = saved_at(path, Clock())
    groups.join("g", "c1", ["a", "b"])
    groups.join("g", "c2", ["a"])
    groups.join("h", "solo", ["b"])
    saved = json.loads(path.read_text())
    assert saved == state(groups)  # every change is on disk as soon as it returns
    assert saved["version"] == 1
    assert saved["groups"]["g"]["members"] == {"c1": ["a", "b"], "c2": ["a"]}
    assert encode(decode(saved)) == saved
    assert encode(read_groups(path)) == saved


def test_after_a_restart_members_keep_their_epoch_and_assignments(tmp_path: Path) -> None:
    path = tmp_path / GROUPS_FILE
    clock = Clock()
    before = saved_at(path, clock)
    before.join("g", "c1", ["a", "b"])
    epoch = before.join("g", "c2", ["a", "b"])
    assigned = {c: before.fetch_assignments("g", c, epoch)[1] for c in ("c1", "c2")}

    after = saved_at(path, clock)  # the restart: nothing in memory survives but the file
    assert after.epoch("g") == epoch
    for consumer, partitions in assigned.items():
        assert after.fetch_assignments("g", consumer, epoch) == (epoch, partitions)
    release = after.admit("g", "c1", epoch, "a", 0, fence=lambda: None)
    release()
    after.report_coordinator("g", "c2", epoch)
    after.leave("g", "c2")  # a membership change after the restart is saved as any other
    assert after.epoch("g") == epoch + 1
    again = saved_at(path, clock)
    assert again.fetch_assignments("g", "c1", epoch + 1)[1] == {"a": [0, 1, 2], "b": [0, 1]}
    with pytest.raises(FailedPrecondition):
        again.fetch_assignments("g", "c2", epoch + 1)  # left, and stays gone


def test_the_last_member_leaving_removes_the_group_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / GROUPS_FILE
    groups = saved_at(path, Clock())
    groups.join("g", "c1", ["a"])
    groups.leave("g", "c1")
    assert read_groups(path) == {}


def test_a_mirror_saves_and_expires_nothing(tmp_path: Path, caplog: Any) -> None:
    """In a cluster the broker's coordinator holds what etcd decides: groups from its own file
    are dropped with a WARNING naming them, and silent members stay until the cluster's
    coordinator removes them."""
    path = tmp_path / GROUPS_FILE
    clock = Clock()
    saved_at(path, clock).join("old", "c1", ["a"])
    groups = saved_at(path, clock)
    with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
        groups.mirror()
    assert groups.groups == {} and "old" in caplog.text
    elsewhere = saved_at(tmp_path / "elsewhere.json", clock)
    elsewhere.join("g", "c1", ["a"])
    groups.groups.update(elsewhere.groups)  # what the cluster installs
    clock.now += 1_000
    groups.expire()
    assert set(groups.groups["g"].members) == {"c1"}, "not expired by the mirror"
    assert read_groups(path).keys() == {"old"}, "the file is left as it was"


def test_after_a_restart_expiry_counts_from_the_load(tmp_path: Path) -> None:
    """Heartbeats are not saved: a broker down for longer than the consumer timeout must not
    expire everyone at once on start, and a member that never comes back still expires."""
    path = tmp_path / GROUPS_FILE
    clock = Clock(100.0)
    before = saved_at(path, clock)
    before.join("g", "c1", ["a"])
    epoch = before.join("g", "c2", ["a"])

    clock.now = 5_000.0  # far past the 10 s timeout: the broker was down for more than an hour
    after = saved_at(path, clock)
    clock.now += 9
    assert after.fetch_assignments("g", "c1", epoch)[0] == epoch  # still a member, same epoch
    assert set(after.groups["g"].members) == {"c1", "c2"}
    clock.now += 2  # c2 silent for 11 s since the load, c1 for 2 s
    after.expire()
    assert set(after.groups["g"].members) == {"c1"}
    assert after.epoch("g") == epoch + 1
    assert set(read_groups(path)["g"].members) == {"c1"}  # the expiry was saved


def good_document() -> dict[str, Any]:
    return {
        "version": 1,
        "groups": {"g": {"epoch": 2, "members": {"c": ["a"]}, "assignments": {"c": {"a": [0]}}}},
    }


def changed(edit: Callable[[dict[str, Any]], object]) -> bytes:
    document = good_document()
    edit(document)
    return json.dumps(document).encode()


CORRUPT: dict[str, bytes] = {
    "not json": b'{"version": 1, "groups": {"g"',
    "empty": b"",
    "not utf-8": b"\xff\xfe\x00",
    "a list": b"[]",
    "a newer version": changed(lambda d: d.update(version=2)),
    "no groups": changed(lambda d: d.pop("groups")),
    "epoch not a number": changed(lambda d: d["groups"]["g"].update(epoch="2")),
    "epoch zero": changed(lambda d: d["groups"]["g"].update(epoch=0)),
    "no members": changed(lambda d: d["groups"]["g"].update(members={})),
    "member without streams": changed(lambda d: d["groups"]["g"]["members"].update(c=[])),
    "assignment to a stranger": changed(
        lambda d: d["groups"]["g"]["assignments"].update(x={"a": [1]})
    ),
    "negative partition": changed(lambda d: d["groups"]["g"]["assignments"].update(c={"a": [-1]})),
}


@pytest.mark.parametrize("content", CORRUPT.values(), ids=CORRUPT.keys())
def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / GROUPS_FILE
    path.write_bytes(json.dumps(good_document()).encode())
    assert read_groups(path)["g"].epoch == 2  # the baseline reads
    path.write_bytes(content)
    with pytest.raises(GroupStateUnreadable, match="cannot restore consumer groups from") as err:
        read_groups(path)
    assert str(path) in str(err.value)


def test_a_broker_does_not_start_on_an_unreadable_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / GROUPS_FILE).write_text("{torn")

    async def body() -> None:
        broker = Broker(broker_config(data))
        with pytest.raises(GroupStateUnreadable, match=str(data / GROUPS_FILE)):
            await broker.start()
        assert (data / GROUPS_FILE).read_text() == "{torn"  # left for the operator
        (data / GROUPS_FILE).unlink()
        async with running(broker_config(data)) as retry:  # the data directory was unlocked
            assert retry.groups.groups == {}

    asyncio.run(body())


def test_a_broker_restores_its_groups(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=3))
            broker.groups.join("g", "c1", ["s"])
            epoch = broker.groups.join("g", "c2", ["s"])
            assigned = broker.groups.fetch_assignments("g", "c2", epoch)
        async with running(broker_config(tmp_path)) as broker:
            assert broker.groups.epoch("g") == epoch
            assert broker.groups.fetch_assignments("g", "c2", epoch) == assigned

    asyncio.run(body())


@pytest.mark.parametrize("op", [WRITE, SYNC])
def test_a_change_that_cannot_be_saved_is_undone(tmp_path: Path, op: str) -> None:
    path = tmp_path / GROUPS_FILE
    groups = saved_at(path, Clock())
    epoch = groups.join("g", "c1", ["a", "b"])
    before, on_disk = state(groups), path.read_bytes()

    faults.fail(GROUPS_FILE, op=op)
    with pytest.raises(DiskFull, match="disk space"):
        groups.join("g", "c2", ["a"])
    assert faults.hits, "the fault was never reached"
    assert state(groups) == before  # not a member, epoch and assignments as they were
    assert path.read_bytes() == on_disk
    assert sorted(p.name for p in tmp_path.iterdir()) == [GROUPS_FILE]  # no temp file left
    with pytest.raises(FailedPrecondition):
        groups.fetch_assignments("g", "c2", epoch)

    faults.fail(GROUPS_FILE, op=op)
    with pytest.raises(DiskFull):
        groups.leave("g", "c1")  # the last member: the group would go
    assert state(groups) == before
    assert groups.fetch_assignments("g", "c1", epoch)[0] == epoch

    faults.fail(GROUPS_FILE, op=op)
    with pytest.raises(DiskFull):
        groups.join("g", "c1", ["a"])  # a change of streams
    assert state(groups) == before

    newer = groups.join("g", "c2", ["a"])  # space again: the same change goes through
    assert newer == epoch + 1
    assert encode(read_groups(path)) == state(groups)


def test_an_expiry_that_cannot_be_saved_waits_for_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / GROUPS_FILE
    clock = Clock()
    groups = saved_at(path, clock)
    groups.join("g", "c1", ["a"])
    epoch = groups.join("g", "c2", ["a"])
    before = state(groups)

    clock.now = 8
    groups.fetch_assignments("g", "c1", epoch)
    clock.now = 12  # c2 silent for 12 s > 10 s
    faults.fail(GROUPS_FILE, times=3, error=errno.ENOSPC)
    with caplog.at_level(logging.WARNING, logger="tidelog.broker"):
        assert groups.fetch_assignments("g", "c1", epoch)[0] == epoch  # the heartbeat works
        groups.expire()
    assert state(groups) == before  # c2 kept, in memory as on disk
    assert encode(read_groups(path)) == before
    warnings = [r for r in caplog.records if "silent consumer-group members" in r.message]
    assert len(warnings) == 1, "one line, not one per heartbeat"

    groups.expire()  # the third armed failure
    faults.clear()
    groups.expire()
    assert set(groups.groups["g"].members) == {"c1"}
    assert groups.epoch("g") == epoch + 1
    assert encode(read_groups(path)) == state(groups)
