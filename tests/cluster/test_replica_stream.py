"""The leader's side of a replication stream (``serving._Stream``): records are sent as they are
committed without another request, each response continuing where the one before ended; an
acknowledgement moves the follower's log end (never past what was sent) and so the high
watermark, which the follower is then told; a follower that stops answering is held caught up
no longer than the fetch wait; a new leadership or a divergence ends the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tests.cluster.test_replication import publish, replicas, stand_in_node

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.broker import Partition
from tidelog.cluster import serving
from tidelog.cluster.leader_epochs import EpochEntry
from tidelog.cluster.replication import FetchAnswer, LeaderReplica, record_crc
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.serving import FetchServer
from tidelog.cluster.stored import StoredRecords
from tidelog.errors import NotLeader, StaleEpoch
from tidelog.log.record import encode_batch
from tidelog.wire import columns

WAIT_MS = 200


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def acks_from(
    queue: asyncio.Queue[cpb.ReplicaFetchRequest | None],
) -> AsyncIterator[cpb.ReplicaFetchRequest]:
    while (ack := await queue.get()) is not None:
        yield ack


def offsets_of(response: cpb.ReplicaFetchResponse) -> list[int]:
    """The offsets of the records a response carries (from their stored headers)."""
    sizes = columns.unpack_int64(response.stored_sizes) if response.stored_sizes else []
    found, at = [], 0
    for size in sizes:
        found.append(int.from_bytes(response.stored_records[at + 8 : at + 16], "little"))
        at += int(size)
    return found


class Harness:
    """A leader replica of partition s/0 served by a ``FetchServer``, with follower ``b``."""

    def __init__(self, part: Partition, clock: Clock) -> None:
        self.role = PartitionRole(stand_in_node("a"), part)  # type: ignore[arg-type]
        self.leader = LeaderReplica(
            part, "a", 1, isr=["a", "b"], min_isr=2, clock=clock, on_advance=self.role._release
        )
        self.role.leader = self.leader
        host = SimpleNamespace(
            roles={("s", 0): self.role}, settings=SimpleNamespace(fetch_wait_ms=WAIT_MS)
        )
        self.server = FetchServer(host)  # type: ignore[arg-type]
        self.acks: asyncio.Queue[cpb.ReplicaFetchRequest | None] = asyncio.Queue()

    def open(self, fetch_offset: int = 0) -> AsyncIterator[bytes]:
        first = cpb.ReplicaFetchRequest(
            stream="s",
            partition=0,
            follower="b",
            leader_epoch=1,
            fetch_offset=fetch_offset,
            max_wait_ms=WAIT_MS,
        )
        return self.server.serve_stream(first, acks_from(self.acks))

    def ack(self, log_end: int) -> None:
        self.acks.put_nowait(cpb.ReplicaFetchRequest(fetch_offset=log_end))


async def next_of(responses: AsyncIterator[bytes]) -> cpb.ReplicaFetchResponse:
    """The stream's next response, parsed as the follower parses it (the leader sends them
    serialised)."""
    return cpb.ReplicaFetchResponse.FromString(await asyncio.wait_for(anext(responses), 2))


def test_records_are_sent_as_committed_and_acknowledgements_move_the_high_watermark(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0", b"v1")
            responses = h.open()
            first = await next_of(responses)
            assert offsets_of(first) == [0, 1]
            assert first.high_watermark == -1  # b holds nothing yet
            # No request in between: the next records come as they are committed, from 2 on.
            await publish(parts["a"], b"v2")
            assert offsets_of(await next_of(responses)) == [2]
            await publish(parts["a"], b"v3", b"v4")
            assert offsets_of(await next_of(responses)) == [3, 4]
            # Acknowledgements: the high watermark follows them, and b is told at once.
            ack_wait = asyncio.create_task(h.role.replicated(1))
            h.ack(2)
            told = await next_of(responses)
            assert offsets_of(told) == [] and told.high_watermark == 1
            assert not told.answer, "a high watermark alone is not to be acknowledged"
            await asyncio.wait_for(ack_wait, 2)
            h.ack(5)
            assert (await next_of(responses)).high_watermark == 4
            assert h.leader.follower_ends() == {"b": 5}
            await responses.aclose()

    asyncio.run(main())


def test_an_acknowledgement_never_claims_more_than_was_sent(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0", b"v1")
            responses = h.open()
            assert offsets_of(await next_of(responses)) == [0, 1]
            h.ack(1_000)  # a follower claiming records it was never sent
            told = await next_of(responses)
            assert told.high_watermark == 1
            assert h.leader.follower_ends() == {"b": 2}
            await responses.aclose()

    asyncio.run(main())


def test_at_most_a_window_is_sent_ahead_of_the_acknowledgements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            monkeypatch.setattr(serving, "STREAM_WINDOW", 1)  # one response ahead at most
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0")
            responses = h.open()
            assert offsets_of(await next_of(responses)) == [0]
            await publish(parts["a"], b"v1")
            pending = asyncio.ensure_future(next_of(responses))
            await asyncio.sleep(0.05)
            assert not pending.done(), "sent past the window"
            h.ack(1)
            assert offsets_of(await pending) == [1]
            await responses.aclose()

    asyncio.run(main())


def test_a_follower_that_stops_answering_is_held_caught_up_only_for_the_fetch_wait(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            clock = Clock()
            h = Harness(parts["a"], clock)
            await publish(parts["a"], b"v0")
            responses = h.open()
            await next_of(responses)
            h.ack(1)
            assert (await next_of(responses)).high_watermark == 0
            pending = asyncio.ensure_future(next_of(responses))  # the leader waits for news
            await asyncio.sleep(0.05)
            clock.now += 100  # far past any lag bound: b waits at the end, caught up
            assert h.leader.caught_up("b", 10)
            # Nothing for the fetch wait: a response it must answer; until it does, it is not
            # held, and its lag counts from its last acknowledgement.
            keepalive = await pending
            assert offsets_of(keepalive) == [] and keepalive.answer
            assert not h.leader.caught_up("b", 10)
            h.ack(1)
            pending = asyncio.ensure_future(next_of(responses))
            await asyncio.sleep(0.05)
            assert h.leader.caught_up("b", 10)
            pending.cancel()

    asyncio.run(main())


def test_a_follower_keeping_pace_under_a_stream_of_appends_stays_caught_up(
    tmp_path: Path,
) -> None:
    """Several responses in flight: each acknowledgement holds what the leader had when the
    response it covers was sent, so the follower's catching up is timed by that."""

    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            clock = Clock()
            h = Harness(parts["a"], clock)
            await publish(parts["a"], b"v0")
            responses = h.open()
            await next_of(responses)
            end = 1
            for n in range(1, 6):
                await publish(parts["a"], b"v%d" % n)  # appended while the last is in flight
                assert offsets_of(await next_of(responses)) == [n]
                clock.now += 3
                h.ack(end)  # the one before: never quite at the leader's end
                end += 1
                await asyncio.sleep(0.01)
                assert h.leader.caught_up("b", 4), f"dropped behind at {n}"
            await responses.aclose()

    asyncio.run(main())


def test_a_step_down_ends_the_stream_with_not_leader(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0")
            responses = h.open()
            await next_of(responses)
            h.role.step_down()
            with pytest.raises(NotLeader):
                await next_of(responses)

    asyncio.run(main())


def test_a_new_leader_epoch_ends_the_stream_as_stale(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0")
            responses = h.open()
            await next_of(responses)
            h.role.leader = LeaderReplica(parts["a"], "a", 2, isr=["a", "b"])
            parts["a"].signal.fire()
            with pytest.raises(StaleEpoch):
                await next_of(responses)

    asyncio.run(main())


def test_a_divergence_is_answered_and_ends_the_stream(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0")
            await publish(parts["b"], b"foreign")  # offset 0 of b: a record a never wrote
            first = cpb.ReplicaFetchRequest(
                stream="s",
                partition=0,
                follower="b",
                leader_epoch=1,
                fetch_offset=1,
                max_wait_ms=WAIT_MS,
                previous_crc=record_crc(parts["b"], 0),
            )
            responses = h.server.serve_stream(first, acks_from(h.acks))
            answer = await next_of(responses)
            assert answer.diverged and offsets_of(answer) == []
            with pytest.raises(StopAsyncIteration):
                await next_of(responses)

    asyncio.run(main())


@pytest.mark.parametrize("count", [0, 1, 3, 2_000])
@pytest.mark.parametrize("ask", [False, True])
def test_a_stream_response_is_serialised_as_protobuf_would(count: int, ask: bool) -> None:
    # The stream appends the records to the small fields by hand: parsed back, the message is
    # the one protobuf builds from the same answer, and so is its canonical serialisation.
    values = [b"v" * (n % 300) for n in range(count)]
    batch = encode_batch(values, np.arange(7, 7 + count, dtype=np.int64), 11, 1 << 20)
    records = StoredRecords(batch.data.tobytes(), batch.sizes) if count else StoredRecords()
    answer = FetchAnswer(
        3, 2**40 + 5, records, [EpochEntry(2, 0), EpochEntry(3, 7)], log_start=-1, diverged=ask
    )
    expected = serving._response(answer)
    expected.answer = ask
    parsed = cpb.ReplicaFetchResponse.FromString(serving._serialized(answer, ask=ask))
    assert parsed == expected
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )
    assert offsets_of(parsed) == list(range(7, 7 + count))


def test_a_send_that_finds_no_records_waits_rather_than_spins(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a") as parts:
            h = Harness(parts["a"], Clock())
            await publish(parts["a"], b"v0", b"v1")
            responses = h.open()
            assert offsets_of(await next_of(responses)) == [0, 1]
            await publish(parts["a"], b"v2")
            leader = h.leader

            asked = 0

            def finds_nothing(*args: object, **kwargs: object) -> FetchAnswer:
                nonlocal asked
                asked += 1
                if asked > 50:  # a spinning stream never gives the loop back: end it here
                    raise RuntimeError("asked again and again without waiting")
                return FetchAnswer(1, leader.high_watermark, StoredRecords(), [], 0)

            leader.send = finds_nothing  # type: ignore[method-assign]
            sent: list[bytes] = []

            async def take() -> None:
                async for response in responses:
                    sent.append(response)

            taking = asyncio.create_task(take())
            await asyncio.sleep(WAIT_MS / 2000)  # half the fetch wait: nothing to say yet
            taking.cancel()
            (ended,) = await asyncio.gather(taking, return_exceptions=True)
            assert sent == [] and asked <= 2, (len(sent), asked, ended)

    asyncio.run(main())
