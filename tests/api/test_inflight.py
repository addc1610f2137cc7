"""Bytes of publishes in flight (``api/inflight.py``): a unary publish that does not fit its
connection's or its principal's budget is refused naming the setting, a publish stream waits for
room instead, a request alone always goes, and budgets of gone connections are dropped."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidelog.access import ANONYMOUS, Access, Caller, Guard, Operation, serving
from tidelog.api.inflight import PER_CONNECTION, PER_PRINCIPAL, STREAM_READ_AHEAD, InFlight
from tidelog.api.status import status_of
from tidelog.errors import LimitReached
from tidelog.wire import FORWARDED

MB = 1 << 20


class Request:
    def __init__(self, size: int) -> None:
        self.size = size

    def ByteSize(self) -> int:
        return self.size


class Context:
    def __init__(self, peer: str, *, forwarded: bool = False) -> None:
        self._peer = peer
        self._metadata = ((FORWARDED, "1"),) if forwarded else ()

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


class BrokersOnCluster:
    """An ACL in small: only ``broker`` has ``cluster``; everyone may do everything else."""

    def allows(self, identity: str, access: Access) -> bool:
        return identity == "broker" or access.operation is not Operation.CLUSTER


def as_principal(name: str) -> None:
    serving(Caller(name, Guard(BrokersOnCluster())))


def test_a_unary_publish_past_a_budget_is_refused_naming_the_setting() -> None:
    async def body() -> None:
        budget = InFlight(per_connection=10 * MB, per_principal=15 * MB)
        as_principal("alice")
        one, two, three = Context("a:1"), Context("a:2"), Context("a:3")
        async with budget.admit(one, Request(8 * MB)):
            with pytest.raises(LimitReached) as refused:
                async with budget.admit(one, Request(4 * MB)):
                    pass
            assert refused.value.setting == PER_CONNECTION
            assert PER_CONNECTION in str(refused.value)
            async with budget.admit(two, Request(6 * MB)):  # another connection: 14 of 15
                with pytest.raises(LimitReached) as refused:
                    async with budget.admit(three, Request(2 * MB)):
                        pass
                assert refused.value.setting == PER_PRINCIPAL
                as_principal("bob")  # another principal has its own budget
                async with budget.admit(three, Request(2 * MB)):
                    assert budget.principals == {"alice": 14 * MB, "bob": 2 * MB}
                as_principal("alice")
        assert budget.connections == {} and budget.principals == {}, "nothing left behind"
        async with budget.admit(one, Request(40 * MB)):  # alone, larger than both budgets
            pass
        assert budget.refused == 2

    asyncio.run(body())


def test_a_publish_stream_waits_for_room_and_never_is_refused() -> None:
    async def body() -> None:
        budget = InFlight(per_connection=10 * MB, per_principal=100 * MB)
        as_principal("alice")
        context = Context("a:1")
        stream = budget.pacer(context)
        await stream.take(Request(6 * MB))
        other = budget.pacer(context)
        taken = asyncio.create_task(other.take(Request(6 * MB)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not taken.done(), "waits while the connection's budget is full"
        assert budget.waited == 1
        stream.done(1)
        await asyncio.wait_for(taken, 5)
        assert budget.connections == {"a:1": 6 * MB}
        other.close()
        stream.close()
        assert budget.connections == {} and budget.refused == 0

    asyncio.run(body())


def test_a_limit_reached_is_answered_resource_exhausted_naming_the_setting() -> None:
    code, detail = status_of(LimitReached(PER_CONNECTION, "publish refused"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert PER_CONNECTION in detail


def test_anonymous_callers_share_no_principal_budget() -> None:
    """With security off every client is ANONYMOUS: one shared budget would let two slow
    clients refuse everyone else's publishes. Each connection keeps its own budget."""

    async def body() -> None:
        budget = InFlight(per_connection=10 * MB, per_principal=15 * MB)
        as_principal(ANONYMOUS)
        async with (
            budget.admit(Context("a:1"), Request(9 * MB)),
            budget.admit(Context("a:2"), Request(9 * MB)),
            budget.admit(Context("a:3"), Request(9 * MB)),
        ):
            assert budget.principals == {}
            with pytest.raises(LimitReached) as refused:
                async with budget.admit(Context("a:3"), Request(2 * MB)):
                    pass
            assert refused.value.setting == PER_CONNECTION

    asyncio.run(body())


def test_publishes_a_broker_forwards_do_not_share_its_principal_budget() -> None:
    async def body() -> None:
        budget = InFlight(per_connection=100 * MB, per_principal=15 * MB)
        as_principal("broker")
        async with (
            budget.admit(Context("b:1", forwarded=True), Request(9 * MB)),
            budget.admit(Context("b:2", forwarded=True), Request(9 * MB)),
        ):
            assert budget.principals == {}
            # The broker's own publishes keep their budget.
            async with budget.admit(Context("b:3"), Request(9 * MB)):
                with pytest.raises(LimitReached):
                    async with budget.admit(Context("b:4"), Request(9 * MB)):
                        pass
        as_principal("alice")  # the header alone, without ``cluster``, exempts nothing
        async with budget.admit(Context("a:1", forwarded=True), Request(9 * MB)):
            with pytest.raises(LimitReached) as refused:
                async with budget.admit(Context("a:2", forwarded=True), Request(9 * MB)):
                    pass
            assert refused.value.setting == PER_PRINCIPAL

    asyncio.run(body())


def test_a_publish_stream_reads_ahead_a_bounded_amount_whatever_the_budgets() -> None:
    """A client that does not read its acks holds STREAM_READ_AHEAD, not its whole budget."""

    async def body() -> None:
        budget = InFlight(per_connection=1 << 40, per_principal=1 << 40)
        as_principal("alice")
        stream = budget.pacer(Context("a:1"))
        half = Request(STREAM_READ_AHEAD // 2)
        await stream.take(half)
        await stream.take(half)
        taken = asyncio.create_task(stream.take(Request(1)))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not taken.done(), "waits while the stream's read-ahead is full"
        other = budget.pacer(Context("a:1"))  # another stream on the connection is not held
        await asyncio.wait_for(other.take(half), 5)
        stream.done(1)
        await asyncio.wait_for(taken, 5)
        stream.close()
        other.close()
        assert budget.connections == {} and budget.principals == {}

    asyncio.run(body())
