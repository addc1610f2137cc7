"""The delivery gate (broker/delivery.py): at most ``turns`` holders, first come first served, a
stalled holder loses its turn, a cancelled waiter neither holds nor loses one. Driven on a real
loop with short stall times; every wait is bounded."""

from __future__ import annotations

import asyncio

import pytest

from tidelog.broker.delivery import DeliveryGate, delivery_gate


def run(coroutine: object) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 5.0))  # type: ignore[arg-type]


def test_at_most_turns_holders_and_first_come_first_served() -> None:
    async def scenario() -> None:
        gate = DeliveryGate(asyncio.get_running_loop(), turns=2, stall_s=10.0)
        first, second = await gate.turn(), await gate.turn()
        assert gate.held == 2
        order: list[int] = []

        async def wait(n: int) -> None:
            turn = await gate.turn()
            order.append(n)
            turn.release()

        waiters = [asyncio.create_task(wait(n)) for n in range(3)]
        await asyncio.sleep(0.01)
        assert order == [] and gate.waiting == 3
        first.release()
        first.release()  # a second release is a no-op
        await asyncio.gather(*waiters)
        assert order == [0, 1, 2]
        assert gate.held == 1
        second.release()
        assert gate.held == 0

    run(scenario())


def test_a_stalled_holder_loses_its_turn_and_a_progressing_one_keeps_it() -> None:
    async def scenario() -> None:
        gate = DeliveryGate(asyncio.get_running_loop(), turns=1, stall_s=0.05)
        busy = await gate.turn()
        for _ in range(6):  # 0.12 s of steady progress: longer than stall_s in total
            await asyncio.sleep(0.02)
            busy.progress()
        assert busy.held and gate.held == 1
        waiter = asyncio.create_task(gate.turn())
        stuck_for = asyncio.get_running_loop().time()
        nxt = await waiter  # busy stops making progress: it stalls and its turn moves on
        assert not busy.held
        assert asyncio.get_running_loop().time() - stuck_for >= 0.04
        busy.release()  # the late holder finishing its chunk does not free a second turn
        assert gate.held == 1 and nxt.held
        nxt.release()
        assert gate.held == 0

    run(scenario())


def test_a_cancelled_waiter_takes_no_turn() -> None:
    async def scenario() -> None:
        gate = DeliveryGate(asyncio.get_running_loop(), turns=1, stall_s=10.0)
        holder = await gate.turn()
        gone = asyncio.create_task(gate.turn())
        later = asyncio.create_task(gate.turn())
        await asyncio.sleep(0.01)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        holder.release()
        turn = await later
        assert gate.held == 1
        turn.release()
        assert gate.held == 0 and gate.waiting == 0

    run(scenario())


def test_one_gate_per_loop() -> None:
    async def gate() -> DeliveryGate:
        first = delivery_gate()
        assert delivery_gate() is first
        return first

    assert asyncio.run(gate()) is not asyncio.run(gate())


def test_bad_settings_are_refused() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError):
            DeliveryGate(asyncio.get_running_loop(), turns=0)

    run(scenario())


def test_one_timer_watches_every_holder() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gate = DeliveryGate(loop, turns=2, stall_s=0.05)
        for _ in range(100):  # a live subscriber: a turn per frame, each released at once
            gate._grant().release()
        assert gate._timer is not None  # one timer armed, not one per turn
        early = await gate.turn()
        await asyncio.sleep(0.02)
        late = await gate.turn()
        started = loop.time()
        lost: dict[str, float] = {}
        last_progress = started
        while late.held and loop.time() - started < 2.0:
            await asyncio.sleep(0.01)
            if loop.time() - started < 0.06:
                late.progress()  # keeps its turn while it makes progress
                last_progress = loop.time()
            for name, turn in (("early", early), ("late", late)):
                if not turn.held:
                    lost.setdefault(name, loop.time())
        assert gate.held == 0 and lost["early"] <= lost["late"]
        assert lost["late"] - last_progress >= 0.04  # only once it had stopped for stall_s
        assert gate._timer is None  # nobody holds a turn: nothing to watch

    run(scenario())
