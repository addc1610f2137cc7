"""Connections that close while a request of theirs waits, against a real ``tidelog serve
--kafka-port`` over raw sockets: a JoinGroup waiting for the rebalance whose client hangs up
leaves the group at once, so the other member's join completes without waiting for the dead
one's rebalance timeout; and requests pipelined behind a waiting one are neither consumed nor
lost, but answered in their turn."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_groups.v3.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from tests.kafka.kafka_wire import (
    call,
    connect,
    decode,
    fetch_request,
    frame,
    metadata_request,
    receive,
)
from tests.support.server import ServerProcess

pytestmark = pytest.mark.slow  # a real server

GROUP = "dead-connections"
LONG = timedelta(seconds=60)
"""The members' rebalance timeout: what a test would wait for if a dead join were kept."""


def _join(member_id: str = "") -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=GROUP,
        session_timeout=timedelta(seconds=30),
        rebalance_timeout=LONG,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=b"m"),),
    )


def _member_id(sock: socket.socket) -> str:
    """A member id handed out by MEMBER_ID_REQUIRED (JoinGroup v4+)."""
    first = call(sock, _join())
    assert first.error_code == ErrorCode.member_id_required
    return str(first.member_id)


def _members(port: int) -> list[str]:
    with connect(port) as sock:
        asked = DescribeGroupsRequest(groups=(GROUP,), include_authorized_operations=False)
        answer = call(sock, asked)
    return sorted(m.member_id for m in answer.groups[0].members)


def test_a_join_whose_connection_closes_leaves_and_the_others_join_at_once(
    kafka: tuple[ServerProcess, int],
) -> None:
    server, port = kafka
    with connect(port, timeout=30) as a:
        a_id = _member_id(a)
        joined = call(a, _join(a_id))
        assert joined.error_code == ErrorCode.none and joined.leader == a_id
        synced = call(
            a,
            SyncGroupRequest(
                group_id=GROUP,
                generation_id=joined.generation_id,
                member_id=a_id,
                group_instance_id=None,
                assignments=(SyncGroupRequestAssignment(member_id=a_id, assignment=b"A"),),
            ),
        )
        assert synced.error_code == ErrorCode.none

        # b joins: a rebalance, which waits for a to rejoin; b's JoinGroup waits meanwhile
        b = connect(port)
        try:
            b_id = _member_id(b)
            b.sendall(frame(_join(b_id), correlation_id=9))
            b.settimeout(0.5)
            with pytest.raises(TimeoutError):
                b.recv(1)  # no answer: it waits for the rebalance
            assert _members(port) == sorted([a_id, b_id])
        finally:
            b.close()  # the client hangs up while its join waits
        # noticed at once, not when an answer is written: b leaves the group
        deadline = time.monotonic() + 5
        while _members(port) != [a_id]:
            assert time.monotonic() < deadline, f"b is still a member: {_members(port)}"
            time.sleep(0.05)

        # a's rejoin completes at once, alone: b is not waited for until its rebalance timeout
        started = time.monotonic()
        again = call(a, _join(a_id))
        elapsed = time.monotonic() - started
        assert again.error_code == ErrorCode.none, again
        assert again.generation_id == joined.generation_id + 1
        assert [m.member_id for m in again.members] == [a_id]
        assert elapsed < 5.0, f"the rejoin took {elapsed:.1f} s"
    assert any("closed while a request waited" in line for line in server.stderr_lines)


def test_requests_pipelined_behind_a_waiting_fetch_are_answered_in_their_turn(
    kafka: tuple[ServerProcess, int],
) -> None:
    _, port = kafka
    with connect(port, timeout=30) as sock:
        made = call(sock, metadata_request("quiet"))
        assert made.topics[0].error_code in (ErrorCode.none, ErrorCode.leader_not_available)
        wait = timedelta(milliseconds=700)
        fetch = fetch_request("quiet", max_wait=wait)  # nothing there: it waits its max_wait
        versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        started = time.monotonic()
        # three requests in one write: the two behind the fetch arrive while it waits
        sock.sendall(
            frame(fetch, correlation_id=1)
            + frame(versions, correlation_id=2)
            + frame(versions, correlation_id=3)
        )
        answers: list[tuple[int, Any]] = []
        for api_key, version in ((1, 12), (18, 3), (18, 3)):
            data = receive(sock)
            assert data is not None, "the server closed the connection"
            answers.append(decode(api_key, version, data))
        assert [c for c, _ in answers] == [1, 2, 3]
        assert time.monotonic() - started >= wait.total_seconds() * 0.9
        assert answers[0][1].responses[0].partitions[0].error_code == ErrorCode.none
        assert all(a.error_code == ErrorCode.none for _, a in answers[1:])
        # and the connection goes on
        assert call(sock, versions, correlation_id=4).error_code == ErrorCode.none
