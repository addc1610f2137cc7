"""A broker id an inter-broker request claims is the caller's own identity when the caller was
identified (``replica_service.claimed_broker``); an anonymous caller's claim is taken as it is
(no TLS, or TLS without client certificates: the documented gap)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.access import ANONYMOUS, Caller, Guard, serving
from tidelog.api.replica_service import ReplicationService, claimed_broker
from tidelog.errors import PermissionDenied


def _as(identity: str, claimed: str) -> None:
    def run() -> None:
        serving(Caller(identity, Guard()))
        claimed_broker(claimed, "fetch as follower")

    contextvars.copy_context().run(run)


def test_a_broker_fetches_in_its_own_name() -> None:
    _as("b2", "b2")


@pytest.mark.parametrize("identity", ["b1", "admin"])
def test_an_identified_caller_claiming_another_broker_is_refused_naming_the_claim(
    identity: str,
) -> None:
    with pytest.raises(PermissionDenied, match=f"{identity} may not fetch as follower 'b2'"):
        _as(identity, "b2")


def test_an_anonymous_claim_is_taken_as_it_is() -> None:
    _as(ANONYMOUS, "b2")


def _stream_as(identity: str, claimed: str) -> list[str]:
    """Open ``ReplicationService.ReplicaStream`` as ``identity`` claiming ``claimed``: the
    followers the control was asked to serve a stream for."""
    served: list[str] = []

    async def replica_stream(
        first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        served.append(first.follower)
        yield cpb.ReplicaFetchResponse().SerializeToString()

    async def requests() -> AsyncIterator[cpb.ReplicaFetchRequest]:
        yield cpb.ReplicaFetchRequest(stream="s", follower=claimed)
        yield cpb.ReplicaFetchRequest(fetch_offset=1, follower="someone else")

    async def run() -> None:
        serving(Caller(identity, Guard()))
        service = ReplicationService(SimpleNamespace(replica_stream=replica_stream))  # type: ignore[arg-type]
        async for _ in service.ReplicaStream(requests(), None):  # type: ignore[arg-type]
            pass

    contextvars.copy_context().run(asyncio.run, run())
    return served


def test_a_replication_stream_is_served_in_its_first_requests_name_when_that_is_the_caller() -> (
    None
):
    assert _stream_as("b2", "b2") == ["b2"]
    assert _stream_as(ANONYMOUS, "b2") == ["b2"]


def test_a_replication_stream_in_another_brokers_name_is_refused_before_anything_is_served() -> (
    None
):
    with pytest.raises(PermissionDenied, match="b1 may not fetch as follower 'b2'"):
        _stream_as("b1", "b2")
