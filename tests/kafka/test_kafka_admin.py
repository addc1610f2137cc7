"""The Kafka admin apis (CreateTopics, DeleteTopics, DescribeConfigs, DescribeCluster) through
confluent-kafka's, kafka-python's and aiokafka's admin clients against an in-process server;
what no client sends (repeated names, manual assignments, topic ids, other brokers' configs)
through raw requests; access under mutual TLS and an ACL; and LogAppendTime topics."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioTopic
from aiokafka.admin.config_resource import ConfigResource as AioResource
from aiokafka.admin.config_resource import ConfigResourceType as AioType
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KpResource
from kafka.admin import ConfigResourceType as KpType
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidConfigurationError, TopicAlreadyExistsError
from kio.schema.errors import ErrorCode
from tests.kafka.kadmin_support import (
    KafkaWire,
    Principals,
    creatable,
    create_request,
    describe_request,
    kafka_served,
    produce_request,
    record_batch,
    schema,
)
from tests.kafka.kafka_wire import fetch_request

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.api.server import Server
from tidelog.broker import StreamConfig
from tidelog.kafka import fetch
from tidelog.kafka.topic_configs import FOREVER_S, UNLIMITED


def served(
    tmp_path: Path, scenario: Callable[[Server], Coroutine[Any, Any, None]], **settings: Any
) -> None:
    async def main() -> None:
        async with kafka_served(tmp_path / "data", **settings) as server:
            await scenario(server)

    asyncio.run(main())


def outcome(future: Any) -> KafkaError | None:
    """The error an admin future failed with (None: it succeeded)."""
    try:
        future.result(timeout=20)
    except KafkaException as failure:
        error: KafkaError = failure.args[0]
        return error
    return None


# -- confluent-kafka ------------------------------------------------------------------------------


def test_confluent_admin_creates_describes_and_deletes_topics(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        await asyncio.to_thread(confluent_admin, server.kafka_port)
        assert server.broker.find_stream("orders") is None  # deleted
        changelog = server.broker.stream("changelog").config
        assert changelog.compact
        assert changelog.retention_age_s == FOREVER_S
        assert changelog.retention_bytes == UNLIMITED
        assert server.broker.find_stream("dry") is None  # validate_only created nothing

    def confluent_admin(port: int) -> None:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        created = admin.create_topics(
            [
                NewTopic(
                    "orders",
                    3,
                    1,
                    config={
                        "retention.ms": "3600000",
                        "retention.bytes": "1048576",
                        "segment.bytes": "1048576",
                        "max.message.bytes": "65536",
                    },
                ),
                NewTopic("changelog", -1, -1, config={"cleanup.policy": "compact"}),
                NewTopic("_schemas", 1, 1),
                NewTopic("__mine", 1, 1),
                NewTopic("wide", 1, 3),
                NewTopic("odd", 1, 1, config={"foo.bar": "1"}),
                NewTopic("tiny", 1, 1, config={"segment.bytes": "0"}),
                NewTopic("policy", 1, 1, config={"cleanup.policy": "shred"}),
            ],
            operation_timeout=20,
        )
        errors = {name: outcome(future) for name, future in created.items()}
        assert errors["orders"] is None and errors["changelog"] is None
        expected = {
            "_schemas": KafkaError.TOPIC_EXCEPTION,
            "__mine": KafkaError.TOPIC_EXCEPTION,
            "wide": KafkaError.INVALID_REPLICATION_FACTOR,
            "odd": KafkaError.INVALID_CONFIG,
            "tiny": KafkaError.INVALID_CONFIG,
            "policy": KafkaError.INVALID_CONFIG,
        }
        for name, code in expected.items():
            error = errors[name]
            assert error is not None and error.code() == code, (name, error)
        assert "foo.bar" in errors["odd"].str()  # type: ignore[union-attr]
        assert "segment.bytes" in errors["tiny"].str()  # type: ignore[union-attr]
        assert "use 1 to 1" in errors["wide"].str()  # type: ignore[union-attr]

        again = outcome(admin.create_topics([NewTopic("orders", 1, 1)])["orders"])
        assert again is not None and again.code() == KafkaError.TOPIC_ALREADY_EXISTS
        dry = admin.create_topics([NewTopic("dry", 2, 1)], validate_only=True)["dry"]
        assert outcome(dry) is None
        topics = admin.list_topics(timeout=10).topics
        assert len(topics["orders"].partitions) == 3
        assert "dry" not in topics

        cluster = admin.describe_cluster().result(timeout=10)
        assert cluster.cluster_id == "tidelog"
        assert [(n.host, n.port) for n in cluster.nodes] == [("127.0.0.1", port)]
        node = str(cluster.nodes[0].id)

        topic = ConfigResource(ResourceType.TOPIC, "orders")
        configs = admin.describe_configs([topic])[topic].result(timeout=10)
        values = {name: entry.value for name, entry in configs.items()}
        assert values == {
            "cleanup.policy": "delete",
            "retention.ms": "3600000",
            "retention.bytes": "1048576",
            "segment.bytes": "1048576",
            "segment.ms": "604800000",
            "max.message.bytes": "65536",
            "message.timestamp.type": "CreateTime",
            "min.insync.replicas": "1",
        }
        assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        assert configs["segment.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert all(entry.is_read_only for entry in configs.values())

        changelog = ConfigResource(ResourceType.TOPIC, "changelog")
        described = admin.describe_configs([changelog])[changelog].result(timeout=10)
        assert described["cleanup.policy"].value == "compact"
        assert described["retention.ms"].value == "-1"

        broker = ConfigResource(ResourceType.BROKER, node)
        settings = admin.describe_configs([broker])[broker].result(timeout=10)
        assert settings["message.max.bytes"].value == "1048576"
        assert settings["auto.create.topics.enable"].value == "true"
        assert settings["num.partitions"].value == "1"
        assert settings["log.retention.ms"].value == "604800000"

        missing = ConfigResource(ResourceType.TOPIC, "nope")
        unknown = outcome(admin.describe_configs([missing])[missing])
        assert unknown is not None and unknown.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

        deleted = admin.delete_topics(["orders", "nope"], operation_timeout=20)
        assert outcome(deleted["orders"]) is None
        gone = outcome(deleted["nope"])
        assert gone is not None and gone.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert "orders" not in admin.list_topics(timeout=10).topics

    served(tmp_path, scenario)


# -- kafka-python and aiokafka --------------------------------------------------------------------


def test_kafka_python_admin_creates_describes_and_deletes_topics(tmp_path: Path) -> None:
    def kafka_python(port: int) -> None:
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
        try:
            answer = admin.create_topics(
                {"kp": {"num_partitions": 2, "configs": {"retention.ms": "7200000"}}}
            )
            (created,) = answer["topics"]
            assert (created["error_code"], created["num_partitions"]) == (0, 2)
            assert created["configs"]["retention.ms"]["value"] == "7200000"
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics({"kp": {"num_partitions": 1}})
            with pytest.raises(InvalidConfigurationError, match=r"retention\.ms"):
                admin.create_topics({"kp2": {"configs": {"retention.ms": "soon"}}})
            described = admin.describe_configs(
                [KpResource(KpType.TOPIC, "kp")], config_filter="all"
            )
            configs = described["topic"]["kp"]
            assert configs["retention.ms"]["value"] == "7200000"
            assert configs["cleanup.policy"]["value"] == "delete"
            cluster = admin.describe_cluster()
            assert cluster["cluster_id"] == "tidelog"
            assert [b["port"] for b in cluster["brokers"]] == [port]
            deleted = admin.delete_topics(["kp"])
            assert [t["error_code"] for t in deleted["topics"]] == [0]
            assert "kp" not in admin.list_topics()
        finally:
            admin.close()

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(kafka_python, server.kafka_port)

    served(tmp_path, scenario)


def test_aiokafka_admin_creates_describes_and_deletes_topics(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{server.kafka_port}")
        await admin.start()
        try:
            created = await admin.create_topics(
                [AioTopic("ak", 2, 1, topic_configs={"cleanup.policy": "compact,delete"})]
            )
            assert [e[1] for e in created.topic_errors] == [0]
            assert server.broker.stream("ak").config.compact
            (described,) = await admin.describe_configs([AioResource(AioType.TOPIC, "ak")])
            (resource,) = described.resources
            entries = {entry[0]: entry[1] for entry in resource[4]}
            assert entries["cleanup.policy"] == "compact,delete"
            assert entries["retention.ms"] == "604800000"
            deleted = await admin.delete_topics(["ak"])
            assert [e[1] for e in deleted.topic_error_codes] == [0]
            assert "ak" not in await admin.list_topics()
        finally:
            await admin.close()

    served(tmp_path, scenario)


# -- what no client sends -------------------------------------------------------------------------


def test_create_topics_checks_each_entry_in_kafkas_order(tmp_path: Path) -> None:
    def wire(port: int) -> None:
        with KafkaWire(port) as kafka:
            module = schema(19, 7)
            manual = (module.CreatableReplicaAssignment(partition_index=0, broker_ids=(1,)),)
            answer = kafka.call(
                create_request(
                    creatable("twice"),
                    creatable("twice"),
                    creatable("none", partitions=0),
                    creatable("placed", partitions=-1, assignments=manual),
                    creatable("isr", configs={"min.insync.replicas": "2"}),
                    creatable("dflt", partitions=-1),
                )
            )
            codes = [(t.name, t.error_code) for t in answer.topics]
            assert codes == [
                ("twice", ErrorCode.invalid_request),
                ("twice", ErrorCode.invalid_request),
                ("none", ErrorCode.invalid_partitions),
                ("placed", ErrorCode.invalid_replica_assignment),
                ("isr", ErrorCode.invalid_config),
                ("dflt", ErrorCode.none),
            ]
            dflt = answer.topics[-1]
            assert (dflt.num_partitions, dflt.replication_factor) == (3, 1)
            assert {c.name: c.value for c in dflt.configs}["min.insync.replicas"] == "1"
            # v2 answers without configs; validate_only reports what it would create
            old = kafka.call(create_request(creatable("v2", 2, version=2), version=2))
            assert [(t.name, t.error_code) for t in old.topics] == [("v2", ErrorCode.none)]
            dry = kafka.call(create_request(creatable("dry", -1), validate_only=True))
            assert (dry.topics[0].error_code, dry.topics[0].num_partitions) == (ErrorCode.none, 3)

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert len(server.broker.stream("dflt").partitions) == 3
        assert len(server.broker.stream("v2").partitions) == 2
        assert server.broker.find_stream("dry") is None
        assert server.broker.find_stream("twice") is None

    served(tmp_path, scenario, kafka_default_partitions=3)


def test_delete_by_topic_id_and_describe_other_resources_are_refused(tmp_path: Path) -> None:
    def wire(port: int) -> None:
        with KafkaWire(port) as kafka:
            kafka.call(create_request(creatable("kept")))
            module = schema(20, 6)
            deleted = kafka.call(
                module.DeleteTopicsRequest(
                    topics=(
                        module.DeleteTopicState(name=None, topic_id=uuid.uuid4()),
                        module.DeleteTopicState(name="nope", topic_id=None),
                        module.DeleteTopicState(name="__cursors", topic_id=None),
                    ),
                    timeout=timedelta(seconds=10),
                )
            )
            codes = [r.error_code for r in deleted.responses]
            assert codes == [
                ErrorCode.unknown_topic_id,
                ErrorCode.unknown_topic_or_partition,
                ErrorCode.topic_authorization_failed,  # tidelog's own stream
            ]

            cluster = kafka.call(
                schema(60, 0).DescribeClusterRequest(include_cluster_authorized_operations=False)
            )
            node = str(cluster.brokers[0].broker_id)
            answer = kafka.call(
                describe_request(
                    (2, "kept", ("retention.ms", "cleanup.policy")),
                    (4, "12345" if node != "12345" else "54321", None),
                    (4, "", ("num.partitions",)),
                    (8, node, None),
                )
            )
            topic, other, here, logger = answer.results
            assert [c.name for c in topic.configs] == ["cleanup.policy", "retention.ms"]
            assert all(c.documentation for c in topic.configs)
            assert other.error_code == ErrorCode.invalid_request
            assert [(c.name, c.value) for c in here.configs] == [("num.partitions", "1")]
            assert logger.error_code == ErrorCode.invalid_request

            controllers = kafka.call(
                schema(60, 1).DescribeClusterRequest(
                    include_cluster_authorized_operations=False, endpoint_type=2
                )
            )
            assert controllers.error_code == ErrorCode.unsupported_endpoint_type

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert server.broker.find_stream("kept") is not None

    served(tmp_path, scenario)


# -- access ---------------------------------------------------------------------------------------

ACL = """
[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["*"]
resources = ["stream:alice.*", "cluster"]

[[rule]]
effect = "allow"
principals = ["mallory"]
operations = ["publish", "subscribe"]
resources = ["stream:alice.shared"]
"""


def test_admin_apis_ask_the_acl_for_each_entry(tmp_path: Path) -> None:
    principals = Principals(tmp_path / "pki")
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    alice, mallory = principals.context("alice"), principals.context("mallory")

    def wire(port: int) -> None:
        with KafkaWire(port, alice) as owner, KafkaWire(port, mallory) as other:
            refused = other.call(create_request(creatable("alice.m")))
            assert refused.topics[0].error_code == ErrorCode.topic_authorization_failed
            made = owner.call(create_request(creatable("alice.a"), creatable("bob.b")))
            assert [t.error_code for t in made.topics] == [
                ErrorCode.none,
                ErrorCode.topic_authorization_failed,
            ]
            module = schema(20, 5)
            delete = module.DeleteTopicsRequest(
                topic_names=("alice.a",), timeout=timedelta(seconds=10)
            )
            kept = other.call(delete)
            assert kept.responses[0].error_code == ErrorCode.topic_authorization_failed
            cluster = owner.call(
                schema(60, 0).DescribeClusterRequest(include_cluster_authorized_operations=False)
            )
            node = str(cluster.brokers[0].broker_id)
            theirs = other.call(describe_request((2, "alice.a", None), (4, node, None)))
            assert [r.error_code for r in theirs.results] == [
                ErrorCode.topic_authorization_failed,
                ErrorCode.cluster_authorization_failed,
            ]
            mine = owner.call(describe_request((2, "alice.a", None), (4, node, None)))
            assert [r.error_code for r in mine.results] == [ErrorCode.none, ErrorCode.none]
            gone = owner.call(delete)
            assert gone.responses[0].error_code == ErrorCode.none

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert server.broker.find_stream("alice.m") is None
        assert server.broker.find_stream("alice.a") is None

    served(tmp_path, scenario, **principals.settings(acl))


# -- LogAppendTime --------------------------------------------------------------------------------


def test_log_append_time_topics_answer_the_time_the_broker_stored_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamped: list[bool] = []
    real = fetch.to_kafka

    def spy(batch: Any, log_append_time: bool = False) -> bytes:
        stamped.append(log_append_time)
        return real(batch, log_append_time=log_append_time)

    monkeypatch.setattr(fetch, "to_kafka", spy)

    def wire(port: int) -> None:
        with KafkaWire(port) as kafka:
            kafka.call(
                create_request(
                    creatable("appended", configs={"message.timestamp.type": "LogAppendTime"}),
                    creatable("created"),
                )
            )
            before = datetime.now(UTC) - timedelta(seconds=1)
            for topic, appended in (("appended", True), ("created", False)):
                batch = record_batch([b"old"], timestamp_ms=1_000)  # 1970
                answer = kafka.call(produce_request(topic, 0, batch))
                (partition,) = answer.responses[0].partition_responses
                assert partition.error_code == ErrorCode.none
                if appended:
                    assert partition.log_append_time is not None
                    assert before <= partition.log_append_time <= datetime.now(UTC)
                else:
                    assert partition.log_append_time is None
                stamped.clear()
                fetched = kafka.call(fetch_request(topic))
                assert fetched.responses[0].partitions[0].records
                assert stamped and set(stamped) == {appended}

    async def scenario(server: Server) -> None:
        await asyncio.to_thread(wire, server.kafka_port)
        assert server.broker.stream("appended").config.log_append_time

    served(tmp_path, scenario)


def test_log_append_time_is_set_by_grpc_create_stream_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    def described(port: int) -> dict[str, str]:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in ("stamped", "plain")]
        found = admin.describe_configs(resources)
        return {
            r.name: found[r].result(timeout=10)["message.timestamp.type"].value for r in resources
        }

    async def first(server: Server) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            api = pb_grpc.APIStub(channel)
            await api.CreateStream(pb.CreateStreamRequest(name="stamped", logAppendTime=True))
            await api.CreateStream(pb.CreateStreamRequest(name="plain"))
        assert await asyncio.to_thread(described, server.kafka_port) == {
            "stamped": "LogAppendTime",
            "plain": "CreateTime",
        }

    async def second(server: Server) -> None:
        assert server.broker.stream("stamped").config.log_append_time
        assert await asyncio.to_thread(described, server.kafka_port) == {
            "stamped": "LogAppendTime",
            "plain": "CreateTime",
        }

    served(tmp_path, first)
    served(tmp_path, second)


def test_a_stream_saved_before_the_flag_reads_as_create_time() -> None:
    saved = StreamConfig(partitions=2, compact=True).to_json()
    del saved["log_append_time"]
    assert StreamConfig.from_json(saved) == StreamConfig(partitions=2, compact=True)
    assert not StreamConfig.from_json(saved).log_append_time
