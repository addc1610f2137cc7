"""The Kafka front in a cluster: etcd and tidelog brokers as processes on loopback, each with a
Kafka listener on a port of its own (kept across restarts), driven by raw Kafka requests (kio's
classes, the ones the front itself decodes with) and by librdkafka (confluent-kafka).

- Metadata, asked of any broker, lists every live broker that runs a Kafka listener with its
  Kafka port, and each partition's leader, leader epoch, replicas and ISR as the cluster has them;
  a broker without a listener is left out, and a partition it leads answers
  ``LEADER_NOT_AVAILABLE``. The list follows membership: a killed broker leaves it once its
  lease expires and comes back with its restart.
- Produce, Fetch and ListOffsets sent to a follower answer ``NOT_LEADER_OR_FOLLOWER`` (an
  idempotent batch too, before its sequence is looked at), and a librdkafka producer that only
  knows a follower finds the leader by itself.
- Jepsen-style: an idempotent librdkafka producer (acks=all) sends unique values to a partition
  with three replicas while its leader is killed with SIGKILL and restarted, round after round.
  Judged on the brokers' logs once the replicas are settled and the brokers stopped: no
  acknowledged value missing (or stored at another offset than its ack named), none stored
  twice, the three replicas identical, and a Kafka consumer reads back exactly the leader's log.

Idempotence needs ``InitProducerId`` (api 22) from the listener.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch_request
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.list_offsets.v5 import request as offsets_request
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.schema.metadata.v7 import request as metadata_request
from kio.schema.metadata.v7.response import MetadataResponse
from kio.schema.produce.v7 import request as produce_request
from kio.schema.produce.v7.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from tests.cluster.clustertools import FAST, Cluster, copies_of, stop_all, wait_for
from tests.support.etcd import running_etcd

from tidelog.client import Client
from tidelog.process import ServerProcess, free_port

pytestmark = pytest.mark.slow  # etcd and three or four brokers on loopback

BROKERS = ("1", "2", "3")
"""Numeric broker ids: their Kafka node ids are the same numbers."""
ROUNDS = 3
DOWN_S = 3.0
"""How long a killed leader stays down: past its lease (2 s), so another is elected."""
SETTLE_S = 40.0


# -- the cluster -----------------------------------------------------------------------------------


class KafkaCluster(Cluster):
    """:class:`Cluster` whose brokers run a Kafka listener, each on a port of its own kept
    across restarts (``kafka_ports``); a broker named in ``without_kafka`` runs none."""

    def __init__(self, root: Path, url: str, env: dict[str, str]) -> None:
        super().__init__(root, url, env)
        self.kafka_ports: dict[str, int] = {}
        self.without_kafka: set[str] = set()

    def start(self, broker_id: str) -> ServerProcess:
        args = ["--cluster", self.url, "--broker-id", broker_id]
        if broker_id not in self.without_kafka:
            port = self.kafka_ports.setdefault(broker_id, free_port())
            args += ["--kafka-port", str(port)]
        server = ServerProcess(self.root / broker_id, *args, env=self.env).start()
        self.servers[broker_id] = server
        return server

    def bootstrap(self, *brokers: str) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_ports[b]}" for b in brokers or self.kafka_ports)

    def status(self, stream: str) -> Any:
        """The stream's partitions as the cluster status of the first live broker has them."""
        for broker_id in self.live():
            with contextlib.suppress(Exception), Client(self.servers[broker_id].address) as c:
                return c.cluster_status(stream)
        raise AssertionError("no live broker answers the cluster status")


@contextlib.contextmanager
def kafka_cluster(root: Path, env: dict[str, str] | None = None) -> Iterator[KafkaCluster]:
    """etcd and :data:`BROKERS` (more may be started), killed by PID at the end."""
    with running_etcd(root / "etcd") as url:
        cluster = KafkaCluster(root, url, {**FAST, **(env or {})})
        try:
            for broker_id in BROKERS:
                cluster.start(broker_id)
            yield cluster
        finally:
            cluster.close()


# -- raw Kafka requests ----------------------------------------------------------------------------


def call(port: int, body: Any, response: type[Any]) -> Any:
    """Send one request (a kio request of a version with header v1) to the Kafka listener on
    ``port``; its decoded response."""
    out = io.BytesIO()
    header = RequestHeader(
        request_api_key=body.__api_key__,
        request_api_version=body.__version__,
        correlation_id=7,
        client_id="kafka-cluster-test",
    )
    entity_writer(RequestHeader)(out, header)
    entity_writer(type(body))(out, body)
    frame = out.getvalue()
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _exactly(sock, 4))[0]
        data = _exactly(sock, size)
    assert struct.unpack_from(">i", data)[0] == 7
    decoded, _ = entity_reader(response)(data, 4)
    return decoded


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        assert chunk, "the listener closed the connection"
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def metadata(port: int, *topics: str) -> Any:
    wanted = tuple(metadata_request.MetadataRequestTopic(name=t) for t in topics)
    return call(
        port,
        metadata_request.MetadataRequest(topics=wanted, allow_auto_topic_creation=False),
        MetadataResponse,
    )


def record_batch(values: list[bytes], producer_id: int = -1, sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, 0, sequence, 1 << 20)
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, now, None, value, [])
    return bytes(builder.build())


def produce(port: int, topic: str, partition: int, records: bytes) -> Any:
    """The partition's answer to a produce of ``records`` with acks=all."""
    data = produce_request.PartitionProduceData(index=partition, records=records)
    body = produce_request.ProduceRequest(
        acks=-1,
        timeout=timedelta(seconds=10),
        topic_data=(produce_request.TopicProduceData(name=topic, partition_data=(data,)),),
    )
    return call(port, body, ProduceResponse).responses[0].partition_responses[0]


def fetch(port: int, topic: str, partition: int) -> Any:
    wanted = fetch_request.FetchPartition(
        partition=partition, fetch_offset=0, partition_max_bytes=1 << 20
    )
    body = fetch_request.FetchRequest(
        max_wait=timedelta(milliseconds=10),
        min_bytes=0,
        topics=(fetch_request.FetchTopic(topic=topic, partitions=(wanted,)),),
        forgotten_topics_data=(),
    )
    return call(port, body, FetchResponse).responses[0].partitions[0]


def list_offsets(port: int, topic: str, partition: int) -> Any:
    wanted = offsets_request.ListOffsetsPartition(partition_index=partition, timestamp=-1)
    body = offsets_request.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(offsets_request.ListOffsetsTopic(name=topic, partitions=(wanted,)),),
    )
    return call(port, body, ListOffsetsResponse).topics[0].partitions[0]


def view(answer: Any) -> tuple[dict[int, tuple[str, int]], dict[int, Any]]:
    """(node id -> (host, port), partition index -> partition) of a Metadata answer's first
    topic."""
    brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
    return brokers, {p.partition_index: p for p in answer.topics[0].partitions}


# -- (a) brokers, leaders, refusals ----------------------------------------------------------------


def test_metadata_names_every_kafka_broker_and_leader_and_followers_refuse(
    tmp_path: Path,
) -> None:
    with kafka_cluster(tmp_path) as cluster:
        with Client(cluster.servers["1"].address) as client:
            client.create_stream("r", partitions=3, replication_factor=3, min_isr=2)
            # A fourth broker, without a Kafka listener; then four partitions on four brokers:
            # leaders spread one each, so one is led by the broker Kafka clients cannot reach.
            cluster.without_kafka.add("4")
            cluster.start("4")
            wait_for(lambda: len(client.cluster_status().brokers) == 4, SETTLE_S, "broker 4")
            client.create_stream("m", partitions=4, replication_factor=1)
        ports = {int(b): ("127.0.0.1", cluster.kafka_ports[b]) for b in BROKERS}

        def settled(stream: str, count: int) -> Any:
            status = cluster.status(stream)
            parts = {p.partition: p for p in status.partitions}
            ready = len(parts) == count and all(
                p.leader and len(p.isr) == len(p.replicas) for p in parts.values()
            )
            return parts if ready else None

        r_status = wait_for(lambda: settled("r", 3), SETTLE_S, "stream r settled")
        m_status = wait_for(lambda: settled("m", 4), SETTLE_S, "stream m settled")
        assert {p.leader for p in m_status.values()} == {*BROKERS, "4"}, m_status
        for broker_id in BROKERS:  # any broker answers alike
            port = cluster.kafka_ports[broker_id]
            brokers, partitions = view(metadata(port, "r"))
            assert brokers == ports, f"broker {broker_id} lists {brokers}"
            for number, state in r_status.items():
                p = partitions[number]
                assert p.error_code == ErrorCode.none
                assert p.leader_id == int(state.leader)
                assert p.leader_epoch == state.leader_epoch
                assert sorted(p.replica_nodes) == [1, 2, 3] == sorted(map(int, state.replicas))
                assert sorted(p.isr_nodes) == [1, 2, 3]
                assert p.offline_replicas == ()
            _, partitions = view(metadata(port, "m"))
            for number, state in m_status.items():
                p = partitions[number]
                if state.leader == "4":  # its leader cannot be reached over Kafka
                    assert p.error_code == ErrorCode.leader_not_available
                    assert p.leader_id == -1
                else:
                    assert (p.error_code, p.leader_id) == (ErrorCode.none, int(state.leader))

        # Followers refuse; the leader takes it.
        leader = r_status[0].leader
        follower = next(b for b in BROKERS if b != leader)
        at_follower = cluster.kafka_ports[follower]
        refused = produce(at_follower, "r", 0, record_batch([b"x"]))
        assert refused.error_code == ErrorCode.not_leader_or_follower, refused
        # An idempotent batch too, before its sequence is compared with the follower's table
        # (which knows no such producer: that would have been UNKNOWN_PRODUCER_ID).
        refused = produce(at_follower, "r", 0, record_batch([b"x"], 1234, 7))
        assert refused.error_code == ErrorCode.not_leader_or_follower, refused
        assert fetch(at_follower, "r", 0).error_code == ErrorCode.not_leader_or_follower
        assert list_offsets(at_follower, "r", 0).error_code == ErrorCode.not_leader_or_follower
        taken = produce(cluster.kafka_ports[leader], "r", 0, record_batch([b"a", b"b"]))
        assert (taken.error_code, taken.base_offset) == (ErrorCode.none, 0), taken

        # librdkafka told only of a follower finds the leader.
        delivered: list[Any] = []
        producer = Producer({"bootstrap.servers": cluster.bootstrap(follower), "acks": "all"})
        producer.produce("r", b"c", partition=0, on_delivery=lambda e, m: delivered.append((e, m)))
        assert producer.flush(20) == 0
        [(error, message)] = delivered
        assert error is None and message.offset() == 2

        # Membership: a killed broker leaves every broker's list once its lease is gone, and
        # comes back (same Kafka port) with its restart; the partitions it led move.
        asked = cluster.kafka_ports[follower]
        cluster.kill(leader)
        wait_for(lambda: int(leader) not in view(metadata(asked, "r"))[0], SETTLE_S, "leader gone")

        def moved() -> bool:
            partition = view(metadata(asked, "r"))[1][0]
            return partition.leader_id not in (-1, int(leader)) and partition.offline_replicas == (
                int(leader),
            )

        wait_for(moved, SETTLE_S, "a new leader, the old one offline")
        cluster.start(leader)
        wait_for(lambda: view(metadata(asked, "r"))[0] == ports, SETTLE_S, "the broker back")
        new = view(metadata(asked, "r"))[1][0]
        assert new.leader_epoch > r_status[0].leader_epoch


# -- (b) an idempotent producer through leader kills -----------------------------------------------


class Sender(threading.Thread):
    """An idempotent librdkafka producer (acks=all) sending unique values to partition 0, one
    every few milliseconds, until told to stop or ``limit`` are sent; every delivery report is
    kept: the acked values with their offsets, the failed ones with their error."""

    def __init__(self, bootstrap: str, topic: str, limit: int) -> None:
        super().__init__(name="kafka-sender", daemon=True)
        self.topic = topic
        self.limit = limit
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.max.ms": 500,
                "topic.metadata.refresh.interval.ms": 2_000,
            }
        )
        self.sent = 0
        self.acked: dict[bytes, int] = {}
        self.failed: dict[bytes, str] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def _report(self, error: KafkaError | None, message: Any) -> None:
        with self.lock:
            if error is None:
                self.acked[message.value()] = message.offset()
            else:
                self.failed[message.value()] = str(error)

    def acks(self) -> int:
        with self.lock:
            return len(self.acked)

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.sent < self.limit:
                value = b"v-%06d" % self.sent
                self.producer.produce(self.topic, value, partition=0, on_delivery=self._report)
                self.sent += 1
                if self.sent % 20 == 0:
                    self.producer.poll(0.02)  # bursts: several batches in flight at a kill
        except BaseException as error:  # reported by the test
            self.error = error

    def wait_acked(self, more: int, timeout: float = SETTLE_S) -> None:
        target = self.acks() + more
        wait_for(lambda: self.acks() >= target or self.error, timeout, f"{more} more acks")
        assert self.error is None, self.error


def test_an_idempotent_producer_loses_and_duplicates_nothing_through_leader_kills(
    tmp_path: Path,
) -> None:
    # Followers append each fetch 20 ms late: the leader is always ahead of them, so batches
    # are in flight, stored on the leader alone, when it is killed (as test_failover.py).
    with kafka_cluster(tmp_path, {"TIDELOG_TEST_REPLICA_FETCH_DELAY_S": "0.02"}) as cluster:
        with Client(cluster.servers["1"].address) as client:
            client.create_stream("j", replication_factor=3, min_isr=2)

        def leader() -> str | None:
            found = cluster.partition("j").leader
            return found if found and cluster.alive(found) else None

        sender = Sender(cluster.bootstrap(), "j", limit=40_000)
        sender.start()
        killed = []
        try:
            sender.wait_acked(200)
            for _ in range(ROUNDS):
                victim = wait_for(leader, SETTLE_S, "a live leader")
                killed.append(victim)
                cluster.kill(victim)
                time.sleep(DOWN_S)
                cluster.start(victim)
                sender.wait_acked(200)  # a new leader acknowledges with acks=all
                wait_for(lambda: len(cluster.partition("j").isr) == 3, SETTLE_S, "the ISR whole")
                sender.wait_acked(100)
        finally:
            sender.stop.set()
            sender.join(30)
        left = sender.producer.flush(90)
        assert sender.error is None, sender.error
        assert left == 0, f"{left} messages never reported"

        # Settled: every replica at the leader's log end.
        def settled() -> Any:
            [p] = cluster.status("j").partitions
            ends = {p.log_end, *(f.log_end for f in p.followers)}
            return p if len(p.isr) == 3 and len(ends) == 1 and p.log_end > 0 else None

        final = wait_for(settled, SETTLE_S, "the replicas settled")
        read = consume(cluster.bootstrap(), "j", final.log_end)
        stop_all(cluster)
        copies = copies_of(cluster, "j")

    logs = {b: [(offset, value) for offset, _, value in records] for b, records in copies.items()}
    differing = [b for b, log in logs.items() if log != logs[final.leader]]
    stored = logs[final.leader]
    position = {value: offset for offset, value in stored}
    counts = Counter(value for _, value in stored)
    duplicates = {v: n for v, n in counts.items() if n > 1}
    # librdkafka reports a retry answered DUPLICATE_SEQUENCE_NUMBER as delivered at offset -1
    # (stored before, where is not said): such a value need only be stored.
    missing = {
        v: o
        for v, o in sender.acked.items()
        if (position.get(v) != o if o >= 0 else v not in position)
    }
    unplaced = sum(1 for o in sender.acked.values() if o < 0)
    print(
        f"sent {sender.sent}, acked {len(sender.acked)}, failed {len(sender.failed)}, stored "
        f"{len(stored)} ({unplaced} acked without an offset); leaders killed in turn: {killed}; "
        f"acked but missing: {len(missing)}, "
        f"duplicates: {len(duplicates)}, replicas differing: {differing}"
    )
    assert not missing, f"acknowledged but not stored where the ack said: {list(missing)[:10]}"
    assert not duplicates, f"stored more than once: {list(duplicates.items())[:10]}"
    assert not differing, f"replicas differ from the leader's: {differing}"
    assert not sender.failed, f"delivery failed: {list(sender.failed.items())[:5]}"
    assert len(set(killed)) >= 2, killed
    assert read == stored, "a Kafka consumer read other records than the leader's log holds"


def consume(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of partition 0 below ``end``, read over Kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-cluster-test",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    read: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + SETTLE_S
        while (not read or read[-1][0] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            read.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return read
