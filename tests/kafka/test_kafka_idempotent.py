"""Idempotent Kafka producers on tidelog: InitProducerId, an idempotent confluent-kafka producer
whose messages arrive exactly once and in order, Produce requests replayed byte for byte, the
sequence and epoch rules (``produce.sequence_error``'s table, each row), and a producer id used by
a principal that does not own it."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from tests.kafka.kadmin_support import (
    KafkaWire,
    Principals,
    create_topic,
    init_producer_id,
    kafka_served,
    produce_request,
    record_batch,
    schema,
)

from tidelog.api.server import Server
from tidelog.kafka.produce import EPOCH_SHIFT, sequence_error
from tidelog.kafka.producer_ids import MAX_EPOCH, granted, random_producer_id

MESSAGES = 10_000


def served(tmp_path: Path, scenario: Any, **settings: Any) -> None:
    async def main() -> None:
        async with kafka_served(tmp_path / "data", **settings) as server:
            await scenario(server)

    asyncio.run(main())


def produced(answer: Any) -> Any:
    (topic,) = answer.responses
    (partition,) = topic.partition_responses
    return partition


def stored_values(server: Server, stream: str) -> list[bytes]:
    """Every value the partition holds, in offset order."""
    reader = server.broker.partition(stream, 0).log.forward_reader(0)
    values: list[bytes] = []
    while batch := reader.read(100_000, 1 << 24):
        values += batch.values()
    return values


# -- the pure rules -------------------------------------------------------------------------------


def stored(epoch: int, base: int, count: int) -> tuple[int, int]:
    return epoch << EPOCH_SHIFT | base, count


@pytest.mark.parametrize(
    ("latest", "epoch", "base", "expected"),
    [
        (None, 0, 0, None),  # unknown producer, first batch
        (None, 0, 5, ErrorCode.unknown_producer_id),  # its state is gone
        (stored(3, 10, 5), 2, 15, ErrorCode.invalid_producer_epoch),  # older epoch
        (stored(3, 10, 5), 4, 0, None),  # a new epoch starts at 0
        (stored(3, 10, 5), 4, 1, ErrorCode.out_of_order_sequence_number),
        (stored(3, 10, 5), 3, 10, None),  # the latest batch again: a retry
        (stored(3, 10, 5), 3, 4, ErrorCode.duplicate_sequence_number),  # an older batch
        (stored(3, 10, 5), 3, 15, None),  # the next batch
        (stored(3, 10, 5), 3, 16, ErrorCode.out_of_order_sequence_number),  # a gap
    ],
)
def test_sequence_error_follows_its_table(
    latest: tuple[int, int] | None, epoch: int, base: int, expected: ErrorCode | None
) -> None:
    assert sequence_error(latest, epoch, base) == expected


def test_producer_ids_are_random_and_epochs_are_bumped() -> None:
    assert random_producer_id(lambda n: b"\xff" * n) == 2**63 - 1
    assert random_producer_id(lambda n: b"\x00" * n) == 0
    assert len({random_producer_id() for _ in range(1000)}) == 1000
    fresh = iter(range(100, 200)).__next__
    assert granted(-1, -1, fresh) == (ErrorCode.none, 100, 0)
    assert granted(7, 0, fresh) == (ErrorCode.none, 7, 1)  # KIP-360: same id, next epoch
    assert granted(7, MAX_EPOCH, fresh) == (ErrorCode.none, 101, 0)  # epochs exhausted
    assert granted(7, -1, fresh)[0] == ErrorCode.invalid_request  # both or neither
    assert granted(-1, 3, fresh)[0] == ErrorCode.invalid_request


# -- a real idempotent producer -------------------------------------------------------------------


def test_an_idempotent_producer_delivers_each_message_once_in_order(tmp_path: Path) -> None:
    def produce_and_read(port: int) -> None:
        bootstrap = f"127.0.0.1:{port}"
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "batch.num.messages": 500,
            }
        )
        failures: list[Any] = []

        def delivered(error: Any, _: Any) -> None:
            if error is not None:
                failures.append(error)

        for n in range(MESSAGES):
            producer.produce("exactly", value=b"%d" % n, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(60) == 0
        assert failures == []
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("exactly", 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < MESSAGES and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                got.append(int(message.value()))
        consumer.close()
        assert got == list(range(MESSAGES))

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(produce_and_read, server.kafka_port)
        values = stored_values(server, "exactly")
        assert values == [b"%d" % n for n in range(MESSAGES)]  # stored once each
        table = server.broker.partition("exactly", 0).producers
        assert table is not None
        assert [name[: len("kafka:")] for name in table.entries] == ["kafka:"]

    served(tmp_path, scenario)


# -- replays, gaps and epochs, on the wire --------------------------------------------------------


def test_a_replayed_produce_is_stored_once_and_answered_alike(tmp_path: Path) -> None:
    def wire(port: int) -> None:
        with KafkaWire(port) as kafka:
            create_topic(kafka, "replayed")
            grant = kafka.call(init_producer_id())
            assert grant.error_code == ErrorCode.none and grant.producer_epoch == 0
            pid = grant.producer_id
            first = produce_request(
                "replayed",
                0,
                record_batch([b"a", b"b"], producer_id=pid, epoch=0, base_sequence=0),
            )
            frame = kafka.frame(first)
            kafka.send(frame)
            once = produced(kafka.receive(first))
            kafka.send(frame)  # the same bytes again (a retry after a lost answer)
            twice = produced(kafka.receive(first))
            assert once.error_code == twice.error_code == ErrorCode.none
            assert once.base_offset == twice.base_offset == 0

            def batch(base: int, epoch: int = 0, values: tuple[bytes, ...] = (b"x",)) -> Any:
                records = record_batch(
                    list(values), producer_id=pid, epoch=epoch, base_sequence=base
                )
                return produced(kafka.call(produce_request("replayed", 0, records)))

            assert batch(2, values=(b"c",)).base_offset == 2  # the next sequence
            gap = batch(5)
            assert gap.error_code == ErrorCode.out_of_order_sequence_number
            assert "does not follow" in (gap.error_message or "")
            assert batch(0).error_code == ErrorCode.duplicate_sequence_number

            bumped = kafka.call(init_producer_id(producer_id=pid, epoch=0))
            assert (bumped.producer_id, bumped.producer_epoch) == (pid, 1)
            assert batch(0, epoch=1, values=(b"d",)).base_offset == 3
            fenced = batch(3, epoch=0)
            assert fenced.error_code == ErrorCode.invalid_producer_epoch

            other = kafka.call(init_producer_id(version=0))
            assert other.error_code == ErrorCode.none and other.producer_id != pid

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert stored_values(server, "replayed") == [b"a", b"b", b"c", b"d"]

    served(tmp_path, scenario)


def test_transactional_ids_are_refused_with_a_fatal_code(tmp_path: Path) -> None:
    def wire(port: int) -> None:
        with KafkaWire(port) as kafka:
            for version in (0, 4):
                module = schema(22, version)
                fields: dict[str, Any] = {
                    "transactional_id": "tx-1",
                    "transaction_timeout": timedelta(seconds=60),
                }
                answer = kafka.call(module.InitProducerIdRequest(**fields))
                assert answer.error_code == ErrorCode.transactional_id_authorization_failed
                assert (answer.producer_id, answer.producer_epoch) == (-1, -1)

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)

    served(tmp_path, scenario)


# -- another principal ----------------------------------------------------------------------------

ACL = """
[[rule]]
effect = "allow"
principals = ["alice", "mallory"]
operations = ["publish", "subscribe", "create"]
resources = ["stream:shared"]
"""


def test_another_principal_cannot_produce_with_a_producer_id(tmp_path: Path) -> None:
    principals = Principals(tmp_path / "pki")
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    alice, mallory = principals.context("alice"), principals.context("mallory")

    def wire(port: int) -> None:
        with KafkaWire(port, alice) as owner, KafkaWire(port, mallory) as other:
            create_topic(owner, "shared")
            pid = owner.call(init_producer_id()).producer_id
            mine = record_batch([b"alice"], producer_id=pid, epoch=0, base_sequence=0)
            assert produced(owner.call(produce_request("shared", 0, mine))).base_offset == 0
            for base in (0, 1):  # her batch replayed, and the next one
                forged = record_batch([b"mallory"], producer_id=pid, epoch=0, base_sequence=base)
                refused = produced(other.call(produce_request("shared", 0, forged)))
                assert refused.error_code == ErrorCode.topic_authorization_failed
                assert "another principal" in (refused.error_message or "")
            # mallory's own id works; alice's next batch is unaffected
            theirs = other.call(init_producer_id()).producer_id
            own = record_batch([b"m"], producer_id=theirs, epoch=0, base_sequence=0)
            assert produced(other.call(produce_request("shared", 0, own))).base_offset == 1
            nxt = record_batch([b"alice2"], producer_id=pid, epoch=0, base_sequence=1)
            assert produced(owner.call(produce_request("shared", 0, nxt))).base_offset == 2

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert stored_values(server, "shared") == [b"alice", b"m", b"alice2"]

    served(tmp_path, scenario, **principals.settings(acl))
