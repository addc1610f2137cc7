"""Request streams that end when the server starts shutting down.

A client keeps a publish stream open between publishes; reading its next request would hold a
graceful shutdown for the whole grace period. ``until_draining`` yields the stream's requests
until the stream ends or the broker drains, whichever comes first; on a drain it raises
:class:`~tidelog.errors.BrokerClosed` (UNAVAILABLE), with nothing half-read: a request is
either yielded whole or never read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from tidelog.control import Control
from tidelog.errors import BrokerClosed

T = TypeVar("T")

DRAINED = (
    "the server is shutting down: every request acknowledged was stored; publish the ones "
    "without an ack again, on another broker or after the restart"
)


async def until_draining(control: Control, requests: AsyncIterator[T]) -> AsyncIterator[T]:
    """``requests``, ended early by a drain (then ``BrokerClosed``).

    Nothing is added per request (no task, no wait on two futures: a paced publisher sends one
    request a millisecond): a drain that comes while the stream waits for its next request
    cancels the task reading it, which takes that cancellation back and raises ``BrokerClosed``
    (a request the transport had not handed over stays unread); a drain that comes while a
    request is being handled is seen before the next one is read. A cancellation from anyone
    else goes on as one."""
    task = asyncio.current_task()
    assert task is not None  # an async generator always runs in a task
    reading = False
    drained = False

    def drain() -> None:
        nonlocal drained
        if not drained:
            drained = True
            if reading:
                task.cancel()

    withdraw = control.when_draining(drain)
    try:
        while not drained:
            reading = True
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                return
            except BaseException as error:
                if not drained:
                    raise
                # The drain cancelled this read (a stream may also turn that into its own error).
                if task.uncancel() > 0 and isinstance(error, asyncio.CancelledError):
                    raise  # not only the drain's
                break
            finally:
                reading = False
            yield request
        raise BrokerClosed(DRAINED)
    finally:
        withdraw()
