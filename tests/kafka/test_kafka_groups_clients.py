"""Consumer groups with real Kafka clients against a real ``tidelog serve --kafka-port``: the
clients run their assignors, tidelog coordinates. Each consumer is its own process
(``kafka_group_member.py``: killed by PID, kill -9 where a test says so) that commits every
message synchronously and reports what it got and committed.

What must hold in every test: each message produced is consumed at least once; no offset is
committed twice (a message is read again only by a consumer that came after one which had not
committed it: repeats only past the last commit).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tests.support.server import ServerProcess, served

from tidelog.client import Client
from tidelog.process import free_port

pytestmark = pytest.mark.slow

MEMBER = Path(__file__).with_name("kafka_group_member.py")


class Member:
    """A consumer process and the events it reported (module docstring)."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, *assignors: str):
        self.name = f"{client}[{' '.join(assignors)}]"
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, str(MEMBER), client, bootstrap, group, topic, *assignors],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def client_id(self) -> str:
        """The client id it names itself with (the broker's DescribeGroups shows it)."""
        return f"member-{self.process.pid}"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                with self._lock:
                    self.events.append(event)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    @property
    def assigned(self) -> list[int] | None:
        shown = self.of("assigned")
        return shown[-1]["partitions"] if shown else None

    def stop(self) -> None:
        """SIGTERM: it leaves the group and exits (killed if it does not, in time)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def members() -> Iterator[Callable[..., Member]]:
    started: list[Member] = []

    def start(*args: str) -> Member:
        member = Member(*args)
        started.append(member)
        return member

    try:
        yield start
    finally:
        for member in started:
            member.kill()


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    with served(tmp_path / "data", "--kafka-port", str(port)) as server:
        yield server, f"127.0.0.1:{port}"


def until(check: Callable[[], bool], what: str, within: float = 40.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}")
        time.sleep(0.1)


def produce(bootstrap: str, topic: str, values: range, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in values:
        producer.produce(topic, value=str(n).encode(), partition=n % partitions)
    assert producer.flush(20) == 0


def consumed(group: list[Member]) -> Counter[str]:
    return Counter(e["v"] for m in group for e in m.of("got"))


def all_consumed(group: list[Member], values: range) -> Callable[[], bool]:
    return lambda: {str(n) for n in values} <= set(consumed(group))


def check_delivery(group: list[Member], values: range) -> None:
    """At least once each; no (partition, offset) committed twice (module docstring)."""
    seen = consumed(group)
    assert {str(n) for n in values} <= set(seen), "messages lost"
    commits = Counter((e["p"], e["o"]) for m in group for e in m.of("committed"))
    twice = {where: n for where, n in commits.items() if n > 1}
    assert not twice, f"offsets committed by more than one read: {twice}"
    got = Counter((e["p"], e["o"]) for m in group for e in m.of("got"))
    for (partition, offset), count in got.items():
        if count > 1:  # read again: no earlier read committed it
            assert commits[(partition, offset + 1)] <= 1


def shares(group: list[Member], partitions: int) -> Callable[[], bool]:
    """Every partition assigned to exactly one of the live members."""

    def check() -> bool:
        owned = [p for m in group for p in (m.assigned or [])]
        return sorted(owned) == list(range(partitions)) and all(
            m.assigned is not None for m in group
        )

    return check


def described(admin: AdminClient, group: str) -> Any:
    return admin.describe_consumer_groups([group])[group].result(10)


def settle(
    admin: AdminClient, name: str, group: list[Member], assignor: str, partitions: int
) -> None:
    """Wait for ``group`` Stable with every member, assigned by ``assignor``, each member
    holding an even share of ``partitions`` (the clients apply an assignment a little after
    the broker has it)."""

    def stable() -> bool:
        found = described(admin, name)
        return bool(
            found.state.name == "STABLE"
            and len(found.members) == len(group)
            and found.partition_assignor == assignor
        )

    def even() -> bool:
        share = partitions // len(group)
        return shares(group, partitions)() and all(len(m.assigned or []) == share for m in group)

    until(stable, f"{name}: Stable with {len(group)} members, assigned by {assignor}")
    until(even, f"{name}: an even share each")


def owners(admin: AdminClient, name: str) -> dict[str, set[int]] | None:
    """Client id -> partitions, as the broker assigned them (None: the group is not Stable)."""
    found = described(admin, name)
    if found.state.name != "STABLE":
        return None
    return {
        m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in found.members
    }


def test_confluent_consumers_share_a_topic_take_a_new_member_and_survive_a_kill(
    kafka: tuple[ServerProcess, str], members: Callable[..., Member]
) -> None:
    server, bootstrap = kafka
    with Client(server.address) as tidelog:
        tidelog.create_stream("shared", partitions=3)
    group = [members("confluent", bootstrap, "sharing", "shared", "range") for _ in range(3)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    settle(admin, "sharing", group, "range", 3)
    listed = admin.list_consumer_groups().result(10)
    assert "sharing" in {g.group_id for g in listed.valid}
    assert owners(admin, "sharing") == {m.client_id: set(m.assigned or []) for m in group}

    produce(bootstrap, "shared", range(0, 300), 3)
    until(all_consumed(group, range(300)), "the first 300 consumed")
    assert max(consumed(group).values()) == 1  # a stable group: each message once

    group.append(members("confluent", bootstrap, "sharing", "shared", "range"))
    until(lambda: len(owners(admin, "sharing") or ()) == 4, "four members, Stable")
    produce(bootstrap, "shared", range(300, 600), 3)
    until(all_consumed(group, range(600)), "600 consumed after the fourth joined")

    assigned = owners(admin, "sharing")
    assert assigned is not None and sorted(p for ps in assigned.values() for p in ps) == [0, 1, 2]
    victim = next(m for m in group if assigned.get(m.client_id))
    lost = assigned[victim.client_id]
    killed_at = time.monotonic()
    victim.kill()  # kill -9: no LeaveGroup; its session (6 s) has to time out
    survivors = [m for m in group if m is not victim]
    produce(bootstrap, "shared", range(600, 900), 3)

    def moved() -> bool:
        now = owners(admin, "sharing")
        return (
            now is not None and victim.client_id not in now and lost <= set().union(*now.values())
        )

    until(moved, "the victim's partitions moved to the survivors")
    # its last heartbeat was at most 1 s before the kill
    assert time.monotonic() - killed_at > 4.5
    until(all_consumed(group, range(900)), "all 900 consumed after the kill")
    check_delivery(group, range(900))

    for member in survivors:
        member.stop()
    assert all(m.of("closed") for m in survivors)
    until(lambda: described(admin, "sharing").state.name == "EMPTY", "the group empty")


def test_committed_offsets_survive_a_restart_of_the_broker(tmp_path: Path) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": "keeper",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
    }
    with served(tmp_path / "data", "--kafka-port", str(port)):
        produce(bootstrap, "kept", range(10), 1)
        consumer = Consumer(settings)
        consumer.subscribe(["kept"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(message.offset())
        assert got == list(range(10))
        consumer.commit(offsets=[TopicPartition("kept", 0, 6)], asynchronous=False)
        consumer.close()
    # the first server was killed (by PID); a new one on the same data
    with served(tmp_path / "data", "--kafka-port", str(port)) as server:
        with Client(server.address) as tidelog:
            assert tidelog.fetch_cursor("__group:keeper", "kept", 0) == 5  # the last processed
        admin = AdminClient({"bootstrap.servers": bootstrap})
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("keeper")])
        listed = offsets["keeper"].result(10).topic_partitions
        assert [(tp.topic, tp.partition, tp.offset) for tp in listed] == [("kept", 0, 6)]
        consumer = Consumer(settings)
        assert consumer.committed([TopicPartition("kept", 0)], timeout=10)[0].offset == 6
        consumer.subscribe(["kept"])
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                first = message.offset()
        consumer.close()
        assert first == 6  # resumed from the commit


def test_kafka_python_and_aiokafka_members_in_groups_with_their_assignors(
    kafka: tuple[ServerProcess, str], members: Callable[..., Member]
) -> None:
    server, bootstrap = kafka
    with Client(server.address) as tidelog:
        tidelog.create_stream("mixed", partitions=4)
    # roundrobin is the only protocol both list: the members' vote picks it
    voted = [
        members("kafka-python", bootstrap, "voted", "mixed", "range", "roundrobin"),
        members("aiokafka", bootstrap, "voted", "mixed", "roundrobin"),
    ]
    ranged = [
        members("kafka-python", bootstrap, "ranged", "mixed", "range"),
        members("aiokafka", bootstrap, "ranged", "mixed", "range"),
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, group, assignor in (("voted", voted, "roundrobin"), ("ranged", ranged, "range")):
        settle(admin, name, group, assignor, 4)
    assert sorted(voted[0].assigned or []) in ([0, 2], [1, 3])  # roundrobin interleaves
    assert sorted(ranged[0].assigned or []) in ([0, 1], [2, 3])  # range cuts in runs

    produce(bootstrap, "mixed", range(200), 4)
    for group in (voted, ranged):  # each group reads every message, once
        until(all_consumed(group, range(200)), "both groups read all 200")
        check_delivery(group, range(200))
        assert max(consumed(group).values()) == 1
    for member in voted + ranged:
        member.stop()
        assert member.of("closed")


def test_cooperative_sticky_members_hand_partitions_over_incrementally(
    kafka: tuple[ServerProcess, str], members: Callable[..., Member]
) -> None:
    server, bootstrap = kafka
    with Client(server.address) as tidelog:
        tidelog.create_stream("sticky", partitions=3)
    first = members("confluent", bootstrap, "coop", "sticky", "cooperative-sticky")
    until(shares([first], 3), "one member owns all three")
    produce(bootstrap, "sticky", range(150), 3)
    second = members("confluent", bootstrap, "coop", "sticky", "cooperative-sticky")
    both = [first, second]
    until(lambda: shares(both, 3)() and all(m.assigned for m in both), "two members share three")
    kept = set(first.assigned or [])
    assert len(kept) in (1, 2)
    produce(bootstrap, "sticky", range(150, 300), 3)
    until(all_consumed([first, second], range(300)), "all 300 consumed")
    check_delivery([first, second], range(300))
    # incremental: the first member never gave up the partitions it kept
    history = [set(e["partitions"]) for e in first.of("assigned")]
    after_all = history[history.index({0, 1, 2}) :]
    assert all(kept <= owned for owned in after_all)
