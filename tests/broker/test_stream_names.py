"""Stream names: 1-249 of ``[A-Za-z0-9._-]``, starting with a letter or digit; ``__`` reserved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.api.status import status_of
from tidelog.broker import StreamConfig, validate_stream_name
from tidelog.errors import InvalidArgument, StreamExists, echo
from tidelog.wire import CURSORS_STREAM

VALID = ("a", "Z", "0", "a" * 249, "orders.v2", "my_stream-1", "9lives", "a..b", "a__b", "A-")
INVALID = (
    "",
    "a" * 250,
    ".hidden",
    "-x",
    "_x",
    "__x",
    "__cursors",
    "a/b",
    "a b",
    "a\n",
    "café",
    "a*",
    "..",
    "a\x00b",
    "١٢٣",  # Arabic-Indic digits are not ASCII digits
)


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name: str) -> None:
    assert validate_stream_name(name) == name


@pytest.mark.parametrize("name", INVALID, ids=repr)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_stream_name(name)
    assert status_of(raised.value)[0] is grpc.StatusCode.INVALID_ARGUMENT
    # Named in full up to 200 characters, then its start and size (docs/api.md, "Errors").
    assert echo(name) in str(raised.value), "the message names the rejected name"


def test_internal_names_only_with_the_internal_flag() -> None:
    assert validate_stream_name("__cursors", internal=True) == "__cursors"
    with pytest.raises(InvalidArgument):
        validate_stream_name("__", internal=True)
    with pytest.raises(InvalidArgument):
        validate_stream_name("x", internal=True)


def test_the_broker_applies_the_rules(tmp_path: Path) -> None:
    async def body() -> None:
        async with running(broker_config(tmp_path)) as broker:
            for name in VALID:
                broker.create_stream(name)
            for name in INVALID:
                with pytest.raises(InvalidArgument):
                    broker.create_stream(name)
            with pytest.raises(StreamExists):
                broker.create_stream("a")
            # The reserved stream exists, but asking for it is a naming error, not a duplicate.
            with pytest.raises(InvalidArgument):
                broker.create_stream(CURSORS_STREAM)
            with pytest.raises(InvalidArgument):
                broker.create_stream("ok", StreamConfig(partitions=0))
            assert set(broker.streams) == {CURSORS_STREAM, *VALID}
            assert sorted(p.name for p in (tmp_path / "streams").iterdir()) == sorted(
                {CURSORS_STREAM, *VALID}
            )

    asyncio.run(body())
