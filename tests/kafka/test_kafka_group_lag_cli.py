"""A Kafka consumer group's commits, read back by the tidelog CLI as a cursor with its lag."""

from __future__ import annotations

import json
from pathlib import Path

import confluent_kafka
import pytest
from tests.cli.clitools import Cli
from tests.support.server import served

from tidelog.process import free_port

pytestmark = pytest.mark.slow


def test_cursor_lag_shows_a_kafka_groups_commits(tmp_path: Path) -> None:
    port = free_port()
    with served(tmp_path / "data", "--kafka-port", str(port)) as server:
        cli = Cli(server.address)
        assert cli("stream", "create", "lagged", "--partitions", "2").returncode == 0
        bootstrap = f"127.0.0.1:{port}"
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for i in range(10):
            producer.produce("lagged", b"value-%d" % i, partition=0)
        assert producer.flush(30) == 0
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "lagging",
                "enable.auto.commit": False,
            }
        )
        try:
            # Commit 4 of the 10 on partition 0 (Kafka's committed offset: the next to read).
            consumer.commit(
                offsets=[confluent_kafka.TopicPartition("lagged", 0, 4)], asynchronous=False
            )
        finally:
            consumer.close()
        done = cli("cursor", "lag", "__group:lagging", "lagged", "--json")
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(r["partition"], r["position"], r["newest"], r["lag"]) for r in rows] == [
            (0, 3, 9, 6),  # processed up to 3; 4..9 to go
            (1, -1, -1, None),  # nothing committed there
        ]
        table = cli("cursor", "lag", "__group:lagging", "lagged")
        assert "lag 6 on 1 of 2 partitions" in table.stdout
