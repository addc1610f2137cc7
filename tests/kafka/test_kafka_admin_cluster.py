"""The Kafka admin apis on a cluster of three brokers (real processes, one etcd): a topic created
through one broker's Kafka listener is replicated as asked, every broker describes its configs
(those holding no replica from the cluster's record), and a delete through another broker
removes it everywhere."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tests.cluster.clustertools import FAST, Cluster, wait_for
from tests.kafka.kadmin_support import (
    KafkaWire,
    creatable,
    create_request,
    describe_request,
    schema,
)
from tests.support.etcd import running_etcd

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.process import ServerProcess, free_port


class KafkaCluster(Cluster):
    """:class:`Cluster` whose brokers also listen for Kafka clients."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root, url, FAST)
        self.kafka_ports: dict[str, int] = {}

    def start(self, broker_id: str) -> ServerProcess:
        port = self.kafka_ports.setdefault(broker_id, free_port())
        server = ServerProcess(
            self.root / broker_id,
            "--cluster",
            self.url,
            "--broker-id",
            broker_id,
            "--kafka-port",
            str(port),
            env=self.env,
        ).start()
        self.servers[broker_id] = server
        return server


def described(port: int, topic: str) -> dict[str, str] | None:
    with KafkaWire(port) as kafka:
        (result,) = kafka.call(describe_request((2, topic, None))).results
    if result.error_code != ErrorCode.none:
        return None
    return {c.name: c.value for c in result.configs}


@pytest.mark.slow
def test_a_topic_is_created_described_and_deleted_through_any_broker(tmp_path: Path) -> None:
    with running_etcd(tmp_path / "etcd") as url:
        cluster = KafkaCluster(tmp_path, url)
        try:
            for name in ("b1", "b2", "b3"):
                cluster.start(name)
            wait_for(
                lambda: all(
                    len(cluster.api(b).FetchMetadata(pb.FetchMetadataRequest()).brokers) == 3
                    for b in cluster.servers
                ),
                what="three brokers in every broker's metadata",
            )
            with KafkaWire(cluster.kafka_ports["b1"]) as kafka:
                answer = kafka.call(
                    create_request(
                        creatable("wide", factor=4),
                        creatable(
                            "spread",
                            partitions=1,
                            factor=2,
                            configs={"min.insync.replicas": "2", "retention.ms": "120000"},
                        ),
                    )
                )
            wide, spread = answer.topics
            assert wide.error_code == ErrorCode.invalid_replication_factor
            assert "use 1 to 3" in (wide.error_message or "")
            assert (spread.error_code, spread.replication_factor) == (ErrorCode.none, 2)
            assert {c.name: c.value for c in spread.configs}["min.insync.replicas"] == "2"
            replicas = set(cluster.partition("spread").replicas)
            assert len(replicas) == 2
            (outsider,) = set(cluster.servers) - replicas  # describes it from the record alone
            assert not (cluster.servers[outsider].data_dir / "streams" / "spread").exists()
            for broker, port in cluster.kafka_ports.items():
                configs = wait_for(lambda port=port: described(port, "spread"), what=broker)
                assert configs["min.insync.replicas"] == "2", broker
                assert configs["retention.ms"] == "120000", broker
            with KafkaWire(cluster.kafka_ports["b3"]) as kafka:
                module = schema(20, 5)
                deleted = kafka.call(
                    module.DeleteTopicsRequest(
                        topic_names=("spread",), timeout=timedelta(seconds=10)
                    )
                )
            assert deleted.responses[0].error_code == ErrorCode.none
            wait_for(
                lambda: described(cluster.kafka_ports["b1"], "spread") is None,
                what="the delete seen by b1",
            )
        finally:
            cluster.close()
