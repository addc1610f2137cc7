"""The follower's side of a replication stream that breaks (``ReplicaFetcher.follow``): the next
stream opens at the follower's log end after the last answer it applied, not where the broken
one had opened. (Opening at the old offset, with the CRC of the follower's real newest record,
made the leader answer a divergence that cut a committed record, or, from 0, made every append
fail out of range, for ever.) And the loop ends when cancelled, even as a read completes (Python
3.11's ``asyncio.wait_for`` lost such a cancellation and the loop followed on)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
from tests.cluster.test_replica_stream import Clock, Harness, acks_from
from tests.cluster.test_replication import publish, replicas, stand_in_node

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.cluster.follower import ReplicaFetcher
from tidelog.cluster.replication import FollowerReplica
from tidelog.cluster.roles import PartitionRole


class LeaderCall:
    """One replication stream as the follower's stub sees it, served by the harness's leader;
    ``breaks_after`` responses with records, then the stream ends (``EOF``)."""

    def __init__(self, harness: Harness, opened: list[cpb.ReplicaFetchRequest], breaks: int):
        self._harness = harness
        self._opened = opened
        self._breaks = breaks
        self._acks: asyncio.Queue[cpb.ReplicaFetchRequest | None] = asyncio.Queue()
        self._responses: AsyncIterator[bytes] | None = None

    async def write(self, request: cpb.ReplicaFetchRequest) -> None:
        if self._responses is None:
            self._opened.append(request)
            self._responses = self._harness.server.serve_stream(request, acks_from(self._acks))
        else:
            self._acks.put_nowait(request)

    async def read(self) -> Any:
        assert self._responses is not None
        if self._breaks == 0:
            return grpc.aio.EOF
        response = cpb.ReplicaFetchResponse.FromString(await anext(self._responses))
        if response.stored_records:
            self._breaks -= 1
        return response

    def cancel(self) -> None:
        self._acks.put_nowait(None)


class LeaderChannel:
    """What ``ReplicationStub`` asks of a channel, answered by the harness's leader: the first
    stream breaks after one answer with records, the later ones stay open."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.opened: list[cpb.ReplicaFetchRequest] = []

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        async def offset_for_leader_epoch(request: Any, timeout: float = 0) -> Any:
            end = self.harness.leader.end_offset_for(request.epoch)
            return cpb.OffsetForLeaderEpochResponse(epoch=end.epoch, end_offset=end.end_offset)

        return offset_for_leader_epoch

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def open_stream() -> LeaderCall:
            breaks = 1 if not self.opened else -1
            return LeaderCall(self.harness, self.opened, breaks)

        return open_stream

    unary_stream = stream_unary = unary_unary


def test_a_broken_stream_reopens_at_the_follower_log_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with replicas(tmp_path, "a", "b") as parts:
            harness = Harness(parts["a"], Clock())
            for i in range(4):
                await publish(parts["a"], *(b"v%d-%d" % (i, j) for j in range(5)))
            role = PartitionRole(stand_in_node("b"), parts["b"])  # type: ignore[arg-type]
            role.follower = FollowerReplica(parts["b"], "b")
            channel = LeaderChannel(harness)
            host = SimpleNamespace(
                view=SimpleNamespace(brokers={"a": "leader-a"}),
                settings=SimpleNamespace(poll_s=0.01, fetch_wait_ms=200),
                broker_id="b",
                fetch_delay_s=0.0,
                channel=lambda address: channel,
            )
            following = asyncio.create_task(ReplicaFetcher(host).follow(role, "a", 1))  # type: ignore[arg-type]
            try:
                for _ in range(200):
                    if len(channel.opened) >= 2:
                        break
                    await asyncio.sleep(0.01)
                assert [r.fetch_offset for r in channel.opened] == [0, 20]
                assert parts["b"].log.next_offset == 20
                assert role.follower.divergences == 0
            finally:
                following.cancel()
                done, _ = await asyncio.wait([following], timeout=5)
            assert done, "the follow loop went on after it was cancelled"

    asyncio.run(main())
