"""One stream partition on the broker: its commit log, its flags, the signal subscribers await.

A partition is *paused* (log closed, nothing held open; a publish or a resuming subscribe opens
it again), *read-only* (publishes refused, subscribers end once caught up) or neither. Everything
here runs on the broker's event loop, except the log's own sync work, which runs in threads when
the flush policy makes an append wait for a sync.

The partition is to its log what Kafka's ``UnifiedLog`` is to its segments: it keeps the state
derived from the records in step with every change of them, without rescanning. Every change of
a replica's log goes through it: a leader's publishes, a follower's copies
(:meth:`Partition.append_stored`) and cuts (:meth:`Partition.truncate_to`), and retention
(the log's start listener). The producer table follows each, and the partition's own start
listeners (:meth:`Partition.add_start_listener`: a replica's leader-epoch cache) hear, on the
event loop, each move of the log's oldest offset.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tidelog.broker.producers import SNAPSHOT_FILE as PRODUCERS_SNAPSHOT
from tidelog.broker.producers import (
    DuplicateBatch,
    ProducerTable,
    Published,
    producer_batches,
    stored_producer_batches,
    with_producer_header,
)
from tidelog.broker.shared_sync import SharedSync
from tidelog.errors import BrokerClosed, PartitionPaused, PartitionReadonly, StreamDeleted
from tidelog.log import CommitLog, FlushPolicy, LogConfig, MessageBatch, NewRecord, SegmentedLog
from tidelog.log.filecache import DEFAULT_FILE_CACHE, FileCache
from tidelog.log.record import HeaderedValues, Int64Array, LaidOutRecords, PackedValues


class ReplicaRole(Protocol):
    """What a partition of a cluster is on this broker (``tidelog.cluster`` sets it): the
    leader, a follower, or neither yet. A single broker's partitions have no role."""

    def check_publish(self) -> None:
        """Raise ``NotLeader`` unless this broker may append client publishes."""
        ...

    async def replicated(self, last_offset: int) -> None:
        """Return once every in-sync replica holds ``last_offset`` (ack policy ALL); raise
        ``NotEnoughReplicas`` after the ack timeout, ``NotLeader`` if leadership is lost."""
        ...

    def check_read(self, read_replica: bool) -> None:
        """Raise ``NotLeader`` unless this broker may serve reads (a follower only with
        ``read_replica``: Liftbridge's ``readISRReplica``)."""
        ...

    def opened(self, log: CommitLog) -> None:
        """The partition opened ``log`` (a start or a resume): apply the commit limit to it."""
        ...


HW_CHECKPOINT = "replication-hw"
"""The high watermark a replica of a cluster last knew, in its partition's directory (decimal
text; ``tidelog.cluster`` writes it)."""


def saved_high_watermark(directory: Path) -> int:
    """The high watermark a replica last saved in ``directory`` (-1: none)."""
    try:
        return int((directory / HW_CHECKPOINT).read_text())
    except (FileNotFoundError, ValueError):
        return -1


class CommitSignal:
    """Wakes every waiter when a partition's high watermark moves, or its state changes.

    Waiters take ``current()`` *before* checking for data and await it only if there was none; a
    change between the check and the await resolves the future they already hold, so no wake-up
    is lost. ``fire`` runs on the loop; ``fire_threadsafe`` from any thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()

    def current(self) -> asyncio.Future[None]:
        """The future the next change resolves. Waiters must not cancel it (it is shared: use
        ``asyncio.wait`` or ``asyncio.shield``); one that was cancelled anyway is replaced here,
        since handing out a done future would make every waiter spin until the next change."""
        if self._future.done():
            self._future = self._loop.create_future()
        return self._future

    def fire(self) -> None:
        future, self._future = self._future, self._loop.create_future()
        if not future.done():
            future.set_result(None)

    def fire_threadsafe(self) -> None:
        if running_on(self._loop):
            self.fire()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.fire)


def running_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread is running ``loop``. Not "the thread that built the object":
    the broker loads its streams in worker threads, which later run other work too."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@dataclass(slots=True)
class PartitionStats:
    """Counters for metadata and metrics (times in ns since the epoch, 0 = never)."""

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    first_message_received: int = 0
    latest_message_received: int = 0
    first_paused: int = 0
    latest_paused: int = 0
    first_readonly: int = 0
    latest_readonly: int = 0
    last_activity_monotonic: float = 0.0


def _payload_bytes(messages: Sequence[bytes | NewRecord]) -> int:
    # A list first: the columnar types are Sequence (ABC) subclasses, and isinstance against
    # one takes ABCMeta's slow path for any other type (a live publisher's list, every request).
    if type(messages) is not list and isinstance(messages, PackedValues | HeaderedValues):
        return len(messages.blob)
    if type(messages) is not list and isinstance(messages, LaidOutRecords):
        return messages.payload_bytes()
    try:
        return sum(map(len, messages))
    except TypeError:
        return sum(len(m.value) if isinstance(m, NewRecord) else len(m) for m in messages)


class Partition:
    """A partition's log and state; the broker serialises structural changes on its loop."""

    def __init__(
        self,
        stream: str,
        number: int,
        directory: Path,
        log_config: LogConfig,
        loop: asyncio.AbstractEventLoop,
        *,
        paused: bool = False,
        readonly: bool = False,
        files: FileCache = DEFAULT_FILE_CACHE,
        held: bool = False,
    ) -> None:
        """``held``: a partition of a broker of a cluster. Its log opens with readers held at
        the high watermark the replica last saved (:func:`saved_high_watermark`): what it holds
        above that may be a tail no leader committed, which nobody may read before the cluster
        has given the partition its role (and the role's high watermark)."""
        self.stream = stream
        self.held = held
        self._files = files
        """The broker's bounded cache of open segment files, shared by every partition."""
        self.number = number
        self.directory = directory
        self.log_config = log_config
        self.signal = CommitSignal(loop)
        self._syncs = SharedSync(lambda: self.log.flush(), lambda: self.log.next_offset - 1)
        """The syncs the publishes that wait for theirs share (``shared_sync``)."""
        self._loop = loop
        self._start_listeners: list[Callable[[int], object]] = []
        self.readonly = readonly
        self.deleted = False
        self.closed = False
        self.draining = False
        """Set when the server shuts down: subscriptions end so in-flight calls can finish."""
        self.subscribers = 0
        self.stats = PartitionStats(last_activity_monotonic=time.monotonic())
        self._log: CommitLog | None = None
        self._producers: ProducerTable | None = None
        self._paused_offsets = (-1, -1)  # (high watermark, newest) when last paused
        self.role: ReplicaRole | None = None
        """Set on a broker of a cluster: leader, follower (``tidelog.cluster``)."""
        if paused:
            # Report the offsets a paused partition holds without keeping its log open.
            log = self._open_log()
            self._paused_offsets = (log.high_watermark, log.newest_offset)
            log.close()
        else:
            self._open()

    # -- state -----------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._log is None

    @property
    def current_log(self) -> CommitLog | None:
        """The open log object, or None while paused (each resume opens a new one)."""
        return self._log

    @property
    def log(self) -> CommitLog:
        """The open log; raises when the partition is paused or gone."""
        if self.deleted or self.closed:
            raise StreamDeleted(f"stream {self.stream!r} was deleted or the broker is closing")
        if self._log is None:
            raise PartitionPaused(self.stream, self.number)
        return self._log

    @property
    def producers(self) -> ProducerTable | None:
        """The producer table of the open log (None while paused)."""
        return self._producers if self._log is not None else None

    @property
    def high_watermark(self) -> int:
        """The log's high watermark (its value at pause time while paused)."""
        return self._paused_offsets[0] if self._log is None else self._log.high_watermark

    @property
    def newest_offset(self) -> int:
        return self._paused_offsets[1] if self._log is None else self._log.newest_offset

    def check_serving(self) -> None:
        """Raise what a reader of this partition must end with: deleted (or the broker
        closing), the server draining, or paused."""
        if self.deleted or self.closed:
            raise StreamDeleted(
                f"stream {self.stream!r} was deleted or the broker is shutting down"
            )
        if self.draining:
            raise BrokerClosed("the server is shutting down; read again once it is back")
        if self._log is None:
            raise PartitionPaused(self.stream, self.number)

    def _open_log(self) -> CommitLog:
        # No per-log directory lock: the broker holds the data directory's (one descriptor, not
        # one per partition), and it never opens a partition's log twice.
        return SegmentedLog(
            self.directory,
            self.log_config,
            file_cache=self._files,
            lock_directory=False,
            commit_limit=saved_high_watermark(self.directory) if self.held else None,
        )

    def _open(self) -> None:
        log = self._open_log()
        try:
            self._producers = ProducerTable.restore(log, self.directory)
        except BaseException:
            log.close()
            raise
        log.add_listener(self._on_commit)
        log.add_start_listener(self._on_start_moved)
        self._log = log
        if self.role is not None:
            self.role.opened(log)

    def reconfigure(self, log_config: LogConfig) -> None:
        """New limits and retention for the log, open or reopened later."""
        self.log_config = log_config
        if self._log is not None:
            self._log.config = log_config

    def save_producers(self) -> None:
        """Snapshot the producer table if it changed (a no-op while paused or closed), after
        settling what the high watermark passed and forgetting producers whose batches are
        gone below the oldest offset."""
        log, producers = self._log, self._producers
        if log is not None and producers is not None and not (self.deleted or self.closed):
            producers.trim_before(log.oldest_offset)
            producers.settle(log.high_watermark)
            producers.save(log, self.directory)

    # -- a replica's changes of the log ----------------------------------------------------------

    def append_stored(self, data: bytes, sizes: Int64Array) -> None:
        """Append records exactly as the leader stored them (a follower copying its leader:
        the log's ``append_stored``), and take the producer batches they end into the producer
        table, so that it is the log's whatever role the replica has next. The batches carry
        their owners (``__owner`` headers): what the leader accepted is copied, never checked.
        Runs in the calling thread (a follower whose appends sync calls it in a thread)."""
        log = self.log
        before = log.next_offset
        appended: MessageBatch | None = None
        try:
            appended = log.append_stored(data, sizes)
        finally:  # what was written, all of it or a failed append's first runs
            newest = log.newest_offset
            producers = self._producers
            if producers is not None and newest >= before:
                found = (
                    stored_producer_batches(data, sizes)
                    if appended is None  # the headers the check gathered, else again
                    else producer_batches(appended)
                )
                for producer_id, batch in found:
                    if batch.offsets.stop - 1 <= newest:
                        producers.apply(producer_id, batch)
                producers.settle(log.high_watermark)

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset`` (a follower cutting a tail its leader
        never had: the log's ``truncate_to``), and cut the producer table with it: its undo
        journal takes back the batches cut, and only a cut below what every in-sync replica
        held (a damaged log's) restores the table from its snapshot and the log. The producer
        snapshot is rewritten before anything is appended again, since it may describe records
        the cut removed. Raises the log's ``OffsetOutOfRange`` below the oldest offset."""
        log = self.log
        try:
            log.truncate_to(offset)
        finally:  # a cut that failed part-way leaves a shorter log: follow what it left
            self._syncs.forget_from(min(offset, log.next_offset))
            self._cut_producers(log)

    def _cut_producers(self, log: CommitLog) -> None:
        producers = self._producers
        if producers is None:
            return
        end = log.next_offset
        if not producers.truncate(end):
            # The snapshot on disk describes the log as it was when written (one is written
            # after every cut, before the next append): restore from it and the records after.
            producers = self._producers = ProducerTable.restore(log, self.directory)
        try:
            producers.save(log, self.directory)
        except BaseException:
            # A snapshot covering cut records must not outlive the cut (the records appended
            # next would read as its own): without one, the next open rebuilds.
            (self.directory / PRODUCERS_SNAPSHOT).unlink(missing_ok=True)
            raise

    def add_start_listener(self, listener: Callable[[int], object]) -> None:
        """Call ``listener(oldest_offset)`` on the event loop each time the log's oldest offset
        moves up (retention, a release: the log's start listener), after the producer table has
        forgotten what lay below it; kept across pause and resume (a replica's leader-epoch
        cache subscribes ``truncate_from_start`` here)."""
        self._start_listeners = [*self._start_listeners, listener]

    def remove_start_listener(self, listener: Callable[[int], object]) -> None:
        self._start_listeners = [x for x in self._start_listeners if x != listener]

    def _on_start_moved(self, oldest: int) -> None:
        """The log's start listener (any thread: maintenance and releases run in threads)."""
        producers = self._producers
        if producers is not None:
            producers.trim_before(oldest)
        for listener in self._start_listeners:
            if running_on(self._loop):
                listener(oldest)
            elif not self._loop.is_closed():
                self._loop.call_soon_threadsafe(listener, oldest)

    async def release_before(self, offset: int) -> list[int]:
        """Delete the sealed segments whose records all lie below ``offset`` (exclusive): the
        partition's owner needs none of them (the sites' delta queue, once every site acked
        them). Runs in a thread, as retention does; a paused or closed partition releases
        nothing. Returns the deleted segments' base offsets."""
        log = self._log
        if log is None or self.deleted or self.closed:
            return []
        return await asyncio.to_thread(log.release_before, offset)

    def _on_commit(self, high_watermark: int) -> None:
        self.signal.fire_threadsafe()

    def touch(self) -> None:
        self.stats.last_activity_monotonic = time.monotonic()

    def pause(self) -> None:
        """Close the log; subscribers end with ``PartitionPaused``.

        The pause timestamps (as Liftbridge keeps them): ``first_paused`` is the first pause,
        ``latest_paused`` the latest pause or resume."""
        if self._log is not None:
            self._paused_offsets = (self._log.high_watermark, self._log.newest_offset)
            self.save_producers()
            self._log.close()
            self._log = None
        now = time.time_ns()
        self.stats.first_paused = self.stats.first_paused or now
        self.stats.latest_paused = now
        self.signal.fire_threadsafe()

    def resume(self) -> None:
        if self._log is None and not (self.deleted or self.closed):
            self._open()
            self.touch()
            self.stats.latest_paused = time.time_ns()
        self.signal.fire_threadsafe()

    def set_readonly(self, readonly: bool) -> None:
        """Set or clear the read-only flag. ``first_readonly`` is the first change,
        ``latest_readonly`` the latest (setting or clearing, as Liftbridge keeps them)."""
        now = time.time_ns()
        self.stats.first_readonly = self.stats.first_readonly or now
        self.stats.latest_readonly = now
        self.readonly = readonly
        self.signal.fire_threadsafe()

    # -- publishing ------------------------------------------------------------------------------

    async def publish(
        self,
        messages: Sequence[bytes | NewRecord],
        *,
        expected_offset: int | None = None,
        durable: bool = False,
    ) -> Published:
        """Append ``messages`` as one batch; with ``durable`` also wait until they are synced.
        Returns their offsets and the timestamp they were stored with.

        A paused partition is resumed first. Appends that wait for a sync (flush policy
        ``always``, or ``durable``) run the sync in a thread, so the loop keeps serving.
        """
        if self.readonly:
            raise PartitionReadonly(self.stream, self.number)
        role = self.role
        if role is not None:
            role.check_publish()
        if self.paused:
            self.resume()
        log = self.log
        if log.config.flush_policy is FlushPolicy.ALWAYS:
            offsets, stamp = await asyncio.to_thread(
                log.append_stamped, messages, expected_offset=expected_offset
            )
        else:
            offsets, stamp = log.append_stamped(messages, expected_offset=expected_offset)
            if durable and offsets:
                await self._syncs.through(offsets[-1])
        self._count_in(messages, len(offsets))
        if durable and role is not None and offsets:
            await role.replicated(offsets[-1])
        return Published(offsets, timestamp=stamp)

    async def replicated(self, last_offset: int) -> None:
        """Return once every in-sync replica holds ``last_offset`` (a partition of a cluster;
        at once on a single broker's): for an owner that appends first, indexes what it
        appended, and only then waits for the ISR (the sites' send queue)."""
        role = self.role
        if role is not None:
            await role.replicated(last_offset)

    async def publish_idempotent(
        self,
        messages: Sequence[bytes | NewRecord],
        producer_id: str,
        sequence: int,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
        owner: str = "",
    ) -> Published:
        """Append ``messages`` atomically as batch ``sequence`` of ``producer_id``, unless the
        partition already holds that batch or a later one (see ``producers.py``). ``owner`` is
        the caller's principal: ``ProducerIdTaken`` when another one owns the producer id.

        A duplicate is answered once the stored batch is committed (and, with ``durable``,
        synced), as its first publish would have been; an older sequence once the producer's
        latest batch is.
        """
        if self.readonly:
            raise PartitionReadonly(self.stream, self.number)
        role = self.role
        if role is not None:
            role.check_publish()
        if self.paused:
            self.resume()
        log = self.log
        assert self._producers is not None  # restored whenever the log is open
        batch = with_producer_header(messages, producer_id, sequence, owner)
        guard = self._producers.guard(producer_id, sequence, owner)
        always = log.config.flush_policy is FlushPolicy.ALWAYS
        try:
            if always:
                offsets, stamp = await asyncio.to_thread(
                    log.append_stamped,
                    batch,
                    expected_offset=expected_offset,
                    atomic=True,
                    guard=guard,
                )
            else:
                offsets, stamp = log.append_stamped(
                    batch, expected_offset=expected_offset, atomic=True, guard=guard
                )
        except DuplicateBatch as duplicate:
            if always or durable:
                await asyncio.to_thread(log.flush)
            self.touch()
            stored = duplicate.stored
            # An older sequence waits for the producer's latest batch: a deposed leader holding
            # a later batch it never committed must not answer an earlier one as stored.
            latest = duplicate.latest
            if durable and role is not None and latest.offsets:
                await role.replicated(latest.offsets[-1])
            return Published(range(0) if stored is None else stored.offsets, duplicate=True)
        guard.table.settle(log.high_watermark)
        if durable and not always and offsets:
            await self._syncs.through(offsets[-1])
        self._count_in(messages, len(offsets))
        if durable and role is not None and offsets:
            await role.replicated(offsets[-1])
        return Published(offsets, timestamp=stamp)

    def _count_in(self, messages: Sequence[bytes | NewRecord], count: int) -> None:
        now = time.time_ns()
        stats = self.stats
        stats.messages_in += count
        stats.bytes_in += _payload_bytes(messages)
        stats.first_message_received = stats.first_message_received or now
        stats.latest_message_received = now
        self.touch()

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        self.save_producers()
        self.closed = True
        if self._log is not None:
            self._log.close()
            self._log = None
        self.signal.fire_threadsafe()

    def delete(self) -> None:
        self.deleted = True
        if self._log is not None:
            self._log.delete()
            self._log = None
        self.signal.fire_threadsafe()
