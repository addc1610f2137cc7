"""Retrying calls, and the one rule that decides, for every call, whether a failed attempt is
sent again.

Theory of operation. A call that fails with UNAVAILABLE may or may not have reached the server:
the connection could have broken before the request left, or after the server acted on it and
before its answer arrived. The client tells three cases apart, and :func:`verdict` decides each
the same way for every call:

============================================  ===========================================
the failed attempt                            then
============================================  ===========================================
``NotSent``: its channel could not connect,   sent again, whatever the call: nothing left
so the request was never handed to gRPC       the client
refused "not partition leader" (a call        sent again, to the leader: the broker did
routed to a partition's leader)               nothing
lost: UNAVAILABLE, or CANCELLED sent by the   sent again when repeating it leaves the same
server; it may or may not have been done      state and answer as doing it once (below);
                                              otherwise (``once``) raised as
                                              ``Unavailable`` saying it was not retried
anything else                                 raised as its ``ClientError``
============================================  ===========================================

Before an attempt is sent again, and before a lost ``once`` call is raised, a call routed to a
leader calls ``after_failure``: in a cluster the router forgets a leader it could not reach and
looks the leaders up again (``leaders.py``), so the next attempt, or the application's next call,
goes to the new leader. Calls that must not be sent twice check first that their channel is
connected (:func:`connected`), which turns an unreachable broker into ``NotSent``; a request
handed to a connected channel whose connection then breaks counts as lost, never as not sent.

Which calls are safe to repeat:

==================================  ======  ====================================================
call                                lost    why
                                    sent
                                    again
==================================  ======  ====================================================
FetchMetadata (``list_streams``,    yes     reads
``stream_info``, partition lookup),
FetchCursor, ListViews, ViewGet,
ViewRange, WindowFetch
subscription start (the handshake)  yes     nothing was delivered yet; "new" means new from the
                                            attempt that succeeded
opening a ``Publisher``'s call      yes     opening sends no batch
SetCursor                           yes     writes an absolute offset: twice is once
DeclareView                         yes     declaring an identical view again does nothing
publish with producer id + sequence yes     the broker drops a batch it holds (``duplicate``)
CreateStream                        yes     ALREADY_EXISTS after an unanswered attempt is
                                            taken as "created" when the stream has the
                                            partitions and subject asked for
DeleteStream, DropView              yes     NOT_FOUND after an unanswered attempt is "deleted"
plain publish, ``publish_batch``    no      a retry could store the messages twice: the caller
without a producer, a batch of a            gets ``Unavailable`` at once (sent again only when
``Publisher``                               it was not sent, or refused by a broker that does
                                            not lead the partition)
a live subscription, ``Consumer``   no      it ends with ``Unavailable``; resume from the last
                                            offset received (in a cluster, ``subscribe``
                                            resumes on the new leader by itself)
==================================  ======  ====================================================

Only UNAVAILABLE and a CANCELLED sent by the server (a server shutting down cancels the calls
it had accepted but not started) count as lost. DEADLINE_EXCEEDED is not retried: an attempt's
deadline is what is left of the call's own ``timeout``, so when it passes there is no time left
to retry in.

Between attempts the call pauses (``retry_first_backoff_s``, doubling up to
``retry_max_backoff_s``; calls routed to a leader at most ``ROUTED_MAX_PAUSE_S``), then waits
for the channel to be connected again instead of failing fast on a channel that is still down;
gRPC's reconnect backoff (``ClientSettings``) decides how soon that happens after the server
is back. The whole is bounded by a budget: the call's ``timeout`` when it has one, else
``retry_budget_s``, counted from the call's start. An attempt sent to a connected server is not
cut by the budget (it keeps the call's own deadline, if any), so a slow answer from a live
server is still waited for.

:class:`RetryBudget` is the bookkeeping alone (no I/O, the clock passed in) and :func:`verdict`
the decision alone; :func:`retrying` is the asyncio shell around them.
"""

from __future__ import annotations

import asyncio
import enum
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

NOT_IDEMPOTENT = (
    "a publish without producer_id and producer_sequence could be stored twice; with them it is "
    "retried safely"
)
"""Why a publish without a producer is not sent again once it may have been stored: the
``once`` of its calls."""


class Status(grpc.RpcError):
    """A failure known without a failed call object (a refusal in a ``PublishStream`` response,
    a call that ended), as an ``RpcError`` for :func:`verdict`, the router and
    ``from_rpc_error``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class NotSent(Status):
    """UNAVAILABLE before the request was handed to gRPC: the channel to ``address`` could not
    connect. Nothing left the client, so sending it again is safe whatever the call."""

    def __init__(self, address: str) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE, f"failed to connect to {address}; nothing was sent"
        )
        self.address = address


CONNECT_WAIT_S = 1.0
"""How long one attempt of a call that must not be sent twice waits for its channel to connect
before it counts as not sent, and the leaders are looked up again (the channel goes on
connecting meanwhile): a leader whose host drops packets costs a second per lookup, not gRPC's
whole connect timeout."""

_CANNOT_CONNECT = frozenset(
    {grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN}
)


async def connected(channel: grpc.aio.Channel, address: str, within: float | None) -> None:
    """Return once ``channel`` (to ``address``) is connected, asking it to connect; raise
    ``NotSent`` when it fails to (TRANSIENT_FAILURE: refused, unreachable) or ``within`` seconds
    (None: no limit but gRPC's connect timeout) pass first. A connected channel does not promise
    delivery: a request sent over it may still be lost with its connection."""
    state = channel.get_state(try_to_connect=True)
    if state == grpc.ChannelConnectivity.READY:
        return
    loop = asyncio.get_running_loop()
    deadline = None if within is None else loop.time() + within
    while state != grpc.ChannelConnectivity.READY:
        left = None if deadline is None else deadline - loop.time()
        if state in _CANNOT_CONNECT or (left is not None and left <= 0):
            raise NotSent(address)
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), left)
        except TimeoutError:
            raise NotSent(address) from None
        state = channel.get_state(try_to_connect=True)


class Verdict(enum.Enum):
    """What follows a failed attempt (the module's first table)."""

    AGAIN = "send it again"
    LOST = "raise Unavailable: it may have been done, and it must not be done twice"
    RAISE = "raise its error"


def verdict(error: grpc.RpcError, *, routed: bool, repeatable: bool) -> Verdict:
    """The one rule, for every call: ``routed``, the call goes to a partition's leader;
    ``repeatable``, doing it twice leaves the same state and answer as doing it once."""
    if isinstance(error, NotSent):
        return Verdict.AGAIN
    if routed and not_leader(error):
        return Verdict.AGAIN
    if error.code() in RETRYABLE:
        return Verdict.AGAIN if repeatable else Verdict.LOST
    return Verdict.RAISE


def lost(error: grpc.RpcError, once: str) -> Unavailable:
    """The error of a call that is not sent again (``once`` says why) and may have been done."""
    return Unavailable(f"{from_rpc_error(error)} (not retried: {once})")


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
    once: str | None = None,
) -> T:
    """``attempt`` until it answers, fails for good (see :func:`verdict`; raised as its
    ``ClientError``) or the budget is spent (``Unavailable`` saying how long it tried).

    ``after_failure`` (calls routed to a partition's leader, and in a cluster calls any broker
    takes): called before each new attempt, and before a lost ``once`` call is raised, so that
    what is sent next goes where it should; a refusal by a broker that does not lead the
    partition is then sent again too. ``once``: the call must not be sent twice once it may
    have been done (why, for the error); it is still sent again when it was not sent at all.
    ``channel``: wait for it to reconnect between attempts (None: only pause, the next attempt
    may go elsewhere)."""
    budget = RetryBudget.start(settings, timeout, clock())
    if after_failure is not None:
        budget.max_pause_s = min(budget.max_pause_s, ROUTED_MAX_PAUSE_S)
        budget.pause_s = min(budget.pause_s, budget.max_pause_s)
    while True:
        budget.attempts += 1
        try:
            return await attempt(budget.attempt_timeout(clock()), budget.attempts)
        except grpc.RpcError as error:
            failure = error
        decided = verdict(failure, routed=after_failure is not None, repeatable=once is None)
        if decided is Verdict.RAISE:
            raise from_rpc_error(failure) from None
        if decided is Verdict.LOST:
            assert once is not None
            if after_failure is not None:
                await after_failure(failure)
            raise lost(failure, once) from None
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


__all__ = [
    "NOT_IDEMPOTENT",
    "RETRYABLE",
    "Attempt",
    "NotSent",
    "RetryBudget",
    "Status",
    "Verdict",
    "connected",
    "lost",
    "retrying",
    "verdict",
]
