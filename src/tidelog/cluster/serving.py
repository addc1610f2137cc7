"""The leader's side of replication: the answers to its followers' ``ReplicaFetch`` and
``OffsetForLeaderEpoch`` (the follower's side is ``follower.py``).

Invariants. Only this broker's current leader replica of a partition answers (``leading``:
anything else is ``NotLeader``, and a request for another leader epoch is ``StaleEpoch``). A
fetch is answered at once when it has records, a divergence, or a high watermark the follower
does not know; otherwise it is held at most this leader's own fetch wait, during which the
follower counts caught up (``LeaderReplica.hold``), and answered as soon as either arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Protocol

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.cluster.replication import FETCH_MAX_RECORDS, FetchAnswer, LeaderReplica
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.settings import ClusterSettings
from tidelog.errors import NotLeader, StaleEpoch
from tidelog.wire import columns


class ServingHost(Protocol):
    """What the leader's side needs of the node: its replica roles and settings."""

    @property
    def roles(self) -> Mapping[tuple[str, int], PartitionRole]: ...

    @property
    def settings(self) -> ClusterSettings: ...


class FetchServer:
    """Answers followers from this broker's leader replicas."""

    def __init__(self, host: ServingHost) -> None:
        self._host = host

    def leading(self, stream: str, number: int) -> LeaderReplica:
        """This broker's leader replica of ``stream``/``number``, or ``NotLeader`` naming the
        leader as the role knows it."""
        role = self._host.roles.get((stream, number))
        if role is None:
            raise NotLeader(stream, number)
        if role.leader is None:
            raise role.refusal()
        return role.leader

    async def serve_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        """The leader's side of ``ReplicaFetch``: answer at once when there are records or a
        high watermark the follower does not know, else wait up to ``max_wait_ms`` for either."""
        leader = self.leading(request.stream, request.partition)
        max_records = request.max_records or FETCH_MAX_RECORDS
        wake = leader.partition.signal.current()
        previous_crc = request.previous_crc if request.HasField("previous_crc") else None
        answer = leader.fetch(
            request.follower,
            request.leader_epoch,
            request.fetch_offset,
            max_records,
            previous_crc=previous_crc,
        )
        # A follower must learn a completed publish at once, for reads from it (ReadISRReplica):
        # a high watermark above the one it knows is news, as records are. That includes the
        # one its own fetch just raised, and one another follower's fetch raises while it waits.
        # What it can take of it: a follower keeps no high watermark past its own log end.
        known = request.high_watermark if request.HasField("high_watermark") else None
        if known is None:
            known = answer.high_watermark  # an older follower: what this answer would tell it
        reach = request.fetch_offset - 1

        def news(answer: FetchAnswer) -> bool:
            return bool(answer.records) or min(answer.high_watermark, reach) > known

        # Held at most this leader's own wait: a follower counts caught up while held.
        wait_ms = min(request.max_wait_ms, self._host.settings.fetch_wait_ms)
        if news(answer) or wait_ms <= 0 or answer.diverged:
            return _response(answer)
        # While it waits here the follower has everything: it stays caught up (in the ISR)
        # however long the wait, which only sets how often an idle follower asks.
        held = leader
        held.hold(request.follower)
        try:
            deadline = time.monotonic() + wait_ms / 1000
            while (remaining := deadline - time.monotonic()) > 0:
                await asyncio.wait([wake], timeout=remaining)
                leader = self.leading(request.stream, request.partition)
                wake = leader.partition.signal.current()
                answer = leader.fetch(
                    request.follower,
                    request.leader_epoch,
                    request.fetch_offset,
                    max_records,
                    again=True,
                )
                if news(answer):
                    break
        finally:
            held.release(request.follower)
        return _response(answer)

    def serve_epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        leader = self.leading(request.stream, request.partition)
        if request.leader_epoch != leader.leader_epoch:
            raise StaleEpoch(request.leader_epoch, leader.leader_epoch)
        end = leader.end_offset_for(request.epoch)
        return cpb.OffsetForLeaderEpochResponse(epoch=end.epoch, end_offset=end.end_offset)


def _response(answer: FetchAnswer) -> cpb.ReplicaFetchResponse:
    """``answer`` as sent to the follower (``follower._answer`` reads it)."""
    records = answer.records
    return cpb.ReplicaFetchResponse(
        leader_epoch=answer.leader_epoch,
        high_watermark=answer.high_watermark,
        epochs=[cpb.EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in answer.epochs],
        stored_records=records.data,
        stored_sizes=columns.pack_int64(records.sizes) if len(records) else b"",
        log_start_offset=answer.log_start,
        diverged=answer.diverged,
    )
