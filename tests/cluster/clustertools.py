"""A cluster for tests: one etcd and several ``tidelog serve --cluster`` processes on loopback
(free ports), each killed by PID when the block ends; and the reading of a stopped broker's
partition log for comparing replicas byte for byte."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tests.support.etcd import running_etcd

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.log import LogConfig, SegmentedLog
from tidelog.process import ServerProcess

T = TypeVar("T")

FAST = {
    # Short enough for failover tests; the defaults are for production.
    "TIDELOG_CLUSTER_LEASE_TTL_S": "2",
    "TIDELOG_REPLICA_LAG_MAX_S": "2",
    "TIDELOG_CLUSTER_ACK_TIMEOUT_S": "3",
}


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = predicate()
        except grpc.RpcError:
            found = None  # type: ignore[assignment]
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)


class Cluster:
    def __init__(self, root: Path, url: str, env: dict[str, str]) -> None:
        self.root = root
        self.url = url
        self.env = env
        self.servers: dict[str, ServerProcess] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._answered = ""

    def start(self, broker_id: str) -> ServerProcess:
        server = ServerProcess(
            self.root / broker_id,
            "--cluster",
            self.url,
            "--broker-id",
            broker_id,
            env=self.env,
        ).start()
        self.servers[broker_id] = server
        return server

    def alive(self, broker_id: str) -> bool:
        server = self.servers.get(broker_id)
        return bool(server and server.process and server.process.poll() is None)

    def kill(self, broker_id: str) -> None:
        self.servers[broker_id].kill()

    def channel(self, broker_id: str) -> grpc.Channel:
        address = self.servers[broker_id].address
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.insecure_channel(address)
        return channel

    def api(self, broker_id: str) -> Any:
        return pb_grpc.APIStub(self.channel(broker_id))

    def v1(self, broker_id: str) -> Any:
        return v1_grpc.TidelogStub(self.channel(broker_id))

    def live(self) -> list[str]:
        return [b for b in self.servers if self.alive(b)]

    def metadata(self, stream: str) -> pb.StreamMetadata:
        """The stream's metadata as the first live broker that answers sees it."""
        live = self.live()
        # The one that answered last first: a paused broker would hold every call for 1 s.
        for broker_id in sorted(live, key=lambda b: b != self._answered):
            with contextlib.suppress(grpc.RpcError):
                answer = self.api(broker_id).FetchMetadata(
                    pb.FetchMetadataRequest(streams=[stream]), timeout=1
                )
                self._answered = broker_id
                return answer.streamMetadata[0]
        raise AssertionError("no live broker answers")

    def partition(self, stream: str, number: int = 0) -> pb.PartitionMetadata:
        return self.metadata(stream).partitions[number]

    def create_stream(
        self, name: str, *, replication_factor: int = 3, min_isr: int = 2, partitions: int = 1
    ) -> None:
        request = pb.CreateStreamRequest(
            name=name,
            subject=name,
            replicationFactor=replication_factor,
            partitions=partitions,
        )
        request.minIsr.value = min_isr
        self.api(self.live()[0]).CreateStream(request, timeout=20)

    def logs(self, lines: int = 40) -> str:
        """The newest lines each broker wrote, for a failure's message."""
        return "\n".join(
            f"--- {broker_id}:\n" + "".join(server.stderr_lines[-lines:])
            for broker_id, server in sorted(self.servers.items())
        )

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        for server in self.servers.values():
            server.kill()


@contextlib.contextmanager
def running_cluster(
    root: Path, brokers: int = 3, env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    with running_etcd(root / "etcd") as url:
        cluster = Cluster(root, url, {**FAST, **(env or {})})
        try:
            for n in range(1, brokers + 1):
                cluster.start(f"b{n}")
            yield cluster
        finally:
            cluster.close()


def publish_batch(
    stub: Any, stream: str, values: list[bytes], producer: str, sequence: int, timeout: float = 10
) -> v1.PublishBatchResponse:
    sizes = b"".join(len(v).to_bytes(4, "little") for v in values)
    return stub.PublishBatch(
        v1.PublishBatchRequest(
            stream=stream,
            partition=0,
            messages=v1.Messages(values=b"".join(values), value_sizes=sizes),
            ack_policy=v1.ACK_POLICY_ALL,
            expected_offset=-1,
            producer_id=producer,
            producer_sequence=sequence,
        ),
        timeout=timeout,
    )


def stored_records(data_dir: Path, stream: str, number: int = 0) -> list[tuple[int, int, bytes]]:
    """(offset, timestamp, value) of every record of a stopped broker's replica."""
    log = SegmentedLog(data_dir / "streams" / stream / str(number), LogConfig())
    try:
        return [
            (r.offset, r.timestamp, r.value)
            for batch in log.forward_reader(0, past_limit=True)
            for r in batch.records()
        ]
    finally:
        log.close()


def stop_all(cluster: Cluster) -> None:
    """A second for the last fetches to land, then every broker stopped gracefully (SIGTERM);
    each must exit 0. The replicas can then be read (:func:`copies_of`)."""
    time.sleep(1.0)
    for broker_id, server in cluster.servers.items():
        code = server.stop()
        assert code == 0, f"{broker_id} exited {code}: {''.join(server.stderr_lines[-30:])}"


def copies_of(cluster: Cluster, stream: str, number: int = 0) -> dict[str, list[Any]]:
    """Each stopped broker's replica of ``stream``/``number`` (:func:`stored_records`)."""
    return {b: stored_records(cluster.root / b, stream, number) for b in cluster.servers}


RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    # A broker shutting down cancels the calls it accepted but had not started (gRPC core
    # answers those CANCELLED); tidelog.Client retries them too (client/retry.py).
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.NOT_FOUND,
}


class Producer(threading.Thread):
    """Publishes batches of 5 values with a producer id, ack ALL, to whichever broker leads;
    a failed batch is sent again with the same sequence until it is acknowledged."""

    def __init__(self, cluster: Cluster, stream: str) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stream = stream
        self.acked: dict[int, range] = {}
        """sequence -> offsets acknowledged."""
        self.values: dict[int, list[bytes]] = {}
        self.stop = threading.Event()
        self.failures = 0
        self.error: BaseException | None = None

    def leader(self) -> str | None:
        leader = self.cluster.partition(self.stream).leader
        return leader if self.cluster.alive(leader) else None

    def run(self) -> None:
        try:
            sequence = 0
            while not self.stop.is_set():
                values = [b"m-%d-%d" % (sequence, i) for i in range(5)]
                self.values[sequence] = values
                while not self.stop.is_set():
                    leader = self.leader()
                    if leader is None:
                        time.sleep(0.05)
                        continue
                    try:
                        answer = publish_batch(
                            self.cluster.v1(leader), self.stream, values, "p", sequence, 5
                        )
                    except grpc.RpcError as error:
                        assert error.code() in RETRYABLE, error
                        self.failures += 1
                        time.sleep(0.05)
                        continue
                    self.acked[sequence] = range(
                        answer.first_offset, answer.first_offset + answer.count
                    )
                    break
                sequence += 1
        except BaseException as error:  # reported by the test
            self.error = error

    def wait_acked(self, more: int, timeout: float = 30.0) -> None:
        target = len(self.acked) + more
        wait_for(lambda: len(self.acked) >= target or self.error, timeout, "acks")
        assert self.error is None, f"{self.error}\n{self.cluster.logs()}"
