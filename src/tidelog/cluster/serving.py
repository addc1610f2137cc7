"""The leader's side of replication: its followers' replication streams (``ReplicaStream``),
and its answers to ``ReplicaFetch`` and ``OffsetForLeaderEpoch`` (the follower's side is
``follower.py``).

Invariants. Only this broker's current leader replica of a partition answers (``leading``:
anything else is ``NotLeader``, and a request for another leader epoch is ``StaleEpoch``). A
fetch is answered at once when it has records, a divergence, or a high watermark the follower
does not know; otherwise it is held at most this leader's own fetch wait, during which the
follower counts caught up (``LeaderReplica.hold``), and answered as soon as either arrives.

A replication stream is a fetch that goes on (:class:`_Stream`). Its first request is checked and
answered as a fetch; from then on the leader sends each run of committed records as soon as it
is committed, each response continuing where the one before ended, and the follower
acknowledges every response with records, once applied, with its log end. An acknowledgement
counts as a fetch's arrival (``LeaderReplica.acknowledge``: the follower's log end, whether it
has caught up); it can never claim more than the stream sent. At most :data:`STREAM_WINDOW`
bytes are sent beyond what the follower acknowledged. A response without records goes out when
the high watermark the follower may take (never past what it was sent) rises (not answered),
and when the stream sent nothing for the fetch wait (``answer`` set: the follower must
acknowledge it). A follower that acknowledged everything counts caught up (``hold``) only until
then, so one that stops answering leaves the ISR as a stopped fetcher does. Every wake-up looks
at the leadership again: a new leader or epoch ends the stream with the refusal a fetch gets.

Why a stream: a fetch per answer made the records appended while an answer was on its way (or
being applied) wait for the follower's next fetch, and cost a gRPC call on both ends for each;
the stream sends them at once and costs one message each way (``docs/performance.md``,
"Replication as a stream").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Final, Protocol

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog.broker import CommitSignal
from tidelog.cluster.replication import (
    FETCH_MAX_BYTES,
    FETCH_MAX_RECORDS,
    FetchAnswer,
    LeaderReplica,
)
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.settings import ClusterSettings
from tidelog.cluster.stored import StoredRecords
from tidelog.errors import NotLeader, StaleEpoch
from tidelog.wire import columns
from tidelog.wire.varints import uvarint

STREAM_WINDOW: Final = 2 * FETCH_MAX_BYTES
"""Record bytes a replication stream sends beyond what its follower has acknowledged."""


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

    def serve_stream(
        self, first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        """The leader's side of ``ReplicaStream``: ``first`` opened it (the caller checked whose
        it is), ``acks`` are the follower's acknowledgements (module docstring). Its responses
        come serialised (``ReplicaFetchResponse`` s, ``_serialized``): the service passes them
        through as they are."""
        wait_ms = min(first.max_wait_ms, self._host.settings.fetch_wait_ms)
        return _Stream(self, first, acks, wait_ms).responses()

    def serve_epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        leader = self.leading(request.stream, request.partition)
        if request.leader_epoch != leader.leader_epoch:
            raise StaleEpoch(request.leader_epoch, leader.leader_epoch)
        end = leader.end_offset_for(request.epoch)
        return cpb.OffsetForLeaderEpochResponse(epoch=end.epoch, end_offset=end.end_offset)


def _response(
    answer: FetchAnswer, *, ask: bool = False, records: bool = True
) -> cpb.ReplicaFetchResponse:
    """``answer`` as sent to the follower (``follower._answer`` reads it); ``ask``: it asks for
    an acknowledgement; without ``records``, the small fields alone (``_serialized``)."""
    response = cpb.ReplicaFetchResponse(
        leader_epoch=answer.leader_epoch,
        high_watermark=answer.high_watermark,
        epochs=[cpb.EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in answer.epochs],
        log_start_offset=answer.log_start,
        diverged=answer.diverged,
        answer=ask,
    )
    if records and len(answer.records):
        response.stored_records = answer.records.data
        response.stored_sizes = columns.pack_int64(answer.records.sizes)
    return response


_STORED_RECORDS: Final = bytes([5 << 3 | 2])
_STORED_SIZES: Final = bytes([6 << 3 | 2])
"""The tags of ``ReplicaFetchResponse``'s two bytes fields (field number, wire type 2)."""


def _serialized(answer: FetchAnswer, *, ask: bool = False) -> bytes:
    """``_response(answer, ask=ask)`` serialised, as a stream sends it:
    the small fields by protobuf, the records and their sizes appended by one join. Protobuf's
    own encoder copies a large bytes field slowly and unevenly (upb: 10-560 us for 1,700 to
    7,700 records of 136 bytes, ~0.07 us per record at the median, where the join costs 0.003);
    a parser takes the fields in any order, and each appears once, so the message is the same."""
    records = answer.records
    head = _response(answer, ask=ask, records=False).SerializeToString()
    if not len(records):
        return head
    sizes = columns.pack_int64(records.sizes)
    return b"".join(
        (
            head,
            _STORED_RECORDS,
            uvarint(len(records.data)),
            records.data,
            _STORED_SIZES,
            uvarint(len(sizes)),
            sizes,
        )
    )


class _Stream:
    """One follower's replication stream of one partition, at its leader (module docstring)."""

    def __init__(
        self,
        server: FetchServer,
        first: cpb.ReplicaFetchRequest,
        acks: AsyncIterator[cpb.ReplicaFetchRequest],
        wait_ms: int,
    ) -> None:
        self._server = server
        self._wait_s = wait_ms / 1000
        self._first = first
        self._acks = acks
        self._follower = first.follower
        self._epoch = first.leader_epoch
        self._max_records = first.max_records or FETCH_MAX_RECORDS
        self._next = first.fetch_offset
        """The offset the next records sent start at."""
        self._acked = first.fetch_offset
        """The follower's log end as it last said."""
        self._unacked: collections.deque[tuple[int, int, float | None]] = collections.deque()
        """(offset after, bytes, when) of each response with records not yet acknowledged;
        ``when`` is the leader's time of sending when it held nothing more (else None): a
        follower holding that response's records had everything the leader had then."""
        self._in_flight = 0
        self._told = -1
        """The high watermark the follower holds after applying what was sent."""
        self._fresh = True
        """An acknowledgement arrived since the last response without news (module docstring:
        only then may the follower count caught up while nothing is sent)."""
        self._acked_signal = CommitSignal(asyncio.get_running_loop())

    def _leader(self) -> LeaderReplica:
        leader = self._server.leading(self._first.stream, self._first.partition)
        if leader.leader_epoch != self._epoch:
            raise StaleEpoch(self._epoch, leader.leader_epoch)
        return leader

    def _sent(self, leader: LeaderReplica, answer: FetchAnswer, *, ask: bool = False) -> bytes:
        """``answer`` serialised, as sent (``ask``: it asks for an acknowledgement), after
        noting what it sends."""
        records = answer.records
        if records:
            self._next = records.offset_range()[1] + 1
            whole = self._next > leader.partition.log.committed_offset
            self._unacked.append((self._next, len(records.data), leader.now() if whole else None))
            self._in_flight += len(records.data)
        self._told = max(self._told, min(answer.high_watermark, self._next - 1))
        return _serialized(answer, ask=ask)

    async def _take_acks(self) -> None:
        """Take the follower's acknowledgements until it closes its side."""
        async for ack in self._acks:
            log_end = min(ack.fetch_offset, self._next)  # never more than was sent
            caught_up_at = None
            while self._unacked and self._unacked[0][0] <= log_end:
                _, size, when = self._unacked.popleft()
                self._in_flight -= size
                caught_up_at = when if when is not None else caught_up_at
            self._acked = max(self._acked, log_end)
            self._fresh = True
            self._leader().acknowledge(self._follower, log_end, caught_up_at=caught_up_at)
            self._acked_signal.fire()

    async def responses(self) -> AsyncIterator[bytes]:
        first = self._first
        leader = self._leader()
        previous_crc = first.previous_crc if first.HasField("previous_crc") else None
        answer = leader.fetch(
            self._follower,
            self._epoch,
            first.fetch_offset,
            self._max_records,
            previous_crc=previous_crc,
        )
        yield self._sent(leader, answer)
        if answer.diverged:
            return
        wait_s = self._wait_s
        last_sent = time.monotonic()
        taker = asyncio.create_task(self._take_acks())
        try:
            while True:
                if taker.done():
                    taker.result()  # its error ends the stream; else the follower closed it
                    return
                leader = self._leader()
                wake = leader.partition.signal.current()
                acked = self._acked_signal.current()
                room = STREAM_WINDOW - self._in_flight
                if room > 0 and self._next <= leader.partition.log.committed_offset:
                    answer = leader.send(
                        self._follower, self._next, self._max_records, min(room, FETCH_MAX_BYTES)
                    )
                    if answer.records:  # none (no record from here to the committed end): wait
                        yield self._sent(leader, answer)
                        last_sent = time.monotonic()
                        continue
                if min(leader.high_watermark, self._next - 1) > self._told:
                    yield self._sent(leader, _news(leader))
                    last_sent = time.monotonic()
                    continue
                remaining = last_sent + wait_s - time.monotonic()
                if remaining <= 0:  # nothing for the fetch wait: it must answer to stay current
                    self._fresh = False
                    yield self._sent(leader, _news(leader), ask=True)
                    last_sent = time.monotonic()
                    continue
                held = self._fresh and self._acked >= self._next
                if held:  # it has everything: caught up while it waits (as a held fetch)
                    leader.hold(self._follower)
                try:
                    await asyncio.wait(
                        [wake, acked, taker],
                        timeout=remaining,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    if held:
                        leader.release(self._follower)
        finally:
            taker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await taker


def _news(leader: LeaderReplica) -> FetchAnswer:
    """An answer without records: the leader's high watermark and log start."""
    return FetchAnswer(
        leader.leader_epoch,
        leader.high_watermark,
        StoredRecords(),
        [],
        leader.partition.log.oldest_offset,
    )
