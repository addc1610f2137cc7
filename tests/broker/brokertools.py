"""Helpers for the in-process broker tests: a started broker, partitions with known contents, and
a driver that runs one subscription until it ends or waits.

No pytest-asyncio: the broker binds its commit signals to the loop that starts it, so a test
either runs ``asyncio.run`` around a broker of its own (``running``), or hands coroutines to a
broker kept on a private loop for a whole module (``LoopBroker``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.broker.subscribe_model import End, Rec

from tidelog.broker import Broker, BrokerConfig, Subscription
from tidelog.broker.subscription import SubscribeRequest, SubscriberState
from tidelog.errors import InvalidArgument, StopReached, StreamEmpty
from tidelog.log import FlushPolicy, LogConfig, NewRecord

T = TypeVar("T")

MS = 1_000_000
BASE_TS = 1_000 * MS
"""First timestamp the tests write (ns); records are 1 ms apart unless a batch shares one."""


def broker_config(data_dir: Path, **overrides: object) -> BrokerConfig:
    """No background flusher, no age retention (tests write 1970 timestamps), no maintenance."""
    log = LogConfig(flush_policy=FlushPolicy.NEVER, retention_age_s=None)
    settings: dict[str, object] = {
        "data_dir": str(data_dir),
        "log": log,
        "maintenance_interval_s": 3600.0,
    }
    settings.update(overrides)
    return BrokerConfig(**settings)  # type: ignore[arg-type]


class LoopBroker:
    """A broker kept running on a private event loop across several tests (a module fixture):
    tests hand coroutines to :meth:`run`. Each test uses its own stream, so they stay apart."""

    def __init__(self, config: BrokerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.broker = Broker(config)
        self.loop.run_until_complete(self.broker.start())
        self._names = 0

    def run(self, coroutine: Coroutine[object, object, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def new_stream_name(self) -> str:
        self._names += 1
        return f"s{self._names}"

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.broker.close())
        finally:
            self.loop.close()


@contextlib.asynccontextmanager
async def running(config: BrokerConfig) -> AsyncIterator[Broker]:
    broker = Broker(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.close()


async def settle(
    task: asyncio.Task[None], subscription: Subscription, *, quiet: int = 20, rounds: int = 10_000
) -> None:
    """Let the loop run until ``task`` ends, or its subscription has been waiting (live) for
    ``quiet`` loop iterations in a row: long enough for a wake-up already scheduled to be taken
    (a subscriber reads, delivers and goes back to waiting within one step of its task).

    Reads are synchronous on the loop, so this needs no clock; ``rounds`` only bounds a
    subscription that never settles, which is then reported.
    """
    live_for = 0
    for _ in range(rounds):
        await asyncio.sleep(0)
        if task.done():
            return
        live_for = live_for + 1 if subscription.state is SubscriberState.LIVE else 0
        if live_for >= quiet:
            return
    raise AssertionError(f"subscription neither ended nor went live ({subscription.state})")


@dataclass
class Run:
    """One subscription driven from the outside: what it delivered and how it ended."""

    subscription: Subscription | None
    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    error: BaseException | None = None

    def end(self) -> End:
        if self.subscription is None:
            return End.EMPTY if isinstance(self.error, StreamEmpty) else End.INVALID
        assert self.task is not None
        if not self.task.done():
            return End.WAITS
        error = self.task.exception()
        if error is None:
            return End.OLDEST
        if isinstance(error, StopReached):
            return End.STOP
        raise AssertionError(f"subscription ended with an unexpected error: {error!r}")

    async def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def start_run(
    broker: Broker, stream: str, request: SubscribeRequest, *, max_messages: int = 2
) -> Run:
    """Subscribe (errors raised at subscribe time are kept in ``Run.error``) and consume until
    the subscription ends or waits."""
    try:
        subscription = broker.subscribe(stream, 0, request, max_messages=max_messages)
    except (InvalidArgument, StreamEmpty) as error:
        return Run(None, error=error)
    run = Run(subscription)

    async def consume() -> None:
        async for batch in subscription.batches():
            run.offsets.extend(batch.offsets.tolist())
            run.values.extend(batch.values())

    run.task = asyncio.create_task(consume())
    await settle(run.task, subscription)
    return run


def value_of(offset: int, size: int = 0) -> bytes:
    return f"v{offset}".encode().ljust(size, b".")


def key_of(offset: int) -> bytes:
    return f"k{offset}".encode()


@dataclass
class Partition0:
    """Partition 0 of one stream, written through its log with timestamps the test chooses, and
    the records the test knows it wrote (the model; trimmed by :meth:`retain`)."""

    broker: Broker
    stream: str
    value_bytes: int = 0
    """Pad values to this size (to fill small segments)."""
    records: list[Rec] = field(default_factory=list)
    last_timestamp: int = BASE_TS

    def append(self, *batches: Sequence[int]) -> list[Rec]:
        """Append batches at the given offsets, one timestamp per batch, 1 ms after the last.
        Dense offsets go through ``append``; others through ``append_at`` (gaps stay gaps)."""
        log = self.broker.partition(self.stream, 0).log
        written: list[Rec] = []
        for offsets in batches:
            self.last_timestamp += MS
            stamp = self.last_timestamp
            messages = [NewRecord(value_of(o, self.value_bytes), key=key_of(o)) for o in offsets]
            first = log.next_offset
            if list(offsets) == list(range(first, first + len(offsets))):
                assert list(log.append(messages, timestamp=stamp)) == list(offsets)
            else:
                log.append_at(messages, list(offsets), timestamp=stamp)
            written += [(o, stamp) for o in offsets]
        self.records += written
        return written

    def retain(self) -> int:
        """Apply retention now; the model keeps what the log reports as retained."""
        log = self.broker.partition(self.stream, 0).log
        log.enforce_retention()
        oldest = log.oldest_offset
        self.records = [r for r in self.records if r[0] >= oldest]
        return oldest
