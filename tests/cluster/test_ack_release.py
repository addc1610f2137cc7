"""Publishes with ack ALL waiting for the ISR (``PartitionRole.replicated``) are released by
the high watermark itself: each as soon as it reaches the publish's offset, all of them in one
pass, none before; and all at once when the leadership ends. Released means within a few turns
of the event loop, with no timer (the waits re-check the leadership only every 0.5 s). Waits
that time out leave no entries piling up behind them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.cluster.test_replication import publish, replicas, stand_in_node

from tidelog.cluster.replication import LeaderReplica
from tidelog.cluster.roles import PartitionRole
from tidelog.errors import NotEnoughReplicas


async def turns(count: int = 10) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_acks_are_released_by_the_high_watermark_in_offset_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            role = PartitionRole(stand_in_node("a"), parts["a"])  # type: ignore[arg-type]
            leader = LeaderReplica(
                parts["a"], "a", 1, isr=["a", "b"], min_isr=2, on_advance=role._release
            )
            role.leader = leader
            await publish(parts["a"], *(b"v%d" % i for i in range(6)))
            waits = {offset: asyncio.create_task(role.replicated(offset)) for offset in (4, 0, 2)}
            await turns()
            assert not any(w.done() for w in waits.values()), "b has copied nothing"
            leader.fetch("b", 1, 3)  # b holds 0..2
            await turns()
            assert waits[0].done() and waits[2].done() and not waits[4].done()
            leader.fetch("b", 1, 4)  # 0..3: not yet
            await turns()
            assert not waits[4].done()
            leader.fetch("b", 1, 6)
            await turns()
            assert waits[4].done()
            for wait in waits.values():
                await wait  # acknowledged, no error
            assert role._acks == []
            await role.replicated(5)  # already copied: at once

            later = asyncio.create_task(role.replicated(6))
            await publish(parts["a"], b"v6")
            await turns()
            assert not later.done()
            role.step_down()
            await turns()
            assert later.done()
            with pytest.raises(NotEnoughReplicas, match="may be stored"):
                await later

    asyncio.run(main())


def test_waits_that_time_out_leave_no_entries_behind(tmp_path: Path) -> None:
    """While the ISR is below ``min_isr`` the high watermark stands still and every ack wait
    times out; publishes retried again and again must not pile entries up in the heap of waits,
    and a wait still running is released as before."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            node = stand_in_node("a")
            settings = node.settings
            role = PartitionRole(node, parts["a"])  # type: ignore[arg-type]
            leader = LeaderReplica(
                parts["a"], "a", 1, isr=["a", "b"], min_isr=2, on_advance=role._release
            )
            role.leader = leader
            await publish(parts["a"], *(b"v%d" % i for i in range(6)))
            live = asyncio.create_task(role.replicated(0))  # waits 5 s
            await turns()
            leader.set_isr(["a"])  # below min_isr: the high watermark stands still
            settings.ack_timeout_s = 0.001
            most = 0
            for round_ in range(20):
                if round_ % 2:
                    waits = [role.replicated(o % 6) for o in range(20)]  # at once
                    outcomes = await asyncio.gather(*waits, return_exceptions=True)
                else:
                    outcomes = []
                    for offset in range(20):  # one after the other
                        try:
                            await role.replicated(5 - offset % 6)
                        except NotEnoughReplicas as e:
                            outcomes.append(e)
                        most = max(most, len(role._acks))
                assert len(outcomes) == 20
                assert all(isinstance(o, NotEnoughReplicas) for o in outcomes)
                most = max(most, len(role._acks))
            assert most <= 41, f"400 timed-out waits left up to {most} entries"
            assert len(role._acks) <= 2 and not live.done()
            leader.set_isr(["a", "b"])
            leader.fetch("b", 1, 6)
            await turns()
            assert live.done()
            await live
            assert role._acks == []

    asyncio.run(main())


def test_an_older_sequence_is_answered_only_once_the_producers_latest_batch_is_replicated(
    tmp_path: Path,
) -> None:
    """A leader holding a producer's later batch uncommitted (it arrived first) must not answer
    an earlier sequence as a stored duplicate before that batch is copied: a leader deposed in
    between would have acknowledged what no other replica holds."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            part = parts["a"]
            role = PartitionRole(stand_in_node("a"), part)  # type: ignore[arg-type]
            leader = LeaderReplica(
                part, "a", 1, isr=["a", "b"], min_isr=2, on_advance=role._release
            )
            role.leader = leader
            part.role = role
            later = asyncio.create_task(part.publish_idempotent([b"one"], "z", 1, durable=True))
            await turns(50)
            assert not later.done(), "b has copied nothing"
            earlier = asyncio.create_task(part.publish_idempotent([b"zero"], "z", 0, durable=True))
            await asyncio.sleep(0.3)  # its sync runs in a thread
            assert not earlier.done(), "answered as stored before the later batch was copied"
            leader.fetch("b", 1, part.log.next_offset)  # b holds everything
            published = await asyncio.wait_for(earlier, 5)
            assert published.duplicate and (await asyncio.wait_for(later, 5)).offsets == range(1)

    asyncio.run(main())
