"""The follower's side of replication: the fetch loop that copies a leader's log.

Theory of operation. A follower asks its leader where its own newest leader epoch ends
(``OffsetForLeaderEpoch``), truncates there, then opens a replication stream (``ReplicaStream``):
its first request is a fetch from its log end; the leader sends the records that follow as they
are committed (and, when there are none, a response at least every ``fetch_wait_ms``), and the
follower appends each response with the leader's offsets and timestamps (``FollowerReplica``,
which checks every record's CRC) and then acknowledges it with its new log end (a response with
only a new high watermark is not acknowledged, unless the leader asks: ``answer``). A diverged
answer ends the stream: it cuts back and opens another. The leader's side is ``serving.py``.

Invariants. One loop per (partition, leader, leader epoch), run by the partition's role
(``PartitionRole.follow``) and cancelled when that changes; a new loop asks for the epoch's end
again and truncates to where its log and the leader's agree before it appends anything.
It releases its oldest records only in step with the leader's log start and never past its own
high watermark. Errors never end the loop: it backs off (50 ms doubling to 1 s) and asks again
until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc
from tidelog.broker import FlushPolicy
from tidelog.cluster.leader_epochs import EpochEnd, EpochEntry
from tidelog.cluster.metadata import ClusterView
from tidelog.cluster.replication import FETCH_MAX_RECORDS, FetchAnswer
from tidelog.cluster.roles import PartitionRole
from tidelog.cluster.settings import ClusterSettings
from tidelog.cluster.stored import StoredRecords
from tidelog.wire import columns

LOG = logging.getLogger("tidelog.cluster")


class FollowerHost(Protocol):
    """What the fetch loop needs of the node."""

    @property
    def view(self) -> ClusterView:
        """Where the leader is (its address may change while the loop runs)."""
        ...

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def broker_id(self) -> str: ...

    @property
    def fetch_delay_s(self) -> float:
        """Fault tests: a pause before each fetched batch is appended (zero otherwise)."""
        ...

    def channel(self, address: str) -> grpc.aio.Channel: ...


class ReplicaFetcher:
    """Runs the fetch loops of this broker's follower replicas."""

    def __init__(self, host: FollowerHost) -> None:
        self._host = host

    async def follow(self, role: PartitionRole, leader_id: str, leader_epoch: int) -> None:
        """Copy the leader's log until cancelled (a new state, a close)."""
        host = self._host
        partition = role.partition
        follower = role.follower
        assert follower is not None
        stub: Any = None
        cursor = _Cursor()
        backoff = 0.05
        released = _Released()
        while True:
            try:
                address = host.view.brokers.get(leader_id)
                if address is None:
                    await asyncio.sleep(host.settings.poll_s)
                    continue
                stub = cluster_pb2_grpc.ReplicationStub(host.channel(address))
                if cursor.next_offset is None:
                    asked = follower.epochs.latest_epoch
                    reply = await stub.OffsetForLeaderEpoch(
                        cpb.OffsetForLeaderEpochRequest(
                            stream=partition.stream,
                            partition=partition.number,
                            leader_epoch=leader_epoch,
                            epoch=asked,
                        ),
                        timeout=5,
                    )
                    answer = EpochEnd(reply.epoch, reply.end_offset)
                    before = partition.log.next_offset
                    next_offset = cursor.next_offset = follower.follow(leader_epoch, _known(answer))
                    LOG.info(
                        "%s/%d: following %s at leader epoch %d from offset %d%s",
                        partition.stream,
                        partition.number,
                        leader_id,
                        leader_epoch,
                        next_offset,
                        f" (cut {before - next_offset} records it never had)"
                        if next_offset < before
                        else "",
                    )
                await self._stream(stub, role, leader_id, leader_epoch, cursor, released)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                LOG.debug(
                    "%s/%d: fetch from %s: %s %s",
                    partition.stream,
                    partition.number,
                    leader_id,
                    error.code(),
                    error.details(),
                )
                if error.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.NOT_FOUND,
                ):
                    LOG.warning(
                        "%s/%d: fetch from %s failed: %s",
                        partition.stream,
                        partition.number,
                        leader_id,
                        error.details(),
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            except (TimeoutError, ConnectionError) as error:
                LOG.debug(
                    "%s/%d: stream from %s: %s",
                    partition.stream,
                    partition.number,
                    leader_id,
                    error,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            except Exception:
                LOG.exception("%s/%d: following %s", partition.stream, partition.number, leader_id)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _stream(
        self,
        stub: Any,
        role: PartitionRole,
        leader_id: str,
        leader_epoch: int,
        cursor: _Cursor,
        released: _Released,
    ) -> None:
        """Copy the leader's records over one replication stream from ``cursor.next_offset``
        until the leader ends it (a divergence). ``cursor`` follows every answer applied, so the
        next stream opens where this one got to however it ends. Raises what ends it otherwise
        (the leader's refusal, a broken connection, no message for the fetch wait and 5 s more)."""
        next_offset = cursor.next_offset
        assert next_offset is not None
        host = self._host
        partition = role.partition
        follower = role.follower
        assert follower is not None
        wait_ms = host.settings.fetch_wait_ms
        call = stub.ReplicaStream()
        try:
            await call.write(
                cpb.ReplicaFetchRequest(
                    stream=partition.stream,
                    partition=partition.number,
                    follower=host.broker_id,
                    leader_epoch=leader_epoch,
                    fetch_offset=next_offset,
                    max_records=FETCH_MAX_RECORDS,
                    max_wait_ms=wait_ms,
                    high_watermark=follower.high_watermark,
                    previous_crc=follower.last_crc,
                )
            )
            while True:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation
                # that lands as the read completes, and the loop would follow on after its role
                # ended (tests/cluster/test_follower_reopen.py).
                async with asyncio.timeout(5 + wait_ms / 1000):
                    response = await call.read()
                if response is grpc.aio.EOF:
                    raise ConnectionError("the leader ended the replication stream")
                fetched = _answer(response)
                if fetched.diverged:
                    LOG.warning(
                        "%s/%d: record %d is not leader %s's: cutting back to find where the "
                        "logs agree",
                        partition.stream,
                        partition.number,
                        next_offset - 1,
                        leader_id,
                    )
                if host.fetch_delay_s and fetched.records:
                    await asyncio.sleep(host.fetch_delay_s)
                if fetched.records and partition.log.config.flush_policy is FlushPolicy.ALWAYS:
                    next_offset = await asyncio.to_thread(follower.apply, fetched)
                else:
                    next_offset = follower.apply(fetched)
                cursor.next_offset = next_offset
                if fetched.diverged:
                    return  # the leader ends the stream: another one from here
                if fetched.records or response.answer:  # a high watermark alone: not answered
                    await call.write(
                        cpb.ReplicaFetchRequest(
                            fetch_offset=next_offset, high_watermark=follower.high_watermark
                        )
                    )
                # The leader's retention, or the owner of the stream, removed its oldest
                # records: this replica follows, in whole segments, never past its own high
                # watermark (asked again only when the leader's start moves).
                start = min(fetched.log_start, follower.high_watermark + 1)
                if start > released.before and start > partition.log.oldest_offset:
                    released.before = start
                    await partition.release_before(start)
        finally:
            call.cancel()


@dataclass(slots=True)
class _Cursor:
    next_offset: int | None = None
    """Where the next replication stream opens: the follower's log end after the last answer it
    applied (None until the leader's epoch answer placed it)."""


@dataclass(slots=True)
class _Released:
    before: int = 0
    """The leader's log start this replica last released its records before."""


def _known(answer: EpochEnd) -> Callable[[int], EpochEnd]:
    """The leader's answer, already fetched, as the question ``FollowerReplica.follow`` asks."""

    def ask(_epoch: int) -> EpochEnd:
        return answer

    return ask


def _answer(response: cpb.ReplicaFetchResponse) -> FetchAnswer:
    """A leader's fetch answer as sent (``serving._response`` writes it), checked."""
    data = response.stored_records  # a copy each time it is read (upb): read once
    sizes = columns.unpack_int64(response.stored_sizes)
    if int(sizes.sum()) != len(data):
        raise ValueError("malformed replica fetch answer: record sizes and bytes differ")
    records = StoredRecords(data, sizes)
    epochs = [EpochEntry(e.epoch, e.start_offset) for e in response.epochs]
    return FetchAnswer(
        response.leader_epoch,
        response.high_watermark,
        records,
        epochs,
        response.log_start_offset,
        diverged=response.diverged,
    )
