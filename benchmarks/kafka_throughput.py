#!/usr/bin/env python3
"""The Kafka front's throughput, beside tidelog's own batched API, Redis Streams and Apache Kafka.

One run, the same N payloads of S bytes (default 1,000,000 x 100 B, distinct, from
``peers.make_payloads``) everywhere, each side on a fresh server it starts and stops by PID:

- **tidelog over Kafka's protocol** (``tidelog serve --kafka-port``): one ``confluent-kafka``
  producer (librdkafka) with ``acks=all``, ``linger.ms=5``, no compression, producing every
  payload to a one-partition topic and flushing (``produce_msgs_per_s``); then one consumer
  assigned the partition from offset 0, reading every message and summing the values' lengths
  (``consume_msgs_per_s``).
- **tidelog over its own API** on the same server: ``publish_batch`` in calls of 1,000 messages
  with ack ALL (``v1_publish_msgs_per_s``) and a catch-up through ``subscribe_batches``
  (``v1_catchup_msgs_per_s``): the paths ``benchmarks/e2e_throughput.py`` measures.
- **Redis Streams** (``peers.measure_redis``): XADD pipelined, XRANGE in chunks
  (``redis_xadd_msgs_per_s``, ``redis_xrange_msgs_per_s``).
- **Apache Kafka** itself (one KRaft node from Maven Central's jars, ``make kafka-dist``;
  ``tests/support/apache_kafka.py`` formats and starts it in a temporary directory): the same
  producer and consumer code (``apache_kafka_produce_msgs_per_s``,
  ``apache_kafka_consume_msgs_per_s``), hence ``produce_ratio_vs_kafka`` and
  ``consume_ratio_vs_kafka``.

Each client's own cost differs by protocol, so what compares the paths is the **server's CPU per
message** (user + system seconds of the server process over the phase, ``/proc``):
``produce_server_us_per_msg``, ``consume_server_us_per_msg``, ``v1_publish_server_us_per_msg``,
``v1_catchup_server_us_per_msg``. Targets (issue 26): produce >= 150,000 msgs/s, consume >= 300,000
msgs/s, server CPU per message within 1.5x of v1's for both, >= 0.5x Apache Kafka for both;
``targets`` reports each with ``met``. The load average before and after each phase is recorded:
a run on a loaded machine is not a measurement of the code.

Usage: ``python benchmarks/kafka_throughput.py [--messages N] [--size S] [--skip-redis]
[--skip-apache-kafka]``; prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from tests.support.apache_kafka import ApacheKafka  # noqa: E402
from tests.support.kafka_clients import create_topic  # noqa: E402
from tests.support.kafka_dist import KAFKA_VERSION  # noqa: E402

import e2e_throughput as e2e  # noqa: E402
import peers  # noqa: E402
from tidelog.client import AsyncClient  # noqa: E402
from tidelog.process import free_port  # noqa: E402

TOPIC = "bench-kafka"
PRODUCE_TIMEOUT_S = 600.0


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def _us_per_msg(cpu_s: float | None, count: int) -> float | None:
    return None if cpu_s is None or not count else round(cpu_s * 1e6 / count, 2)


def kafka_produce(bootstrap: str, topic: str, payloads: Sequence[bytes]) -> dict[str, Any]:
    """Every payload through one librdkafka producer (acks=all), flushed; every delivery
    report checked."""
    failed: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "enable.idempotence": False,
        }
    )
    produce = producer.produce
    poll = producer.poll
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        produce(topic, payload, on_delivery=delivered)
        if i % 10_000 == 0:
            poll(0)
    left = producer.flush(PRODUCE_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"kafka produce: {left} undelivered, {len(failed)} failed: {failed[:3]}")
    return {"count": len(payloads), "seconds": seconds}


def kafka_consume(bootstrap: str, topic: str, expected: int, size: int) -> dict[str, Any]:
    """Every message of partition 0 from offset 0 through one librdkafka consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.time_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.max.messages.kbytes": 1_048_576,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    count = nbytes = 0
    start = time.perf_counter()
    deadline = start + PRODUCE_TIMEOUT_S
    try:
        while count < expected and time.perf_counter() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error():
                    raise RuntimeError(f"kafka consume: {message.error()}")
                nbytes += len(message.value())
                count += 1
        seconds = time.perf_counter() - start
    finally:
        consumer.close()
    if count != expected or nbytes != expected * size:
        raise RuntimeError(f"kafka consume: {count} messages / {nbytes} B, expected {expected}")
    return {"count": count, "seconds": seconds}


def measured(
    name: str, details: dict[str, Any], cpu: Callable[[], float | None], work: Callable[[], Any]
) -> dict[str, Any]:
    """Run ``work``, recording its wall time, the server's CPU seconds and the load."""
    record: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    before = cpu()
    result = work()
    after = cpu()
    record.update(result)
    record["server_cpu_s"] = None if before is None or after is None else round(after - before, 3)
    record["loadavg_after"] = os.getloadavg()
    details[name] = record
    return record


def tidelog_phases(payloads: Sequence[bytes], details: dict[str, Any]) -> dict[str, Any]:
    size = len(payloads[0])
    n = len(payloads)
    kafka_port = free_port()
    out: dict[str, Any] = {}
    with e2e.TidelogServer("interval", "--kafka-port", str(kafka_port)) as server:
        bootstrap = f"127.0.0.1:{kafka_port}"

        async def create(name: str) -> None:
            async with AsyncClient(server.address) as c:
                await c.create_stream(name, partitions=1)

        asyncio.run(create(TOPIC))
        produce = measured(
            "kafka_produce", details, server.cpu_seconds,
            lambda: kafka_produce(bootstrap, TOPIC, payloads),
        )  # fmt: skip
        consume = measured(
            "kafka_consume", details, server.cpu_seconds,
            lambda: kafka_consume(bootstrap, TOPIC, n, size),
        )  # fmt: skip

        async def v1_publish() -> dict[str, Any]:
            async with AsyncClient(server.address) as c:
                await c.create_stream("bench-v1", partitions=1)
                return await e2e.publish_batch_phase(c, "bench-v1", payloads, PRODUCE_TIMEOUT_S)

        async def v1_catchup() -> dict[str, Any]:
            async with AsyncClient(server.address) as c:
                return await e2e.subscribe_phase(
                    c, "bench-v1", payloads, n, PRODUCE_TIMEOUT_S, reverse=False
                )

        publish = measured(
            "v1_publish", details, server.cpu_seconds, lambda: asyncio.run(v1_publish())
        )
        catchup = measured(
            "v1_catchup", details, server.cpu_seconds, lambda: asyncio.run(v1_catchup())
        )
    out["produce_msgs_per_s"] = _rate(produce["count"], produce["seconds"])
    out["consume_msgs_per_s"] = _rate(consume["count"], consume["seconds"])
    out["produce_server_us_per_msg"] = _us_per_msg(produce["server_cpu_s"], n)
    out["consume_server_us_per_msg"] = _us_per_msg(consume["server_cpu_s"], n)
    out["v1_publish_msgs_per_s"] = _rate(publish["count"], publish["seconds"])
    out["v1_catchup_msgs_per_s"] = _rate(catchup["count"], catchup["seconds"])
    out["v1_publish_server_us_per_msg"] = _us_per_msg(publish["server_cpu_s"], n)
    out["v1_catchup_server_us_per_msg"] = _us_per_msg(catchup["server_cpu_s"], n)
    return out


def apache_kafka_phases(payloads: Sequence[bytes], details: dict[str, Any]) -> dict[str, Any]:
    n, size = len(payloads), len(payloads[0])
    directory = Path(tempfile.mkdtemp(prefix="bench-apache-kafka-"))
    node = ApacheKafka(directory)
    node.start()
    try:

        def cpu() -> float | None:
            return e2e.process_cpu_seconds(node.pid)

        create_topic(node.bootstrap, TOPIC, partitions=1)
        produce = measured(
            "apache_kafka_produce", details, cpu,
            lambda: kafka_produce(node.bootstrap, TOPIC, payloads),
        )  # fmt: skip
        consume = measured(
            "apache_kafka_consume", details, cpu,
            lambda: kafka_consume(node.bootstrap, TOPIC, n, size),
        )  # fmt: skip
    finally:
        node.stop()
    return {
        "apache_kafka_version": KAFKA_VERSION,
        "apache_kafka_produce_msgs_per_s": _rate(produce["count"], produce["seconds"]),
        "apache_kafka_consume_msgs_per_s": _rate(consume["count"], consume["seconds"]),
        "apache_kafka_produce_server_us_per_msg": _us_per_msg(produce["server_cpu_s"], n),
        "apache_kafka_consume_server_us_per_msg": _us_per_msg(consume["server_cpu_s"], n),
    }


def _target(value: float | None, threshold: float, *, at_most: bool = False) -> dict[str, Any]:
    met = value is not None and (value <= threshold if at_most else value >= threshold)
    return {"value": value, "target": threshold, "met": met}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--skip-apache-kafka", action="store_true")
    args = parser.parse_args(argv)
    payloads = peers.make_payloads(args.messages, args.size)
    gc.freeze()
    details: dict[str, Any] = {}
    result: dict[str, Any] = {"messages": args.messages, "size": args.size}
    result["loadavg_start"] = os.getloadavg()
    result.update(tidelog_phases(payloads, details))
    if not args.skip_redis:
        redis = peers.measure_redis(payloads, c_client=False)
        result["redis_xadd_msgs_per_s"] = redis["publish_msgs_per_s"]
        result["redis_xrange_msgs_per_s"] = redis["read_msgs_per_s"]
    if not args.skip_apache_kafka:
        result.update(apache_kafka_phases(payloads, details))
    result["produce_ratio_vs_kafka"] = _ratio(
        result["produce_msgs_per_s"], result.get("apache_kafka_produce_msgs_per_s")
    )
    result["consume_ratio_vs_kafka"] = _ratio(
        result["consume_msgs_per_s"], result.get("apache_kafka_consume_msgs_per_s")
    )
    result["targets"] = {
        "produce_msgs_per_s": _target(result["produce_msgs_per_s"], 150_000),
        "consume_msgs_per_s": _target(result["consume_msgs_per_s"], 300_000),
        "produce_server_cpu_vs_v1": _target(
            _ratio(result["produce_server_us_per_msg"], result["v1_publish_server_us_per_msg"]),
            1.5,
            at_most=True,
        ),
        "consume_server_cpu_vs_v1": _target(
            _ratio(result["consume_server_us_per_msg"], result["v1_catchup_server_us_per_msg"]),
            1.5,
            at_most=True,
        ),
        "produce_ratio_vs_kafka": _target(result["produce_ratio_vs_kafka"], 0.5),
        "consume_ratio_vs_kafka": _target(result["consume_ratio_vs_kafka"], 0.5),
    }
    result["loadavg_end"] = os.getloadavg()
    result["details"] = details
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
