"""Option parsing and checking, without a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.client import DEFAULT_SERVER, ClientTls
from tidelog.errors import InvalidOption
from tidelog.spark.options import (
    DEFAULT_MAX_OFFSETS_PER_PARTITION,
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    parse,
)
from tidelog.spark.sink_options import parse_write_options


def test_defaults() -> None:
    options = parse({"stream": "s"})
    assert options == ReadOptions(stream="s")
    assert options.servers == (DEFAULT_SERVER,)
    assert options.fail_on_data_loss and not options.reverse
    assert options.max_offsets_per_partition == DEFAULT_MAX_OFFSETS_PER_PARTITION


def test_every_option_in_any_case() -> None:
    options = parse(
        {
            "SERVERS": "a:1, b:2",
            "stream": "s",
            "partitions": "2,0,2",
            "startingoffsets": '{"0": 5, "2": -2}',
            "endingOffsets": "latest",
            "startingTimestamp": "1000",
            "endingTimestamp": "2000",
            "reverse": "TRUE",
            "maxOffsetsPerTrigger": "10",
            "failOnDataLoss": "false",
            "maxOffsetsPerPartition": "7",
            "minPartitions": "3",
        }
    )
    assert options == ReadOptions(
        servers=("a:1", "b:2"),
        stream="s",
        partitions=(0, 2),
        starting_offsets=OffsetSpec(EARLIEST, {0: 5, 2: EARLIEST}),
        ending_offsets=OffsetSpec(LATEST),
        starting_timestamp_ms=1000,
        ending_timestamp_ms=2000,
        reverse=True,
        max_offsets_per_trigger=10,
        fail_on_data_loss=False,
        max_offsets_per_partition=7,
        min_partitions=3,
    )


def test_offset_spec_defaults_for_unlisted_partitions() -> None:
    options = parse({"startingOffsets": '{"1": 4}', "endingOffsets": '{"1": 9}'})
    assert options.starting_offsets is not None and options.ending_offsets is not None
    assert options.starting_offsets.for_partition(0) == EARLIEST
    assert options.starting_offsets.for_partition(1) == 4
    assert options.ending_offsets.for_partition(0) == LATEST


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "{oops"}, "startingOffsets: expected"),
        ({"startingOffsets": "[1, 2]"}, "startingOffsets: expected"),
        ({"startingOffsets": "newest"}, "startingOffsets: expected"),
        ({"startingOffsets": '{"a": 1}'}, "partition 'a' is not a partition number"),
        ({"startingOffsets": '{"0": -3}'}, "must be an offset >= 0"),
        ({"startingOffsets": '{"0": "5"}'}, "must be an offset >= 0"),
        ({"endingOffsets": '{"0": true}'}, "must be an offset >= 0"),
        ({"endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
        ({"endingOffsets": '{"0": -2}'}, "endingOffsets cannot be 'earliest'"),
        ({"startingOffsets": '{"0": 5}', "endingOffsets": '{"0": 4}'}, "is before startingOffsets"),
        ({"startingTimestamp": "20", "endingTimestamp": "10"}, "is before startingTimestamp"),
        ({"startingTimestamp": "-1"}, "startingTimestamp: expected an integer >= 0"),
        ({"endingTimestamp": "soon"}, "endingTimestamp: expected an integer"),
        ({"reverse": "yes"}, "reverse: expected 'true' or 'false'"),
        ({"failOnDataLoss": "0"}, "failOnDataLoss: expected 'true' or 'false'"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger: expected an integer >= 1"),
        ({"maxOffsetsPerPartition": "x"}, "maxOffsetsPerPartition: expected an integer"),
        ({"minPartitions": "0"}, "minPartitions: expected an integer >= 1"),
        ({"partitions": "0,x"}, "partitions: expected partition numbers"),
        ({"partitions": "-1"}, "partitions: expected partition numbers"),
        ({"servers": "localhost"}, "servers: expected host:port"),
        ({"servers": "h:99999"}, "servers: expected host:port"),
        ({"servers": " , "}, "servers: expected host:port"),
    ],
)
def test_bad_values_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOption, match=message.replace("[", r"\[")):
        parse(options)


def test_equal_offsets_and_timestamps_are_an_empty_read_not_an_error() -> None:
    parse({"startingOffsets": '{"0": 5}', "endingOffsets": '{"0": 5}'})
    parse({"startingTimestamp": "5", "endingTimestamp": "5"})


def test_stream_is_required_when_reading() -> None:
    with pytest.raises(InvalidOption, match="option 'stream' is required"):
        parse({}).require_stream()


@pytest.mark.parametrize(
    "options",
    [{"endingOffsets": "latest"}, {"endingTimestamp": "5"}, {"reverse": "true"}],
)
def test_batch_only_options_are_refused_for_streaming(options: dict[str, str]) -> None:
    with pytest.raises(InvalidOption, match="batch reads only"):
        parse(options).check_streaming()
    parse({}).check_streaming()


def test_connection_options_make_one_client_tls() -> None:
    options = parse(
        {"stream": "s", "tlsCa": "ca.pem", "TLSCERT": "me.pem", "tlsKey": "me.key", "token": "t"}
    )
    assert options.tls == ClientTls(
        ca=Path("ca.pem"), cert=Path("me.pem"), key=Path("me.key"), token="t"
    )
    assert "token=" not in repr(options)
    assert parse({"stream": "s", "tls": "true", "token": "secret"}).tls.secure
    assert parse({"stream": "s"}).tls == ClientTls()  # plaintext by default
    write = parse_write_options({"stream": "s", "tlsCa": "ca.pem", "token": "secret"})
    assert write.tls.token == "secret" and "secret" not in repr(write)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"token": "secret"}, "option 'token' is sent only over TLS"),
        ({"token": "secret", "tls": "false"}, "option 'token' is sent only over TLS"),
        ({"tlsCert": "me.pem"}, "options 'tlsCert' and 'tlsKey' go together"),
        ({"tlsKey": "me.key", "tlsCa": "ca.pem"}, "options 'tlsCert' and 'tlsKey' go together"),
        ({"tls": "yes"}, "tls: expected 'true' or 'false'"),
    ],
)
def test_connection_options_refused(given: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOption, match=message) as refused:
        parse({"stream": "s", **given})
    assert "secret" not in str(refused.value)
