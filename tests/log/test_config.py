"""LogConfig: one frozen value per log, every setting validated on construction."""

from __future__ import annotations

import dataclasses

import pytest

from tidelog.log import FlushPolicy, LogConfig
from tidelog.log.config import MAX_SEGMENT_BYTES


def test_defaults_match_the_documented_table():
    config = LogConfig()
    assert config.segment_max_bytes == 256 * 1024 * 1024
    assert config.segment_max_age_s == 168 * 3600
    assert config.max_message_bytes == 256 * 1024
    assert config.index_preallocate_bytes == 10 * 1024 * 1024
    assert config.retention_bytes is None and config.retention_messages is None
    assert config.retention_age_s == 168 * 3600
    assert config.flush_policy is FlushPolicy.INTERVAL
    assert config.flush_interval_s == 1.0


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_max_bytes = 4096  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value",
    [
        ("segment_max_bytes", 4096),
        ("segment_max_bytes", MAX_SEGMENT_BYTES),
        ("max_message_bytes", 1),
        ("max_message_bytes", 64 * 1024 * 1024),
        ("index_preallocate_bytes", 1280),
        ("retention_bytes", 0),
        ("retention_messages", 0),
        ("retention_age_s", None),
        ("retention_age_s", 0.001),
    ],
)
def test_bounds_are_accepted(field, value):
    assert getattr(LogConfig(**{field: value}), field) == value


@pytest.mark.parametrize(
    "field, value",
    [
        ("segment_max_bytes", 0),
        ("segment_max_bytes", MAX_SEGMENT_BYTES + 1),
        ("segment_max_age_s", 0),
        ("max_message_bytes", 0),
        ("max_message_bytes", 64 * 1024 * 1024 + 1),
        ("index_preallocate_bytes", 1279),
        ("retention_bytes", -1),
        ("retention_messages", -1),
        ("retention_age_s", 0),
        ("flush_interval_s", 0),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_setting(field, value):
    with pytest.raises(ValueError, match=field):
        LogConfig(**{field: value})
