"""One Kafka group consumer in its own process, for the group tests (a process so a test can
kill -9 it). It prints one JSON line per event on stdout:

- ``{"event": "assigned", "partitions": [...]}`` whenever its assignment changes;
- ``{"event": "got", "p": P, "o": O, "v": "..."}`` for each message, then
- ``{"event": "committed", "p": P, "o": O + 1}`` once the synchronous commit of it returned
  (``commit-failed`` with the error when it did not: a rebalance under way, say).

Its client id is ``member-<its pid>``. It stops on SIGTERM, leaving the group (``closed``).
Usage::

    python kafka_group_member.py CLIENT BOOTSTRAP GROUP TOPIC ASSIGNOR [ASSIGNOR...]

with CLIENT one of ``confluent``, ``kafka-python``, ``aiokafka``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

SESSION_MS = 6000
HEARTBEAT_MS = 1000
stopping = False


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _stop(*_: object) -> None:
    global stopping
    stopping = True


def confluent(bootstrap: str, group: str, topic: str, assignors: list[str]) -> None:
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"member-{os.getpid()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "partition.assignment.strategy": ",".join(assignors),
        }
    )
    consumer.subscribe([topic])
    shown: list[int] | None = None
    while not stopping:
        message = consumer.poll(0.2)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != shown:
            shown = now
            say("assigned", partitions=now)
        if message is None or message.error():
            continue
        partition, offset = message.partition(), message.offset()
        say("got", p=partition, o=offset, v=(message.value() or b"").decode())
        try:
            consumer.commit(message=message, asynchronous=False)
            say("committed", p=partition, o=offset + 1)
        except KafkaException as error:
            say("commit-failed", p=partition, o=offset + 1, error=str(error))
    consumer.close()
    say("closed")


def kafka_python(bootstrap: str, group: str, topic: str, assignors: list[str]) -> None:
    from kafka.consumer.group import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    classes = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id=f"member-{os.getpid()}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        partition_assignment_strategy=[classes[name] for name in assignors],
    )
    shown: list[int] | None = None
    while not stopping:
        batches = consumer.poll(timeout_ms=200)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != shown:
            shown = now
            say("assigned", partitions=now)
        for tp, messages in batches.items():
            for message in messages:
                say("got", p=tp.partition, o=message.offset, v=message.value.decode())
                try:
                    position = OffsetAndMetadata(message.offset + 1, "", -1)
                    consumer.commit({TopicPartition(tp.topic, tp.partition): position})
                    say("committed", p=tp.partition, o=message.offset + 1)
                except KafkaError as error:
                    say("commit-failed", p=tp.partition, o=message.offset + 1, error=str(error))
    consumer.close()
    say("closed")


async def aiokafka(bootstrap: str, group: str, topic: str, assignors: list[str]) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.errors import KafkaError

    classes = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id=f"member-{os.getpid()}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        partition_assignment_strategy=tuple(classes[name] for name in assignors),
    )
    await consumer.start()
    shown: list[int] | None = None
    while not stopping:
        batches = await consumer.getmany(timeout_ms=200)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != shown:
            shown = now
            say("assigned", partitions=now)
        for tp, messages in batches.items():
            for message in messages:
                assert message.value is not None
                say("got", p=tp.partition, o=message.offset, v=message.value.decode())
                try:
                    await consumer.commit(
                        {TopicPartition(tp.topic, tp.partition): message.offset + 1}
                    )
                    say("committed", p=tp.partition, o=message.offset + 1)
                except KafkaError as error:
                    say("commit-failed", p=tp.partition, o=message.offset + 1, error=str(error))
    await consumer.stop()
    say("closed")


def main() -> None:
    client, bootstrap, group, topic, *assignors = sys.argv[1:]
    signal.signal(signal.SIGTERM, _stop)
    say("started")
    if client == "confluent":
        confluent(bootstrap, group, topic, assignors)
    elif client == "kafka-python":
        kafka_python(bootstrap, group, topic, assignors)
    else:
        asyncio.run(aiokafka(bootstrap, group, topic, assignors))


if __name__ == "__main__":
    main()
