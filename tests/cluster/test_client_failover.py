"""Every client path follows a partition's new leader after a ``kill -9`` of the old one, while
the killed broker stays down (issue 22).

etcd and three brokers on loopback at the production lease (3 s: the election comes about 3 s
after the kill), a stream of 3 partitions with 3 replicas and minIsr 2, and ``__cursors`` with 3
partitions, so the broker that leads partition 0 also leads one of ``__cursors``. Each path has
a client of its own (a client that learnt the new leader on one path would otherwise help the
others) and is used once before the kill, so its route to the leader and its connection exist
as an application's would. After the kill each path repeats its operation, as an application
retries, until one succeeds; the time from the kill to that success must be within
``FAILOVER_S``. Once with the clients given the broker that is killed (calls any broker takes
must move on too), once given a survivor.

A ``consumer()`` opened on the broker the client was given, leader or not (refused as not the
leader when it was not), until it opened at the partition's leader. Before the fix a plain
publish and a ``publisher`` kept going to the dead broker until it came back (still failing
after 9 s, where idempotent publishes recovered in about 3 s); given the dead broker, cursors,
views and ``list_groups`` failed until then too; and given another broker, a ``publisher``
could not publish at all (it opened its stream on the broker it was given).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.cluster.clustertools import Cluster, running_cluster, wait_for

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.client import AsyncClient, ClientSettings, ReceivedBatch, View
from tidelog.wire import CURSORS_STREAM

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback

FAILOVER_S = 5.0
"""The target: every path succeeds against the new leader this soon after the kill."""
GIVE_UP_S = 9.0
"""How long a path is retried after the kill before it counts as never recovered (``inf``)."""
ENV = {"TIDELOG_CLUSTER_LEASE_TTL_S": "3", "TIDELOG_CURSOR_PARTITIONS": "3"}
PARTITIONS = 3

Operation = Callable[[], Awaitable[None]]


@dataclass
class Outcome:
    seconds: float = math.inf
    attempts: int = 0
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        last = f", last error: {self.errors[-1][:160]}" if self.errors else ""
        return f"{self.seconds:.2f} s after {self.attempts} attempts{last}"


async def until_success(operation: Operation, killed_at: float) -> Outcome:
    """Repeat ``operation`` as an application would (50 ms between failures) until it
    succeeds; the seconds from ``killed_at`` to that success."""
    outcome = Outcome()
    while (left := killed_at + GIVE_UP_S - time.monotonic()) > 0:
        outcome.attempts += 1
        try:
            await asyncio.wait_for(operation(), left)
        except AssertionError:
            raise
        except Exception as error:  # a ClientError, the timeout, or what a client let escape
            outcome.errors.append(f"{type(error).__name__}: {error}")
            await asyncio.sleep(0.05)
            continue
        outcome.seconds = time.monotonic() - killed_at
        break
    return outcome


def key_in(partition: int, prefix: bytes, count: int = PARTITIONS) -> bytes:
    """A key that CRC-32 places in ``partition`` of ``count``."""
    return next(
        key for n in range(10_000) if zlib.crc32(key := prefix + b"%d" % n) % count == partition
    )


def cursor_in(partition: int, count: int) -> str:
    """A cursor id of stream ``s`` partition 0 kept in ``__cursors`` partition ``partition``."""
    return next(
        cursor
        for n in range(10_000)
        if zlib.crc32(f"{(cursor := f'c{n}')},s,0".encode()) % count == partition
    )


async def following(batches: AsyncIterator[ReceivedBatch], arrivals: list[float]) -> None:
    """Note when each message published after the kill (values ``after…``) arrives."""
    async for batch in batches:
        if any(message.value.startswith(b"after") for message in batch):
            arrivals.append(time.monotonic())


async def run(cluster: Cluster, given: str) -> dict[str, Outcome]:
    """The paths' outcomes, their clients given broker ``given`` ("leader": the one killed)."""
    view_key = key_in(0, b"k")
    async with AsyncClient(
        cluster.servers["b1"].address, settings=ClientSettings(ack_all=True)
    ) as admin:
        await admin.create_stream(
            "s",
            partitions=PARTITIONS,
            replication_factor=3,
            min_isr=2,
            views=[View.table("latest")],
        )
        await admin.set_cursor("first", "s", 0, 0)  # creates __cursors
        await admin.publish("s", b"v", key=view_key)  # every replica has it: ack ALL
    leader = cluster.partition("s", 0).leader
    cursors = cluster.metadata(CURSORS_STREAM).partitions
    led = [n for n, p in cursors.items() if p.leader == leader]
    assert led, f"{leader} leads no partition of __cursors: {cursors}"
    cursor = cursor_in(led[0], len(cursors))
    survivor = next(b for b in sorted(cluster.servers) if b != leader)
    address = cluster.servers[leader if given == "leader" else survivor].address
    cluster.api(survivor).JoinConsumerGroup(
        pb.JoinConsumerGroupRequest(groupId="g", consumerId="m", streams=["s"]), timeout=10
    )

    names = ("publish", "publish_batch", "idempotent", "publisher", "subscription")
    names += ("open_subscription", "consumer", "cursor", "view", "list_groups")
    async with contextlib.AsyncExitStack() as stack:
        c = {n: await stack.enter_async_context(AsyncClient(address)) for n in names}
        await c["publish"].publish("s", b"before", partition=0)
        await c["publish_batch"].publish_batch("s", [b"before"], partition=0)
        await c["idempotent"].publish_batch(
            "s", [b"before"], partition=0, producer_id="p", producer_sequence=0
        )
        publisher = await stack.enter_async_context(c["publisher"].publisher("s", 0))
        await publisher.publish([b"before"])
        await (await c["open_subscription"].open_subscription("s", 0)).aclose()
        async with c["consumer"].consumer("s", 0, start="earliest") as consuming:
            assert await consuming.receive(timeout=5) is not None, "the consumer got nothing"
        await c["cursor"].set_cursor(cursor, "s", 0, 1)
        assert await c["cursor"].fetch_cursor(cursor, "s", 0) == 1
        entry = await c["view"].view_get("s", "latest", view_key)
        assert entry is not None and entry.value == b"v"
        assert [g.group_id for g in await c["list_groups"].list_groups()] == ["g"]
        arrivals: list[float] = []
        batches = await c["subscription"].open_subscription("s", 0, start="earliest")
        stack.push_async_callback(batches.aclose)
        live = asyncio.create_task(following(batches, arrivals))

        async def stop_following() -> None:  # before the aclose above
            live.cancel()
            await asyncio.gather(live, return_exceptions=True)

        stack.push_async_callback(stop_following)
        sequence = 0
        offsets = 2

        async def publish() -> None:
            assert (await c["publish"].publish("s", b"after-1", partition=0)).partition == 0

        async def publish_batch() -> None:
            await c["publish_batch"].publish_batch("s", [b"after-2", b"after-3"], partition=0)

        async def idempotent() -> None:
            nonlocal sequence
            sequence += 1  # a new batch each time: the failed one may not have been stored
            await c["idempotent"].publish_batch(
                "s", [b"after-4"], partition=0, producer_id="p", producer_sequence=sequence
            )

        async def publish_stream() -> None:
            await publisher.publish([b"after-5"])

        async def subscription() -> None:
            while not arrivals:
                if live.done():
                    live.result()  # its error
                    raise AssertionError("the subscription ended")
                await asyncio.sleep(0.01)

        async def open_subscription() -> None:
            opened = await c["open_subscription"].open_subscription("s", 0, start="earliest")
            await opened.aclose()

        async def consumer() -> None:
            async with c["consumer"].consumer("s", 0, start="earliest") as consuming:
                if await consuming.receive(timeout=2) is None:
                    raise TimeoutError("the consumer got nothing in 2 s")

        async def cursor_call() -> None:
            nonlocal offsets
            offsets += 1
            await c["cursor"].set_cursor(cursor, "s", 0, offsets)
            assert await c["cursor"].fetch_cursor(cursor, "s", 0) == offsets

        async def view() -> None:
            found = await c["view"].view_get("s", "latest", view_key)
            assert found is not None and found.value == b"v"

        async def list_groups() -> None:
            assert [g.group_id for g in await c["list_groups"].list_groups()] == ["g"]

        operations: dict[str, Operation] = {
            "publish": publish,
            "publish_batch": publish_batch,
            "idempotent": idempotent,
            "publisher": publish_stream,
            "subscription": subscription,
            "open_subscription": open_subscription,
            "consumer": consumer,
            "cursor": cursor_call,
            "view": view,
            "list_groups": list_groups,
        }
        killed_at = time.monotonic()
        cluster.kill(leader)
        outcomes = await asyncio.gather(
            *(until_success(op, killed_at) for op in operations.values())
        )
    assert not cluster.alive(leader), "the killed broker came back"
    new = cluster.partition("s", 0).leader
    assert new not in ("", leader), f"partition 0 is led by {new!r}"
    async with AsyncClient(cluster.servers[survivor].address) as reader:
        stored = reader.subscribe("s", 0, start="earliest", stop="latest")
        values = [m.value async for m in stored]
    for plain in (b"after-1", b"after-2", b"after-3"):  # a plain publish is never doubled
        assert values.count(plain) <= 1, (plain, values)
    return dict(zip(operations, outcomes, strict=True))


@pytest.mark.parametrize("given", ["leader", "survivor"])
def test_every_path_follows_a_killed_leader_within_the_target(tmp_path: Path, given: str) -> None:
    with running_cluster(tmp_path, env=ENV) as cluster:
        wait_for(lambda: len(cluster.live()) == 3, 10, "three brokers")
        outcomes = asyncio.run(run(cluster, given))
    report = "\n".join(f"  {name}: {outcome}" for name, outcome in outcomes.items())
    print(f"given the {given}, seconds from the kill to a success:\n{report}")
    late = [name for name, outcome in outcomes.items() if outcome.seconds > FAILOVER_S]
    assert not late, f"late or never, given the {given} ({late}):\n{report}"
