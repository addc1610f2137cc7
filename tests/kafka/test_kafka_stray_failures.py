"""Failures between the lines: FindCoordinator when the group's cursor partition moves between two
lookups (a retriable answer, not an escaped error closing the client's connection), and a bug
outside any handler (logged, its connection closed, nothing escapes to asyncio)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tidelog.errors import NotLeader
from tidelog.kafka import KafkaConfig, KafkaListener, groups


def test_a_coordinator_lookup_that_fails_answers_coordinator_not_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def not_here(*_: Any) -> ErrorCode:
        return ErrorCode.not_coordinator

    async def moved(*_: Any) -> str:
        raise NotLeader("__cursors", 0, "b2", leader_id="b2", leader_epoch=3)

    monkeypatch.setattr(groups, "refusal", not_here)
    monkeypatch.setattr(groups, "coordinator_broker", moved)
    session: Any = SimpleNamespace(
        control=SimpleNamespace(broker_id="b1"),
        broker_address=lambda _id: ("127.0.0.1", 9092),
        advertised=("127.0.0.1", 9092),
    )
    found = asyncio.run(groups._find(session, groups.GROUP_KEY, "g"))
    assert found[3] == ErrorCode.coordinator_not_available


def test_a_failure_outside_a_handler_is_logged_and_closes_only_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def identify(self, *_: Any) -> str:
            raise RuntimeError("an authenticator bug")

    gate: Any = SimpleNamespace(guard=None, authenticator=Broken())
    control: Any = SimpleNamespace(kafka_addresses=lambda: {}, broker_id="b1")

    async def scenario() -> bytes:
        listener = KafkaListener(control, KafkaConfig(port=0), gate)
        port = await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return data
        finally:
            await listener.stop()

    with caplog.at_level(logging.ERROR, "tidelog.kafka"):
        assert asyncio.run(scenario()) == b""  # closed, nothing sent
    assert any("failed; closed" in r.getMessage() for r in caplog.records)
