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
    """``requests``, ended early by a drain (then ``BrokerClosed``). One task per request: for
    streams of batches, not of single messages (``PublishAsync`` uses a callback instead)."""
    drained = asyncio.Event()
    withdraw = control.when_draining(drained.set)
    waiter = asyncio.ensure_future(drained.wait())
    try:
        while True:
            following = asyncio.ensure_future(anext(requests))
            await asyncio.wait({following, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                following.cancel()
                raise BrokerClosed(DRAINED)
            try:
                request = following.result()
            except StopAsyncIteration:
                return
            yield request
    finally:
        waiter.cancel()
        withdraw()
