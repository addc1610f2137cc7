"""A Jepsen-style check of a cluster: every kind of producer and a consumer group run the whole
time while brokers are killed with SIGKILL; afterwards the logs on disk are the judge.

etcd and three brokers on loopback (short leases and group timeouts), a stream of 3 partitions
with 3 replicas and minIsr 2. Four producers, each in its own thread, publish with ack ALL to every
partition in turn and write down each value acknowledged with the partition and offset its ack
named; each value is unique (its kind and a counter):

== ======================================================= ======================================
a  ``tidelog.Client``, ``publish_batch`` with a producer id  retries the same sequence: stored once
   and sequence per partition
b  ``tidelog.Client``, plain ``publish``                     retries the same value: at least once
c  raw Liftbridge ``Publish`` at the leader, metadata        retries the same value: at least once
   fetched again after each error
d  raw Liftbridge ``Publish`` to the one broker it first     retries the same value; waits while
   knew (stale metadata: that broker forwards or refuses)    that broker is down
== ======================================================= ======================================

Two members of a consumer group joined through different brokers heartbeat the coordinator (and
report it when it cannot be reached), read their partitions from the group's cursor
(``__group:<id>``) at the leader in windows of a second, and commit what they read.

Faults: five times the leader of partition 0 is killed, restarted on its port ~3 s later, and
every ISR waited for; then the group's coordinator likewise. Brokers restart on the same port so
that producer d's broker comes back at the address it knows.

Judged on the three brokers' logs once all are back in every ISR and stopped with SIGTERM: no
acknowledged value missing from the partition and offset its ack named, producer a's values each
stored once, the replicas identical (offsets, timestamps, values), every value the group read
stored at the offset it was read at and read in order without gaps, and the group caught up (its
commits at each partition's end, every offset read) soon after the producers stop.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from tests.cluster.clustertools import Cluster, running_cluster, stored_records

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import Client, ClientError, ClientSettings
from tidelog.wire import CURSORS_STREAM

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback, ~40 s

T = TypeVar("T")

STREAM = "s"
PARTITIONS = 3
GROUP = "g"
GROUP_CURSOR = f"__group:{GROUP}"
"""Where a group's positions are kept (docs/api.md, "Consumer groups")."""
ROUNDS = 5
DOWN_S = 3.0
"""How long a killed broker stays down: past its lease (2 s), so an election happens."""
SETTLE_S = 30.0
"""Bound of every wait for the cluster (an ISR back, the group caught up, replicas settled)."""
FOLLOW_S = 1.5
"""A producer that follows leaders (a, b, c) acks on partition 0 this soon after the first of
them does once its leader was killed: a new leader serves, and a client that still sends to the
dead one waits for its restart, ~2 s later."""
HEARTBEAT_S = 0.5
READ_WINDOW_S = 1.0
"""A member reads each of its partitions this long in turn (the subscription's deadline)."""
ENV = {
    # As test_cluster_groups.py: a silent member leaves after 3 s, reports count for 5 s.
    "TIDELOG_GROUP_CONSUMER_TIMEOUT_S": "3",
    "TIDELOG_GROUP_COORDINATOR_TIMEOUT_S": "5",
}
CHANNEL_OPTIONS = [
    # gRPC's default reconnect backoff grows to 120 s; a broker is back within seconds.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
]
CLIENT_SETTINGS = ClientSettings(ack_all=True, retry_budget_s=8.0)


class Channels:
    """One channel per broker address, shared by threads (gRPC channels are thread-safe)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def api(self, address: str) -> Any:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                self._channels[address] = channel
        return pb_grpc.APIStub(channel)

    def first_answer(self, addresses: list[str], call: Callable[[Any], T]) -> T | None:
        """``call`` on each address's stub in turn; the first answer, None if none answers."""
        for address in addresses:
            try:
                return call(self.api(address))
            except grpc.RpcError:
                continue
        return None

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()


def error_text(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


# -- producers -------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What one producer was told: each value acknowledged, at the partition and offset named."""

    kind: str
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    sent: set[bytes] = field(default_factory=set)
    retries: int = 0
    duplicates_answered: int = 0
    """Producer a: retries the broker answered ``duplicate`` (stored before, not again)."""
    errors: Counter[str] = field(default_factory=Counter)
    last_error: str = ""

    def since(self, moment: float) -> int:
        return sum(1 for t in self.ack_times if t >= moment)

    def failover(self, partition: int, killed_at: float) -> float:
        """Seconds from ``killed_at`` to the first ack of ``partition`` after it (inf: none)."""
        return next(
            (
                t - killed_at
                for (p, _, _), t in zip(self.acked, self.ack_times, strict=False)
                if p == partition and t >= killed_at
            ),
            math.inf,
        )

    def longest_stall(self, start: float, end: float) -> float:
        """The longest time between acks (or from ``start``/to ``end``) within the window."""
        times = [start, *(t for t in self.ack_times if start <= t <= end), end]
        return max(b - a for a, b in pairwise(times))


class Producer(threading.Thread):
    """Publishes value after value, each to partition ``n % 3``; ``publish`` returns once the
    value is acknowledged (retrying as this kind of application does) or the producer stops."""

    kind = ""

    def __init__(self, channels: Channels) -> None:
        super().__init__(name=f"producer-{self.kind}", daemon=True)
        self.channels = channels
        self.ledger = Ledger(self.kind)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.setup()
            n = 0
            while not self.stop.is_set():
                self.publish(n, n % PARTITIONS)
                n += 1
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            self.teardown()

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def publish(self, n: int, partition: int) -> None:
        raise NotImplementedError

    def failed(self, error: BaseException, pause: float = 0.05) -> None:
        self.ledger.retries += 1
        code = error.code().name if isinstance(error, grpc.RpcError) else type(error).__name__
        self.ledger.errors[code] += 1
        self.ledger.last_error = error_text(error)
        self.stop.wait(pause)

    def acked(self, partition: int, offset: int, value: bytes) -> None:
        self.ledger.acked.append((partition, offset, value))
        self.ledger.ack_times.append(time.monotonic())


class ClientProducer(Producer):
    """A producer through a ``tidelog.Client`` given ``server``, made in its own thread."""

    def __init__(self, channels: Channels, server: str) -> None:
        super().__init__(channels)
        self.server = server
        self.client: Client | None = None

    def setup(self) -> None:
        self.client = Client(self.server, settings=CLIENT_SETTINGS)

    def teardown(self) -> None:
        if self.client is not None:
            self.client.close()


class IdempotentProducer(ClientProducer):
    """(a) ``tidelog.Client.publish_batch`` of 3 values with producer id ``a<partition>`` and the
    partition's next sequence, sent again with the same sequence until acknowledged."""

    kind = "a"

    def __init__(self, channels: Channels, server: str) -> None:
        super().__init__(channels, server)
        self.sequences = [0] * PARTITIONS

    def publish(self, n: int, partition: int) -> None:
        assert self.client is not None
        values = [b"a-%d-%d" % (n, i) for i in range(3)]
        self.ledger.sent.update(values)
        sequence = self.sequences[partition]
        while not self.stop.is_set():
            try:
                acks = self.client.publish_batch(
                    STREAM,
                    values,
                    partition=partition,
                    producer_id=f"a{partition}",
                    producer_sequence=sequence,
                    timeout=8,
                )
            except ClientError as error:
                self.failed(error)
                continue
            assert len(acks) == len(values), f"sequence {sequence} of a{partition}: {acks!r}"
            self.ledger.duplicates_answered += acks.duplicate
            for ack, value in zip(acks, values, strict=True):
                self.acked(ack.partition, ack.offset, value)
            self.sequences[partition] += 1
            return


class PlainProducer(ClientProducer):
    """(b) ``tidelog.Client.publish`` without a producer id; the application sends the same value
    again after an error (it may then be stored twice, never lost)."""

    kind = "b"

    def publish(self, n: int, partition: int) -> None:
        assert self.client is not None
        value = b"b-%d" % n
        self.ledger.sent.add(value)
        while not self.stop.is_set():
            try:
                ack = self.client.publish(STREAM, value, partition=partition)
            except ClientError as error:
                self.failed(error)
                continue
            self.acked(ack.partition, ack.offset, value)
            return


def partition_named(ack: pb.Ack) -> int:
    """The partition a Liftbridge ack names: its partition subject is ``s`` or ``s.N``."""
    assert ack.stream == STREAM, ack
    subject = ack.partitionSubject
    return 0 if subject == STREAM else int(subject.rsplit(".", 1)[1])


class LiftbridgeProducer(Producer):
    """(c) ``Publish`` with ack ALL at the partition's leader as the last metadata named it; after
    an error it fetches the metadata again (from any broker it knows) and retries the value."""

    kind = "c"

    def __init__(self, channels: Channels, seeds: list[str]) -> None:
        super().__init__(channels)
        self.addresses = list(seeds)
        self.leaders: dict[int, str] = {}
        self.refreshes = 0

    def setup(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        self.refreshes += 1
        request = pb.FetchMetadataRequest(streams=[STREAM])
        answer = self.channels.first_answer(
            self.addresses, lambda api: api.FetchMetadata(request, timeout=1)
        )
        if answer is None:
            return
        brokers = {b.id: f"{b.host}:{b.port}" for b in answer.brokers}
        self.addresses = sorted(set(self.addresses) | set(brokers.values()))
        partitions = answer.streamMetadata[0].partitions
        self.leaders = {n: brokers[p.leader] for n, p in partitions.items() if p.leader in brokers}

    def publish(self, n: int, partition: int) -> None:
        value = b"c-%d" % n
        self.ledger.sent.add(value)
        request = pb.PublishRequest(
            stream=STREAM, partition=partition, value=value, ackPolicy=pb.AckPolicy.ALL
        )
        while not self.stop.is_set():
            leader = self.leaders.get(partition)
            if leader is None:
                self.refresh()
                self.stop.wait(0.05)
                continue
            try:
                answer = self.channels.api(leader).Publish(request, timeout=5)
            except grpc.RpcError as error:
                self.failed(error)
                self.refresh()
                continue
            self.acked(partition_named(answer.ack), answer.ack.offset, value)
            return


class StaleProducer(Producer):
    """(d) ``Publish`` with ack ALL, always to the one broker it first knew: that broker
    publishes on the leader (or refuses while it does not know one); when it is down, the
    producer waits for it, retrying."""

    kind = "d"

    def __init__(self, channels: Channels, address: str) -> None:
        super().__init__(channels)
        self.address = address

    def publish(self, n: int, partition: int) -> None:
        value = b"d-%d" % n
        self.ledger.sent.add(value)
        request = pb.PublishRequest(
            stream=STREAM, partition=partition, value=value, ackPolicy=pb.AckPolicy.ALL
        )
        while not self.stop.is_set():
            try:
                answer = self.channels.api(self.address).Publish(request, timeout=5)
            except grpc.RpcError as error:
                self.failed(error, pause=0.1)
                continue
            self.acked(partition_named(answer.ack), answer.ack.offset, value)
            return


# -- the consumer group ----------------------------------------------------------------------------


class GroupReads:
    """What the group's members read, by partition and offset, and any anomaly in it."""

    def __init__(self) -> None:
        self.values: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        self.anomalies: list[str] = []
        self.lock = threading.Lock()

    def add(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            before = self.values[partition].setdefault(offset, value)
            if before != value:
                self.anomalies.append(f"{partition}/{offset} read as {before!r} and {value!r}")

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.values.values())

    def offsets(self, partition: int) -> set[int]:
        with self.lock:
            return set(self.values[partition])


class Member:
    """A group member as a Liftbridge client runs one, over the Liftbridge API: it joins through
    ``via``, heartbeats the coordinator (FetchConsumerGroupAssignments) every 0.5 s, reports a
    coordinator it cannot reach and asks any broker for the group's coordinator and epoch when
    refused, joins again when it is no longer a member. A second thread reads each assigned
    partition in turn, from the group's cursor + 1 at the partition's leader, and commits."""

    def __init__(
        self, channels: Channels, name: str, via: str, seeds: list[str], reads: GroupReads
    ) -> None:
        self.channels = channels
        self.name = name
        self.via = via
        self.addresses = list(seeds)
        self.reads = reads
        self.lock = threading.Lock()
        self.epoch = 0
        self.coordinator = ""
        self.brokers: dict[str, str] = {}
        self.assigned: tuple[int, ...] = ()
        self.leaders: dict[int, str] = {}
        self.joins = 0
        self.reports = 0
        self.commits = 0
        self.read_errors: Counter[str] = Counter()
        """Why a read window could not start or ended early, by cause."""
        self.windows = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._guarded(self._heartbeats), daemon=True),
            threading.Thread(target=self._guarded(self._reading), daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self, timeout: float) -> bool:
        """Stop and wait; False if a thread is still running after ``timeout``."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0))
        return not any(t.is_alive() for t in self.threads)

    def _guarded(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except BaseException as error:  # reported by the test
                self.error = error

        return run

    def _ordered(self, first: str = "") -> list[str]:
        known = sorted(set(self.addresses) | set(self.brokers.values()))
        return sorted(known, key=lambda a: a != first)

    # heartbeats

    def _heartbeats(self) -> None:
        while not self.stop.is_set():
            if not self.epoch:
                self._join()
            else:
                self._heartbeat()
            self.stop.wait(HEARTBEAT_S)

    def _join(self) -> None:
        request = pb.JoinConsumerGroupRequest(groupId=GROUP, consumerId=self.name, streams=[STREAM])
        answer = self.channels.first_answer(
            self._ordered(self.via), lambda api: api.JoinConsumerGroup(request, timeout=5)
        )
        if answer is not None:
            self.joins += 1
            with self.lock:
                self.coordinator, self.epoch = answer.coordinator, answer.epoch
            self._refresh_group()
            self._heartbeat()

    def _heartbeat(self) -> None:
        address = self.brokers.get(self.coordinator)
        if address is None:
            self._refresh_group()
            return
        request = pb.FetchConsumerGroupAssignmentsRequest(
            groupId=GROUP, consumerId=self.name, epoch=self.epoch
        )
        try:
            answer = self.channels.api(address).FetchConsumerGroupAssignments(request, timeout=1)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND or "not a member" in (
                error.details() or ""
            ):
                with self.lock:
                    self.epoch = 0  # expired or the group is gone: join again
            elif error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self._refresh_group()  # another epoch, or another coordinator
            else:
                self._report()
                self._refresh_group()
            return
        assigned = sorted(p for a in answer.assignments if a.stream == STREAM for p in a.partitions)
        with self.lock:
            self.epoch, self.assigned = answer.epoch, tuple(assigned)

    def _refresh_group(self) -> None:
        request = pb.FetchMetadataRequest(groups=[GROUP])
        answer = self.channels.first_answer(
            self._ordered(), lambda api: api.FetchMetadata(request, timeout=1)
        )
        if answer is None:
            return
        self.brokers = {b.id: f"{b.host}:{b.port}" for b in answer.brokers}
        meta = answer.groupMetadata[0]
        with self.lock:
            if meta.error == pb.ConsumerGroupMetadata.UNKNOWN_GROUP:
                self.epoch = 0
            else:
                self.coordinator, self.epoch = meta.coordinator, meta.epoch

    def _report(self) -> None:
        request = pb.ReportConsumerGroupCoordinatorRequest(
            groupId=GROUP, consumerId=self.name, coordinator=self.coordinator, epoch=self.epoch
        )
        dead = self.brokers.get(self.coordinator, "")
        others = [a for a in self._ordered() if a != dead]
        answer = self.channels.first_answer(
            others, lambda api: api.ReportConsumerGroupCoordinator(request, timeout=2)
        )
        self.reports += answer is not None

    # reading

    def _reading(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                assigned, epoch = self.assigned, self.epoch
            if not assigned or not epoch:
                self.stop.wait(0.1)
                continue
            for partition in assigned:
                if self.stop.is_set():
                    break
                if not self._read(partition, epoch):
                    self.stop.wait(0.1)

    def _cursor_call(self, call: Callable[[Any], T]) -> T | None:
        """A cursor call at the leader of the cursor's ``__cursors`` partition: the brokers in
        turn (the others refuse, naming it)."""
        return self.channels.first_answer(self._ordered(), call)

    def _leader(self, partition: int) -> str | None:
        if partition not in self.leaders:
            request = pb.FetchMetadataRequest(streams=[STREAM])
            answer = self.channels.first_answer(
                self._ordered(), lambda api: api.FetchMetadata(request, timeout=1)
            )
            if answer is not None:
                brokers = {b.id: f"{b.host}:{b.port}" for b in answer.brokers}
                self.brokers = brokers
                self.leaders = {
                    n: brokers[p.leader]
                    for n, p in answer.streamMetadata[0].partitions.items()
                    if p.leader in brokers
                }
        return self.leaders.get(partition)

    def _read(self, partition: int, epoch: int) -> bool:
        """One window of reading ``partition``; False when it could not start."""
        cursor = self._cursor_call(fetch_cursor(partition))
        leader = self._leader(partition)
        if cursor is None or leader is None:
            self.read_errors["no cursor" if cursor is None else "no leader"] += 1
            return False
        start = cursor.offset + 1
        request = pb.SubscribeRequest(
            stream=STREAM,
            partition=partition,
            startPosition=pb.OFFSET,
            startOffset=start,
            consumer=pb.Consumer(groupId=GROUP, groupEpoch=epoch, consumerId=self.name),
        )
        last: int | None = None
        try:
            for message in self.channels.api(leader).Subscribe(request, timeout=READ_WINDOW_S):
                if not message.value:
                    continue  # the handshake
                if last is None and message.offset > start:
                    self.reads.anomalies.append(
                        f"{self.name} asked {partition}/{start}, got {message.offset} first"
                    )
                elif last is not None and message.offset != last + 1:
                    self.reads.anomalies.append(
                        f"{self.name} read {partition}/{message.offset} after {last}"
                    )
                self.reads.add(partition, message.offset, message.value)
                last = message.offset
                if self.stop.is_set():
                    break
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # the window's normal end
                self.read_errors[error.code().name] += 1
                self.leaders.pop(partition, None)
        self.windows += 1
        if last is not None:
            commit = pb.SetCursorRequest(
                stream=STREAM, partition=partition, cursorId=GROUP_CURSOR, offset=last
            )
            if self._cursor_call(lambda api: api.SetCursor(commit, timeout=3)) is not None:
                self.commits += 1
        return True


# -- the cluster -----------------------------------------------------------------------------------


def restart(cluster: Cluster, broker_id: str) -> None:
    """Start a killed broker again on its own port and data directory (its log lines go on in
    the same list, so ``cluster.logs()`` shows both lives)."""
    server = cluster.servers[broker_id]
    if "--port" not in server.extra:
        server.extra = [*server.extra, "--port", str(server.port)]
    server.start()


def group_coordinator(channels: Channels, cluster: Cluster) -> tuple[str, int]:
    """The group's coordinator and epoch as the first live broker that answers says."""
    addresses = [cluster.servers[b].address for b in cluster.live()]
    request = pb.FetchMetadataRequest(groups=[GROUP])
    answer = channels.first_answer(addresses, lambda api: api.FetchMetadata(request, timeout=2))
    assert answer is not None, "no broker answers"
    group = answer.groupMetadata[0]
    return group.coordinator, group.epoch


def out_of_sync(channels: Channels, cluster: Cluster) -> list[str]:
    """Why not every live broker is in every ISR of ``s`` and ``__cursors`` with a live leader
    (empty: all are)."""
    everyone = sorted(cluster.servers)
    live = cluster.live()
    if live != everyone:
        return [f"live brokers {live}"]
    addresses = [cluster.servers[b].address for b in live]
    answer = channels.first_answer(
        addresses,
        lambda api: api.FetchMetadata(
            pb.FetchMetadataRequest(streams=[STREAM, CURSORS_STREAM]), timeout=2
        ),
    )
    if answer is None:
        return ["no broker answers"]
    problems = []
    for stream in answer.streamMetadata:
        if stream.error or not stream.partitions:
            problems.append(f"{stream.name}: {pb.StreamMetadata.Error.Name(stream.error)}")
        for number, partition in sorted(stream.partitions.items()):
            if sorted(partition.isr) != everyone or partition.leader not in live:
                problems.append(
                    f"{stream.name}/{number}: leader {partition.leader!r}, "
                    f"isr {list(partition.isr)}"
                )
    return problems


def settled_ends(channels: Channels, cluster: Cluster) -> dict[int, int] | None:
    """Each partition's newest offset once every broker's replica has it and calls it
    committed; None before."""
    seen: set[tuple[tuple[int, int, int], ...]] = set()
    for broker_id in sorted(cluster.servers):
        request = pb.FetchMetadataRequest(streams=[STREAM])
        try:
            answer = channels.api(cluster.servers[broker_id].address).FetchMetadata(
                request, timeout=2
            )
        except grpc.RpcError:
            return None
        partitions = answer.streamMetadata[0].partitions
        seen.add(
            tuple(
                (n, partitions[n].newestOffset, partitions[n].highWatermark)
                for n in range(PARTITIONS)
            )
        )
    if len(seen) != 1:
        return None
    (ends,) = seen
    if any(newest != high for _, newest, high in ends):
        return None
    return {n: newest for n, newest, _ in ends}


def fetch_cursor(partition: int) -> Callable[[Any], pb.FetchCursorResponse]:
    request = pb.FetchCursorRequest(stream=STREAM, partition=partition, cursorId=GROUP_CURSOR)
    return lambda api: api.FetchCursor(request, timeout=2)


def group_lag(channels: Channels, cluster: Cluster, reads: GroupReads, ends: dict[int, int]) -> str:
    """What the group has yet to read or commit of each partition ('' once caught up)."""
    addresses = [cluster.servers[b].address for b in cluster.live()]
    behind = []
    for partition, end in ends.items():
        cursor = channels.first_answer(addresses, fetch_cursor(partition))
        committed = "?" if cursor is None else cursor.offset
        unread = set(range(end + 1)) - reads.offsets(partition)
        if committed != end or unread:
            behind.append(f"{partition}: committed {committed} of {end}, {len(unread)} unread")
    return "; ".join(behind)


# -- the test --------------------------------------------------------------------------------------


def test_producers_of_every_kind_and_a_group_through_leader_and_coordinator_kills(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    channels = Channels()
    reads = GroupReads()
    killed: list[str] = []
    kill_times: list[float] = []
    with running_cluster(tmp_path, env=ENV) as cluster:
        cluster.create_stream(STREAM, replication_factor=3, min_isr=2, partitions=PARTITIONS)
        address = {b: cluster.servers[b].address for b in sorted(cluster.servers)}
        seeds = list(address.values())
        first_leader = cluster.partition(STREAM, 0).leader
        producers: list[Producer] = [
            IdempotentProducer(channels, address["b1"]),
            PlainProducer(channels, address["b2"]),
            LiftbridgeProducer(channels, seeds),
            StaleProducer(channels, address[first_leader]),
        ]
        members = [
            Member(channels, "m1", address["b1"], seeds, reads),
            Member(channels, "m2", address["b2"], seeds, reads),
        ]

        def trouble() -> str:
            """The first thread error, else ''."""
            named = [(p.kind, p.error) for p in producers] + [(m.name, m.error) for m in members]
            return next((f"{n}: {error_text(e)}" for n, e in named if e is not None), "")

        def until(
            predicate: Callable[[], T | None], timeout: float, what: str | Callable[[], str]
        ) -> T:
            """``predicate``'s first true answer within ``timeout``; a thread's error or the
            timeout fail the test with the brokers' last lines."""
            deadline = time.monotonic() + timeout
            while True:
                found = predicate()
                if found:
                    return found
                problem = trouble()
                if problem or time.monotonic() > deadline:
                    state = "; ".join(
                        f"{p.kind}: {len(p.ledger.acked)} acked, last error {p.ledger.last_error}"
                        for p in producers
                    )
                    raise AssertionError(
                        f"{problem or 'timed out'} waiting for "
                        f"{what() if callable(what) else what} "
                        f"(killed {killed}; {state})\n{cluster.logs(20)}"
                    )
                time.sleep(0.05)

        def live_leader() -> str | None:
            leader = cluster.partition(STREAM, 0).leader
            return leader if leader in cluster.live() else None

        def all_in_sync() -> bool:
            return not out_of_sync(channels, cluster)

        def every_producer_acks(since: float, count: int = 1) -> bool:
            return all(p.ledger.since(since) >= count for p in producers)

        try:
            for producer in producers:
                producer.start()
            for member in members:
                member.start()
            try:
                started = time.monotonic()
                until(lambda: every_producer_acks(started, 5), 30, "every producer's first acks")
                until(lambda: all(m.commits for m in members), 30, "both members' first commits")
                until(all_in_sync, SETTLE_S, "every ISR full before the faults")
                faults_from = time.monotonic()
                for _ in range(ROUNDS):
                    leader = until(live_leader, SETTLE_S, "a live leader of partition 0")
                    killed.append(leader)
                    cluster.kill(leader)
                    kill_times.append(time.monotonic())
                    time.sleep(DOWN_S)
                    restart(cluster, leader)
                    back = time.monotonic()
                    until(all_in_sync, SETTLE_S, f"{leader} back in every ISR")
                    until(partial(every_producer_acks, back), SETTLE_S, "every producer acking")
                coordinator = group_coordinator(channels, cluster)[0]
                assert coordinator in cluster.live(), coordinator
                cluster.kill(coordinator)
                time.sleep(DOWN_S)
                restart(cluster, coordinator)
                until(all_in_sync, SETTLE_S, f"coordinator {coordinator} back in every ISR")
                faults_to = time.monotonic()
                until(lambda: every_producer_acks(faults_to, 10), SETTLE_S, "acks after the faults")
                moved = group_coordinator(channels, cluster)
            finally:
                for producer in producers:
                    producer.stop.set()
                for producer in producers:
                    producer.join(20)
            producing_ended = time.monotonic()
            stuck = [p.kind for p in producers if p.is_alive()]
            assert not stuck, f"producers {stuck} did not stop\n{cluster.logs(20)}"
            assert not trouble(), f"{trouble()}\n{cluster.logs(20)}"

            ends = until(lambda: settled_ends(channels, cluster), SETTLE_S, "the replicas settled")
            until(
                lambda: not group_lag(channels, cluster, reads, ends),
                SETTLE_S,
                lambda: f"the group to catch up ({group_lag(channels, cluster, reads, ends)})",
            )
            caught_up_s = time.monotonic() - producing_ended
            for member in members:
                assert member.finish(10), f"member {member.name} did not stop"
            assert not trouble(), f"{trouble()}\n{cluster.logs(20)}"
            until(all_in_sync, SETTLE_S, "every ISR full before the stop")
            codes = {b: server.stop() for b, server in sorted(cluster.servers.items())}
            logs = cluster.logs(30)
            copies = {
                p: {b: stored_records(tmp_path / b, STREAM, p) for b in sorted(cluster.servers)}
                for p in range(PARTITIONS)
            }
        finally:  # a failed wait leaves no thread publishing or reading
            for producer in producers:
                producer.stop.set()
            for member in members:
                member.stop.set()
    channels.close()  # after the threads stopped

    assert all(code == 0 for code in codes.values()), f"exit codes {codes}\n{logs}"
    for partition, replicas in copies.items():
        first = replicas["b1"]
        for broker_id, records in replicas.items():
            if records != first:
                differ = next(
                    (i for i, (x, y) in enumerate(zip(first, records, strict=False)) if x != y),
                    min(len(first), len(records)),
                )
                raise AssertionError(
                    f"partition {partition}: {broker_id}'s replica differs from b1's at index "
                    f"{differ} ({len(records)} vs {len(first)} records: "
                    f"{records[differ : differ + 2]} vs {first[differ : differ + 2]})\n{logs}"
                )
    at = {(p, o): v for p, replicas in copies.items() for o, _, v in replicas["b1"]}
    stored_where: dict[bytes, list[tuple[int, int]]] = {}
    for place, value in at.items():
        stored_where.setdefault(value, []).append(place)
    sent = set().union(*(p.ledger.sent for p in producers))
    foreign = [v for v in stored_where if v not in sent]
    assert not foreign, f"stored but never sent: {foreign[:5]}"

    lost: dict[str, list[tuple[int, int, bytes, bytes | None]]] = {}
    duplicates: dict[str, int] = {}
    for producer in producers:
        ledger = producer.ledger
        lost[ledger.kind] = [
            (p, o, v, at.get((p, o))) for p, o, v in ledger.acked if at.get((p, o)) != v
        ]
        duplicates[ledger.kind] = sum(len(stored_where.get(v, ())) > 1 for v in ledger.sent)
    kinds = [p.kind for p in producers]
    following = [p.ledger for p in producers if p.kind in "abc"]
    lags: dict[str, list[float]] = {ledger.kind: [] for ledger in following}
    for killed_at in kill_times:
        earliest = min(ledger.failover(0, killed_at) for ledger in following)
        for ledger in following:  # none acked on partition 0 after the kill: inf
            lag = ledger.failover(0, killed_at) - earliest if earliest < math.inf else math.inf
            lags[ledger.kind].append(lag)
    summary = (
        f"jepsen: {time.monotonic() - began:.0f} s; acks "
        + " ".join(f"{k}={len(p.ledger.acked)}" for k, p in zip(kinds, producers, strict=True))
        + "; duplicates "
        + " ".join(f"{k}={duplicates[k]}" for k in kinds)
        + "; retries "
        + " ".join(f"{k}={p.ledger.retries}" for k, p in zip(kinds, producers, strict=True))
        + f" (a answered duplicate {producers[0].ledger.duplicates_answered})"
        + "; longest stall "
        + " ".join(
            f"{k}={p.ledger.longest_stall(faults_from, faults_to):.1f}s"
            for k, p in zip(kinds, producers, strict=True)
        )
        + "; partition-0 failover (worst) "
        + " ".join(
            f"{k}={max(p.ledger.failover(0, t) for t in kill_times):.1f}s"
            for k, p in zip(kinds, producers, strict=True)
        )
        + " (behind the first) "
        + " ".join(f"{k}={max(lag):.1f}s" for k, lag in lags.items())
        + f"; partition-0 leaders killed {killed}, coordinator killed {coordinator} "
        f"(then {moved[0]}, epoch {moved[1]}); group read {reads.count()} "
        f"(joins {sum(m.joins for m in members)}, reports {sum(m.reports for m in members)}, "
        f"windows {sum(m.windows for m in members)}, "
        f"failed {sum(sum(m.read_errors.values()) for m in members)}, "
        f"commits {sum(m.commits for m in members)}), caught up {caught_up_s:.1f} s after "
        f"the producers stopped; lost {sum(len(v) for v in lost.values())}"
    )
    with capsys.disabled():
        print(f"\n{summary}")

    assert not any(lost.values()), (
        "acknowledged, then not stored where the ack said (partition, offset, value, stored): "
        + "; ".join(f"{k}: {len(v)} {v[:5]}" for k, v in lost.items() if v)
        + f"\n{summary}\n{logs}"
    )
    assert duplicates["a"] == 0, f"idempotent values stored twice\n{summary}\n{logs}"
    assert not reads.anomalies, f"group reads: {reads.anomalies[:10]}\n{summary}\n{logs}"
    misread = [
        (p, o, v, at.get((p, o)))
        for p, values in reads.values.items()
        for o, v in values.items()
        if at.get((p, o)) != v
    ]
    assert not misread, f"read by the group, not in the log: {misread[:10]}\n{summary}\n{logs}"
    assert len(set(killed)) >= 2, f"the same leader every round: {killed}"
    late = {k: [round(x, 1) for x in lag] for k, lag in lags.items() if max(lag) > FOLLOW_S}
    errors = {p.kind: dict(p.ledger.errors) for p in producers}
    assert not late, (
        f"producers that kept publishing to a killed leader (seconds behind the first producer "
        f"to ack on partition 0, per round): {late}; their errors {errors}\n{summary}"
    )
