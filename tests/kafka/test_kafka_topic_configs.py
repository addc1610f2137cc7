"""Kafka topic configs as stream settings and back (``tidelog.kafka.topic_configs``), without a
server: each key's mapping, each refusal naming its key, and described configs reading back to
the same effective settings."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker import LogConfig, StreamConfig
from tidelog.kafka.session import KafkaConfig
from tidelog.kafka.topic_configs import (
    FOREVER_S,
    UNLIMITED,
    InvalidConfig,
    Source,
    broker_entries,
    selected,
    topic_entries,
    topic_settings,
)

DEFAULTS = LogConfig(retention_bytes=None, retention_age_s=7 * 24 * 3600.0)


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        ({}, StreamConfig(partitions=2)),
        ({"retention.ms": "90000"}, StreamConfig(partitions=2, retention_age_s=90.0)),
        ({"retention.ms": "-1"}, StreamConfig(partitions=2, retention_age_s=FOREVER_S)),
        ({"retention.bytes": "-1"}, StreamConfig(partitions=2, retention_bytes=UNLIMITED)),
        ({"retention.bytes": "0"}, StreamConfig(partitions=2, retention_bytes=0)),
        ({"segment.bytes": "4096"}, StreamConfig(partitions=2, segment_max_bytes=4096)),
        ({"segment.ms": "1500"}, StreamConfig(partitions=2, segment_max_age_s=1.5)),
        ({"max.message.bytes": "1000"}, StreamConfig(partitions=2, max_message_bytes=1000)),
        ({"cleanup.policy": "delete"}, StreamConfig(partitions=2)),
        (
            {"cleanup.policy": "compact"},
            StreamConfig(
                partitions=2, compact=True, retention_age_s=FOREVER_S, retention_bytes=UNLIMITED
            ),
        ),
        ({"cleanup.policy": "compact, delete"}, StreamConfig(partitions=2, compact=True)),
        (
            {"cleanup.policy": "compact", "retention.ms": "60000"},
            StreamConfig(
                partitions=2, compact=True, retention_age_s=60.0, retention_bytes=UNLIMITED
            ),
        ),
        (
            {"message.timestamp.type": "LogAppendTime"},
            StreamConfig(partitions=2, log_append_time=True),
        ),
        ({"message.timestamp.type": "CreateTime"}, StreamConfig(partitions=2)),
    ],
)
def test_each_key_maps_to_its_setting(configs: dict[str, str], expected: StreamConfig) -> None:
    assert topic_settings(2, configs.items()).config == expected


def test_min_insync_replicas_is_a_create_argument() -> None:
    assert topic_settings(1, [("min.insync.replicas", "2")]).min_isr == 2
    assert topic_settings(1, []).min_isr == 0


@pytest.mark.parametrize(
    ("configs", "names"),
    [
        ([("compression.type", "lz4")], "compression.type"),
        ([("retention.ms", "1"), ("retention.ms", "2")], "given twice"),
        ([("retention.ms", None)], "retention.ms: no value"),
        ([("retention.ms", "soon")], "retention.ms='soon': not an integer"),
        ([("retention.ms", "0")], "retention.ms=0"),
        ([("retention.ms", "-2")], "retention.ms=-2: must be at least -1"),
        ([("segment.bytes", "0")], "segment.bytes=0"),
        ([("max.message.bytes", str(1 << 30))], "max.message.bytes="),
        ([("cleanup.policy", "shred")], "cleanup.policy='shred'"),
        ([("cleanup.policy", ",")], "cleanup.policy=','"),
        ([("message.timestamp.type", "Now")], "message.timestamp.type='Now'"),
        ([("min.insync.replicas", "0")], "min.insync.replicas=0"),
    ],
)
def test_refusals_name_the_key(configs: list[tuple[str, str | None]], names: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        topic_settings(1, configs)
    assert names in str(refused.value)


def test_described_topic_says_where_each_value_comes_from() -> None:
    config = StreamConfig(partitions=1, retention_age_s=60.0, log_append_time=True)
    entries = {e.name: e for e in topic_entries(config, DEFAULTS, 1)}
    assert entries["retention.ms"].value == "60000"
    assert entries["retention.ms"].source is Source.TOPIC
    assert entries["retention.bytes"].value == "-1"
    assert entries["retention.bytes"].source is Source.BROKER
    assert entries["segment.bytes"].value == str(DEFAULTS.segment_max_bytes)
    assert entries["message.timestamp.type"].value == "LogAppendTime"
    assert entries["message.timestamp.type"].source is Source.TOPIC
    assert entries["cleanup.policy"].source is Source.DEFAULT
    assert [e.name for e in selected(list(entries.values()), ["segment.ms", "nope"])] == [
        "segment.ms"
    ]


def test_broker_entries_come_from_the_listener_and_the_server() -> None:
    kafka = KafkaConfig(message_max_bytes=2048, auto_create_topics=False, default_partitions=6)
    entries = {e.name: e.value for e in broker_entries(kafka, DEFAULTS, 42)}
    assert entries["broker.id"] == "42"
    assert entries["message.max.bytes"] == "2048"
    assert entries["auto.create.topics.enable"] == "false"
    assert entries["num.partitions"] == "6"
    assert entries["log.retention.ms"] == "604800000"
    assert entries["log.retention.bytes"] == "-1"


kafka_configs = st.fixed_dictionaries(
    {},
    optional={
        "cleanup.policy": st.sampled_from(["delete", "compact", "compact,delete"]),
        "retention.ms": st.one_of(st.just("-1"), st.integers(1, 10**12).map(str)),
        "retention.bytes": st.one_of(st.just("-1"), st.integers(0, 10**15).map(str)),
        "segment.bytes": st.integers(1, 2**31).map(str),
        "segment.ms": st.integers(1, 10**10).map(str),
        "max.message.bytes": st.integers(1, 1 << 26).map(str),
        "message.timestamp.type": st.sampled_from(["CreateTime", "LogAppendTime"]),
    },
)


def effective(config: StreamConfig) -> LogConfig:
    """The settings a partition of the stream runs with, "no limit" spelled one way."""
    log = config.log_config(DEFAULTS)
    return dataclasses.replace(
        log,
        retention_bytes=UNLIMITED if log.retention_bytes is None else log.retention_bytes,
        retention_age_s=FOREVER_S if log.retention_age_s is None else log.retention_age_s,
    )


@given(configs=kafka_configs, partitions=st.integers(1, 64))
def test_described_configs_read_back_to_the_same_settings(
    configs: dict[str, str], partitions: int
) -> None:
    first = topic_settings(partitions, configs.items()).config
    described = [(e.name, e.value) for e in topic_entries(first, DEFAULTS, 1)]
    again = topic_settings(partitions, described).config
    assert effective(again) == effective(first)
    assert (again.compact, again.log_append_time) == (first.compact, first.log_append_time)
