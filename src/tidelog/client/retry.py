"""Retrying the calls that are safe to repeat when the server is unreachable.

Theory of operation. A call that fails with UNAVAILABLE may or may not have reached the server:
the connection could have broken before the request left, or after the server acted on it and
before its answer arrived. A call is retried only when doing it twice leaves the same state and
answer as doing it once, so the client never needs to know which:

==================================  ======  ====================================================
call                                retried why
==================================  ======  ====================================================
FetchMetadata (``list_streams``,    yes     reads
``stream_info``, partition lookup),
FetchCursor, ListViews, ViewGet,
ViewRange, WindowFetch
subscription start (the handshake)  yes     nothing was delivered yet; "new" means new from the
                                            attempt that succeeded
SetCursor                           yes     writes an absolute offset: twice is once
DeclareView                         yes     declaring an identical view again does nothing
publish with producer id + sequence yes     the broker drops a batch it holds (``duplicate``)
CreateStream                        yes     ALREADY_EXISTS after an unanswered attempt is
                                            taken as "created" when the stream has the
                                            partitions and subject asked for
DeleteStream, DropView              yes     NOT_FOUND after an unanswered attempt is "deleted"
plain publish, ``publish_batch``    no      a retry could store the messages twice: the
without a producer, ``Publisher``           caller gets ``Unavailable`` at once (a refusal
                                            by a broker that does not lead the partition is
                                            retried at the leader: nothing was stored)
a live subscription, ``Consumer``   no      it ends with ``Unavailable``; resume from the last
                                            offset received (in a cluster, ``subscribe``
                                            resumes on the new leader by itself)
==================================  ======  ====================================================

Only UNAVAILABLE and a CANCELLED sent by the server (a server shutting down cancels the calls
it had accepted but not started) are retried, and, for calls routed to a partition's leader in
a cluster (``leaders.py``), FAILED_PRECONDITION "not partition leader", after looking the
leader up again. DEADLINE_EXCEEDED is not: an attempt's deadline is what is left of the call's own
``timeout``, so when it passes there is no time left to retry in.

Between attempts the call pauses (``retry_first_backoff_s``, doubling up to
``retry_max_backoff_s``; calls routed to a leader at most ``ROUTED_MAX_PAUSE_S``), then waits
for the channel to be connected again instead of failing fast on a channel that is still down;
gRPC's reconnect backoff (``ClientSettings``) decides how soon that happens after the server
is back. The whole is bounded by a budget: the call's ``timeout`` when it has one, else
``retry_budget_s``, counted from the call's start. An attempt sent to a connected server is not
cut by the budget (it keeps the call's own deadline, if any), so a slow answer from a live
server is still waited for.

:class:`RetryBudget` is the bookkeeping alone (no I/O, the clock passed in); :func:`retrying`
is the asyncio shell around it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from tidelog.client.errors import ClientError, Unavailable, from_rpc_error
from tidelog.client.leaders import not_leader
from tidelog.client.settings import ClientSettings

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""CANCELLED as received from a server (this client's own cancel raises CancelledError
instead): a server shutting down cancels calls it accepted but had not started, and calls still
running after its grace time. Like UNAVAILABLE, the call may or may not have been done."""

ROUTED_MAX_PAUSE_S = 0.25
"""The longest pause between attempts of a call routed to a partition's leader: each retry
first looks the leader up (one small metadata call), and a failover ends when the controller
elects, at any moment, so pausing a full ``retry_max_backoff_s`` would add up to that much to
it."""

Attempt = Callable[[float | None, int], Awaitable[T]]
"""One try of a call: given the deadline left of the call's own timeout (None: no deadline) and
the attempt's number (1 for the first), it returns the answer or raises ``grpc.RpcError``."""


def removal(call: Callable[[float | None], Awaitable[object]]) -> Attempt[None]:
    """An attempt of a call that removes something (a stream, a view): NOT_FOUND on a retry means
    an earlier attempt, which went unanswered while the server was unreachable, removed it."""

    async def attempt(timeout: float | None, number: int) -> None:
        try:
            await call(timeout)
        except grpc.RpcError as error:
            if number == 1 or error.code() != grpc.StatusCode.NOT_FOUND:
                raise

    return attempt


@dataclass(slots=True)
class RetryBudget:
    """When to try again and when to give up, for one call."""

    started: float
    budget_s: float
    timeout: float | None
    pause_s: float
    max_pause_s: float
    attempts: int = 0

    @classmethod
    def start(cls, settings: ClientSettings, timeout: float | None, now: float) -> RetryBudget:
        return cls(
            started=now,
            budget_s=settings.retry_budget_s if timeout is None else timeout,
            timeout=timeout,
            pause_s=settings.retry_first_backoff_s,
            max_pause_s=settings.retry_max_backoff_s,
        )

    @property
    def deadline(self) -> float:
        return self.started + self.budget_s

    def attempt_timeout(self, now: float) -> float | None:
        """The deadline of the next attempt: what is left of the call's timeout, if it has one."""
        if self.timeout is None:
            return None
        return max(self.deadline - now, 0.0)

    def next_pause(self, now: float) -> float | None:
        """After a failed attempt: seconds to pause before the next, or None to give up."""
        left = self.deadline - now
        if left <= 0:
            return None
        pause = min(self.pause_s, left)
        self.pause_s = min(self.pause_s * 2, self.max_pause_s)
        return pause


async def retrying(
    attempt: Attempt[T],
    *,
    channel: grpc.aio.Channel | None,
    settings: ClientSettings,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    after_failure: Callable[[grpc.RpcError], Awaitable[None]] | None = None,
) -> T:
    """``attempt`` until it answers, fails with anything but UNAVAILABLE (raised as its
    ``ClientError``) or the budget is spent (``Unavailable`` saying how long it tried).

    ``after_failure`` (calls routed to a partition's leader): also retry a refusal by a broker
    that does not lead the partition (nothing was done), calling it first so that the next
    attempt goes to the leader. ``channel``: wait for it to reconnect between attempts (None:
    only pause, the next attempt may go elsewhere)."""
    budget = RetryBudget.start(settings, timeout, clock())
    if after_failure is not None:
        budget.max_pause_s = min(budget.max_pause_s, ROUTED_MAX_PAUSE_S)
        budget.pause_s = min(budget.pause_s, budget.max_pause_s)
    while True:
        budget.attempts += 1
        try:
            return await attempt(budget.attempt_timeout(clock()), budget.attempts)
        except grpc.RpcError as error:
            moved = after_failure is not None and not_leader(error)
            if error.code() not in RETRYABLE and not moved:
                raise from_rpc_error(error) from None
            failure = error
        pause = budget.next_pause(clock())
        if pause is not None:
            if after_failure is not None:
                await after_failure(failure)
            await asyncio.sleep(pause)
            if channel is None or await _connected(channel, budget.deadline - clock()):
                continue
        raise _gave_up(failure, budget, clock())


async def _connected(channel: grpc.aio.Channel, within: float) -> bool:
    """Wait until the channel is connected (asking it to connect), for at most ``within`` s."""
    if within <= 0:
        return False
    try:
        await asyncio.wait_for(channel.channel_ready(), within)
    except TimeoutError:
        return False
    return True


def _gave_up(failure: grpc.RpcError, budget: RetryBudget, now: float) -> ClientError:
    cause = from_rpc_error(failure)
    if budget.budget_s <= 0:  # retrying is off: the error as it came
        return cause
    limit = "its timeout" if budget.timeout is not None else "the retry budget"
    return Unavailable(
        f"{cause} (gave up after {budget.attempts} attempts in {now - budget.started:.1f} s, "
        f"{limit} of {budget.budget_s:g} s)"
    )


__all__ = ["RETRYABLE", "Attempt", "RetryBudget", "retrying"]
