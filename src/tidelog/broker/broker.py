"""The broker: every stream of one data directory, on one asyncio event loop.

It owns stream lifecycle (create, delete, pause/resume, read-only), publishing with optimistic
concurrency, subscriptions, cursors, and periodic maintenance (age rolls, retention,
auto-pause). Structural changes happen on the loop; blocking log work (syncs, retention's file
deletion, cursor scans) runs in threads.

Deleting a stream never touches the files of a later stream of the same name. The name stays
reserved (creates wait, or get ``StreamDeleting``) until the old stream's directory has been
renamed to a tombstone under ``<data_dir>/deleted/`` and its logs are closed; only then is the
name free, and the tombstone is removed in the background. A crash at any point leaves either
the whole stream (the delete was not acknowledged) or a tombstone, which start-up removes. A
stream directory without its ``stream.json`` (a create cut short) is never loaded and is moved
aside at start.

Consumer groups are saved in ``<data_dir>/groups.json`` (``groups.py``) after every membership
change and restored at start before any stream opens; an unreadable file stops the start.

Internal streams (``__`` names, e.g. ``__cursors``) are written, paused and made read-only only
by the broker; the client-facing methods here refuse with ``PermissionDenied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import resource
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tidelog.broker.browse import BrowseQuery, BrowseResult
from tidelog.broker.browse import browse as read_page
from tidelog.broker.browse_filter import BrowseFilter
from tidelog.broker.config import (
    DEFAULT_BROWSE_LIMIT,
    DEFAULT_BROWSE_MAX_SCAN,
    DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    MAX_BROWSE_LIMIT,
    MAX_BROWSE_MAX_SCAN_SECONDS,
    BrokerConfig,
    StreamConfig,
    validate_stream_name,
)
from tidelog.broker.cursors import CursorStore
from tidelog.broker.groups import GROUPS_FILE, GroupCoordinator, read_groups, write_groups
from tidelog.broker.partition import Partition, ReplicaRole
from tidelog.broker.partition_view import ViewSpec
from tidelog.broker.producers import Published, check_headers, validate_producer
from tidelog.broker.stream import METADATA_FILE, Stream
from tidelog.broker.stream_views import StreamViews
from tidelog.broker.subscription import (
    SubscribeRequest,
    Subscription,
    arm_faults_from_environment,
    resolve,
)
from tidelog.errors import (
    BrokerClosed,
    FailedPrecondition,
    InvalidArgument,
    LogLocked,
    NotLeader,
    PermissionDenied,
    StreamDeleting,
    StreamExists,
    StreamNotFound,
    resource_error,
)
from tidelog.log import NewRecord
from tidelog.log.filecache import MOST_PER_SEGMENT, FileCache
from tidelog.wire import CURSORS_STREAM, INTERNAL_PREFIX
from tidelog.wire.browse_token import check_token, decode_token

LOG = logging.getLogger("tidelog.broker")

TOMBSTONES = "deleted"
"""Directory under the data directory that holds deleted streams until their files are removed."""


def open_files_capacity(configured: int) -> int:
    """The open-file cache's capacity: ``configured``, but at most half the process's descriptor
    limit, so sockets, RocksDB and the rest always have room (a server started under a low
    ``ulimit -n`` still starts and serves every segment; it only reopens files more often)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or configured <= soft // 2:
        return configured
    capacity = max(MOST_PER_SEGMENT * 4, soft // 2)
    LOG.warning(
        "open_files_max %d does not fit the descriptor limit (ulimit -n %d): keeping at most %d "
        "segment descriptors open; raise the limit to keep more",
        configured,
        soft,
        capacity,
    )
    return capacity


def _remove_in_place(directory: Path) -> None:
    """Remove a stream directory where it is: its metadata first, so that whatever a crash
    leaves is never loaded as a stream again."""
    (directory / METADATA_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _partition_on(stream_subject: str, subject: str, partitions: int) -> int | None:
    """Which partition of a stream with ``stream_subject`` listens on ``subject`` (None: none).
    Partition 0 listens on the stream's subject, partition n > 0 on ``<subject>.<n>``."""
    if subject == stream_subject:
        return 0
    head, dot, tail = subject.rpartition(".")
    if dot and head == stream_subject and tail.isdigit() and tail == str(int(tail)):
        number = int(tail)
        if 0 < number < partitions:
            return number
    return None


def _check_not_internal(name: str, action: str) -> None:
    if name.startswith(INTERNAL_PREFIX):
        raise PermissionDenied(
            f"stream {name!r} is internal: only the broker may {action} it (it is read with "
            f"the usual calls; cursors are set with SetCursor)"
        )


class Broker:
    """Create with a :class:`BrokerConfig`, then ``await start()`` on the loop that will run it."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config or BrokerConfig()
        self.data_dir = Path(self.config.data_dir)
        self.streams: dict[str, Stream] = {}
        self.broker_id = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._cursors: CursorStore | None = None
        self.groups = GroupCoordinator(
            lambda name: len(self.stream(name).partitions),
            consumer_timeout_s=self.config.group_consumer_timeout_s,
            coordinator_timeout_s=self.config.group_coordinator_timeout_s,
            save=functools.partial(write_groups, self.data_dir / GROUPS_FILE),
        )
        """Consumer groups, saved in ``<data_dir>/groups.json`` and restored by :meth:`start`."""
        self._closed = False
        self._lock_fd: int | None = None
        self.started_ns = 0
        self.files = FileCache(open_files_capacity(self.config.open_files_max))
        """Open segment files of every partition, bounded (``open_files_max`` descriptors)."""
        self._deleting: dict[str, asyncio.Future[None]] = {}
        """Names whose old stream is being deleted; resolved once the name is free."""
        self._cleanup: set[asyncio.Task[None]] = set()
        """Background removals of tombstones (awaited on close)."""
        self.draining = False
        """Set by :meth:`drain`: the server is shutting down."""
        self._subject_turns: dict[tuple[str, str], int] = {}
        """(subject, load-balance group) -> publishes so far: whose turn it is."""
        self._on_drain: set[Callable[[], None]] = set()
        self.hosted_elsewhere: Callable[[str, int], str | None] | None = None
        """Set on a broker of a cluster: for a stream (partition -1: any) this broker does not
        hold, the address of the broker leading it ("" while none does), or None when the
        cluster does not know it either."""
        self._first_role: Callable[[Partition], ReplicaRole] | None = None
        """Set on a broker of a cluster (:meth:`hold_partitions`): the role every partition
        has until the cluster gives it its own."""

    # -- lifecycle -------------------------------------------------------------------------------

    def hold_partitions(self, first_role: Callable[[Partition], ReplicaRole]) -> None:
        """Make this a broker of a cluster: every partition, open now or opened later (a
        stream loaded at start, or created), gets ``first_role(partition)`` until the cluster
        sets the role it has here. Such a role refuses publishes and reads, so no partition is
        ever served as a single broker's between its opening and the cluster's first word on
        it (a restarted replica would otherwise acknowledge records its leader never had)."""
        self._first_role = first_role
        for stream in self.streams.values():
            self._hold(stream)

    def _hold(self, stream: Stream) -> None:
        if self._first_role is not None:
            for partition in stream.partitions:
                if partition.role is None:
                    partition.role = self._first_role(partition)

    async def start(self) -> None:
        arm_faults_from_environment()  # tests' fault points (docs/operations.md); off otherwise
        self._loop = asyncio.get_running_loop()
        (self.data_dir / "streams").mkdir(parents=True, exist_ok=True)
        # Made now, so that deleting a stream on a full disk needs no new directory.
        (self.data_dir / TOMBSTONES).mkdir(exist_ok=True)
        self._lock_data_dir()
        self.broker_id = self.config.broker_id or self._stored_broker_id()
        try:  # before any stream opens: an unreadable file stops the start with nothing open
            self.groups.restore(read_groups(self.data_dir / GROUPS_FILE))
        except BaseException:
            self._unlock_data_dir()
            raise
        for directory in sorted((self.data_dir / "streams").iterdir()):
            if not (directory / METADATA_FILE).exists():
                LOG.warning(
                    "%s has no %s (a create cut short): removing it", directory, METADATA_FILE
                )
                self._remove_dir(directory)
                continue
            stream = await asyncio.to_thread(
                Stream.load,
                directory,
                self.config.log,
                self._loop,
                self.files,
                self.config.clustered,
            )
            self._hold(stream)
            self.streams[stream.name] = stream
            stream.views.start()
            LOG.info("opened stream %s (%d partitions)", stream.name, len(stream.partitions))
        tombstones = self.data_dir / TOMBSTONES
        if tombstones.exists():
            for leftover in sorted(tombstones.iterdir()):
                self._remove_later(leftover)
        if CURSORS_STREAM not in self.streams:
            self._create(
                CURSORS_STREAM,
                StreamConfig(partitions=self.config.cursor_partitions, compact=True),
                internal=True,
            )
        self._repair_internal(self.streams[CURSORS_STREAM])
        self._cursors = CursorStore(self.streams[CURSORS_STREAM], self.resume)
        await asyncio.to_thread(self._cursors.restore)
        self._maintenance = asyncio.create_task(self._maintain_forever(), name="maintenance")
        self.started_ns = time.time_ns()

    @staticmethod
    def _repair_internal(stream: Stream) -> None:
        """Clear the read-only flag an older release let clients set on an internal stream
        (every cursor write would fail); paused partitions are resumed by their owner."""
        frozen = [p.number for p in stream.partitions if p.readonly]
        if frozen:
            for number in frozen:
                stream.partitions[number].set_readonly(False)
            stream.save()
            LOG.warning(
                "internal stream %s had read-only partitions %s; cleared (only the broker "
                "may change its flags)",
                stream.name,
                frozen,
            )

    def _lock_data_dir(self) -> None:
        """One broker per data directory (each log also locks its own directory)."""
        fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"data directory {self.data_dir} is in use by another tidelog server; stop it "
                f"or choose another --data-dir"
            ) from None
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _stored_broker_id(self) -> str:
        path = self.data_dir / "broker-id"
        try:
            stored = path.read_text().strip()
        except FileNotFoundError:
            stored = ""
        if not stored:
            stored = secrets.token_hex(8)
            path.write_text(stored + "\n")
        return stored

    def drain(self) -> None:
        """End every subscription (they are told the server is shutting down) and tell open
        request streams (``when_draining``) to stop reading; publishing continues until
        :meth:`close`, so requests already read still get their acks."""
        self.draining = True
        for stream in self.streams.values():
            for partition in stream.partitions:
                partition.draining = True
                partition.signal.fire()
        for callback in list(self._on_drain):
            callback()
        self._on_drain.clear()

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the broker's loop) once :meth:`drain` starts, at once if it
        has; returns how to withdraw it. A publish stream uses it to end without waiting for
        its client's next request: a connected client would otherwise hold the shutdown for
        the whole grace period."""
        if self.draining:
            callback()
            return lambda: None
        self._on_drain.add(callback)
        return lambda: self._on_drain.discard(callback)

    async def close(self) -> None:
        """Stop maintenance, end subscriptions, sync and close every log."""
        if self._closed:
            return
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self._cursors is not None:
            await self._cursors.save()
        for stream in list(self.streams.values()):
            try:
                await stream.views.close()
                await asyncio.to_thread(stream.close)
            except Exception:  # one stream's failure (a full disk) must not leave others open
                LOG.exception(
                    "closing stream %s failed; its logs recover on the next start", stream.name
                )
        if self._cleanup:
            await asyncio.gather(*self._cleanup, return_exceptions=True)
        self._unlock_data_dir()

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerClosed("the broker is shutting down")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Broker.start() has not run"
        return self._loop

    # -- streams ---------------------------------------------------------------------------------

    def stream(self, name: str) -> Stream:
        self._check_open()
        try:
            return self.streams[name]
        except KeyError:
            self._check_elsewhere(name, -1)
            raise StreamNotFound(name) from None

    def _check_elsewhere(self, name: str, number: int) -> None:
        """Raise ``NotLeader`` when another broker of a cluster has what this one lacks."""
        if self.hosted_elsewhere is not None:
            leader = self.hosted_elsewhere(name, number)
            if leader is not None:
                raise NotLeader(name, number, leader)

    def find_stream(self, name: str) -> Stream | None:
        """The stream called ``name``, or None (metadata answers "unknown" rather than fail)."""
        return self.streams.get(name)

    def list_streams(self) -> list[Stream]:
        """Every stream, by name (internal ones included)."""
        return [self.streams[name] for name in sorted(self.streams)]

    def partition(self, stream: str, number: int) -> Partition:
        found = self.stream(stream)
        if number >= len(found.partitions):
            self._check_elsewhere(stream, number)
        return found.partition(number)

    def subject_targets(self, subject: str) -> list[Partition]:
        """The partitions a publish to ``subject`` goes to, routed as Liftbridge routes it
        through NATS, in stream-name order: partition 0 of each stream whose subject is
        ``subject``, partition n of each stream whose subject is ``S`` when ``subject`` is
        ``S.n``. Streams created with a load-balance ``group`` take turns: each publish goes
        to one stream of each group (round-robin, where NATS picks at random). Internal
        streams are never targets. Empty when no stream listens on ``subject``."""
        targets: list[Partition] = []
        groups: dict[str, list[Partition]] = {}
        for stream in self.list_streams():
            if stream.name.startswith(INTERNAL_PREFIX):
                continue
            number = _partition_on(stream.subject, subject, len(stream.partitions))
            if number is None:
                continue
            partition = stream.partitions[number]
            if stream.config.group:
                groups.setdefault(stream.config.group, []).append(partition)
            else:
                targets.append(partition)
        for group, members in sorted(groups.items()):
            turn = self._subject_turns.get((subject, group), 0)
            self._subject_turns[(subject, group)] = turn + 1
            targets.append(members[turn % len(members)])
        return targets

    def create_stream(self, name: str, config: StreamConfig | None = None) -> Stream:
        """Create ``name``; raises ``StreamDeleting`` while an older stream of that name is
        being deleted (``await wait_deleted(name)`` first to wait instead)."""
        self._check_open()
        validate_stream_name(name)
        return self._create(name, config or StreamConfig(), internal=False)

    def internal_stream(self, name: str, config: StreamConfig) -> Stream:
        """The internal stream ``name`` (``__`` prefix), created with ``config`` if absent: for
        the parts above the broker that keep their state in streams (the sites' queues). Only
        the broker's own code writes it, through its partitions; clients may read it. Its owner
        decides its settings: a stored stream with other settings (limits, retention) takes
        ``config`` (the partition count cannot change)."""
        self._check_open()
        found = self.streams.get(name)
        if found is None:
            return self._create(name, config, internal=True)
        if found.config != config:
            found.reconfigure(config, self.config.log)
            LOG.info("internal stream %s reconfigured", name)
        return found

    async def wait_deleted(self, name: str) -> None:
        """Return once no delete of a stream called ``name`` is in progress."""
        while (pending := self._deleting.get(name)) is not None:
            await asyncio.shield(pending)

    def _create(self, name: str, config: StreamConfig, *, internal: bool) -> Stream:
        if internal:
            validate_stream_name(name, internal=True)
        if name in self.streams:
            raise StreamExists(name)
        if name in self._deleting:
            raise StreamDeleting(name)
        directory = self.data_dir / "streams" / name
        if directory.exists():  # a create that failed half-way and could not clean up
            self._remove_dir(directory)
        try:
            stream = Stream(
                name,
                config,
                directory,
                self.config.log,
                self.loop,
                files=self.files,
                held=self.config.clustered,
            )
            try:
                stream.save()
            except BaseException:
                stream.discard()  # closes the logs without writing: the disk may be full
                raise
        except BaseException as error:
            # Nothing of a failed create may stay: not its files, not its open logs (Stream
            # closes the partitions it opened before failing).
            if directory.exists():
                self._remove_dir(directory)
            found = resource_error(error) if isinstance(error, OSError) else None
            if found is not None:
                raise found from error
            raise
        self._hold(stream)
        self.streams[name] = stream
        LOG.info("created stream %s (%d partitions)", name, config.partitions)
        return stream

    async def delete_stream(self, name: str) -> None:
        """Delete the stream: it is gone for readers and writers at once (on the loop); its
        directory becomes a tombstone and its logs are closed in a thread while the name stays
        reserved; the files are removed in the background."""
        stream = self.stream(name)
        _check_not_internal(name, "delete")
        del self.streams[name]
        done = self.loop.create_future()
        self._deleting[name] = done
        try:
            for partition in stream.partitions:
                partition.deleted = True
                partition.signal.fire()
            try:
                await stream.views.close()
            except Exception:  # the views' files go with the stream's directory anyway
                LOG.exception("closing the views of deleted stream %s failed", name)
            tombstone = await asyncio.to_thread(self._discard, stream)
        finally:
            del self._deleting[name]
            done.set_result(None)
        if tombstone is not None:
            self._remove_later(tombstone)
        LOG.info("deleted stream %s", name)

    def _discard(self, stream: Stream) -> Path | None:
        """Rename the stream's directory to a tombstone, then close its logs without writing
        (a thread; the stream's name is reserved meanwhile). Renaming first means no log can
        create or write a file under the stream's name after this returns.

        Should the rename fail (an I/O error on the directory), the stream is removed in place
        instead, still under the reserved name: its metadata first, so that whatever a crash
        leaves is never loaded again. Returns the tombstone, or None when there is none."""
        try:
            tombstone = self._entomb(stream.directory)
        except OSError as error:
            LOG.warning(
                "could not move %s aside (%s); removing it in place", stream.directory, error
            )
            stream.discard()
            _remove_in_place(stream.directory)
            return None
        try:
            stream.discard()
        except Exception:  # the files go with the tombstone whatever happened to the logs
            LOG.exception("closing the logs of deleted stream %s failed", stream.name)
        return tombstone

    def _entomb(self, directory: Path) -> Path:
        """Move ``directory`` out of ``streams/`` (one rename), returning its new path. The
        rename is made durable when the directories can be synced; if they cannot, a crash may
        bring the stream back (the delete is then simply not done)."""
        tombstones = self.data_dir / TOMBSTONES
        tombstones.mkdir(exist_ok=True)
        target = tombstones / f"{time.time_ns()}-{secrets.token_hex(4)}-{directory.name[:64]}"
        os.rename(directory, target)
        for parent in (directory.parent, tombstones):
            try:
                fd = os.open(parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as error:
                LOG.warning("could not sync %s after moving %s: %s", parent, directory, error)
        return target

    def _remove_dir(self, directory: Path) -> None:
        """Take a stream directory out of ``streams/`` now and remove its files later; when it
        cannot be moved (an I/O error), remove it in place, metadata first."""
        try:
            self._remove_later(self._entomb(directory))
        except OSError as error:
            LOG.warning("could not move %s aside (%s); removing it in place", directory, error)
            _remove_in_place(directory)

    def _remove_later(self, tombstone: Path) -> None:
        """Remove a tombstone's files in a thread; close() waits for it."""
        task = self.loop.create_task(asyncio.to_thread(shutil.rmtree, tombstone, True))
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    def pause(self, name: str, partitions: list[int] | None, resume_all: bool) -> None:
        stream = self.stream(name)
        _check_not_internal(name, "pause")
        if any(p.role is not None for p in stream.select(partitions)):
            raise FailedPrecondition(
                f"stream {name!r} is replicated by a cluster: pausing it would stop its "
                f"replication, so tidelog does not pause replicated partitions (docs/cluster.md)"
            )
        for partition in stream.select(partitions):
            partition.pause()
        stream.resume_all = resume_all
        stream.save()

    def resume(self, partition: Partition) -> None:
        stream = self.stream(partition.stream)
        targets = stream.partitions if stream.resume_all else [partition]
        for p in targets:
            p.resume()
        stream.resume_all = False
        stream.save()

    def set_readonly(self, name: str, partitions: list[int] | None, readonly: bool) -> None:
        stream = self.stream(name)
        _check_not_internal(name, "change the read-only flag of")
        for partition in stream.select(partitions):
            partition.set_readonly(readonly)
        stream.save()

    # -- publishing and subscribing --------------------------------------------------------------

    async def publish(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord],
        *,
        expected_offset: int | None = None,
        durable: bool = False,
    ) -> Published:
        """Append ``messages`` to one partition; returns their offsets and stored timestamp.

        ``expected_offset`` is checked only on streams created with optimistic concurrency.
        """
        check_headers(messages)
        target, expected_offset = self._publish_target(stream, partition, expected_offset)
        return await target.publish(messages, expected_offset=expected_offset, durable=durable)

    def _publish_target(
        self, stream: str, partition: int, expected_offset: int | None
    ) -> tuple[Partition, int | None]:
        """The partition to append to (resumed if paused), and the expected offset to check
        (None unless the stream uses optimistic concurrency)."""
        target_stream = self.stream(stream)
        _check_not_internal(stream, "publish to")
        target = target_stream.partition(partition)
        if target.paused and not target.readonly:
            self.resume(target)
        if not target_stream.config.optimistic_concurrency:
            expected_offset = None
        return target, expected_offset

    async def publish_idempotent(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord],
        producer_id: str,
        sequence: int,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
    ) -> Published:
        """Publish batch ``sequence`` of producer ``producer_id`` to one partition: appended
        atomically, or not at all when the partition holds it (or a later one) already — then
        ``duplicate`` is set (see ``producers.py``). The duplicate check comes first, so a retry
        of a publish that got through is a duplicate, never an incorrect expected offset."""
        validate_producer(producer_id, sequence)
        if not messages:
            raise InvalidArgument("an idempotent publish needs at least one message")
        check_headers(messages)
        target, expected_offset = self._publish_target(stream, partition, expected_offset)
        return await target.publish_idempotent(
            messages, producer_id, sequence, expected_offset=expected_offset, durable=durable
        )

    def subscribe(
        self,
        stream: str,
        partition: int,
        request: SubscribeRequest,
        *,
        resume: bool = False,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        group: tuple[str, str, int] | None = None,
        read_replica: bool = False,
    ) -> Subscription:
        """Resolve the request and return the subscription; every error is raised here, before
        anything is sent to the subscriber. Batch limits default to the broker's settings.
        ``read_replica``: a follower of a cluster may serve it (up to the high watermark)."""
        target = self.partition(stream, partition)
        if target.role is not None:
            target.role.check_read(read_replica)
        if target.paused and resume:
            self.resume(target)
        bounds = resolve(target.log, request)
        subscription = Subscription(
            target,
            bounds,
            max_messages=max_messages or self.config.subscriber_batch_messages,
            max_bytes=max_bytes or self.config.subscriber_batch_bytes,
            buffer_bytes=self.config.subscriber_buffer_bytes,
        )
        if group is not None:  # (group id, consumer id, group epoch)
            group_id, consumer_id, epoch = group
            subscription.on_close = self.groups.admit(
                group_id, consumer_id, epoch, stream, partition, subscription.fence
            )
        return subscription

    def consume(
        self, stream: str, partition: int, request: SubscribeRequest, *, max_messages: int
    ) -> Subscription:
        """A seekable subscription (``Consume``): it reads only what the subscriber grants and
        moves on :meth:`Subscription.seek`. It has no stop bound; every error of the start
        position is raised here."""
        target = self.partition(stream, partition)
        if target.role is not None:
            target.role.check_read(False)
        return Subscription(
            target,
            resolve(target.log, request),
            max_messages=max_messages,
            max_bytes=self.config.subscriber_batch_bytes,
            buffer_bytes=self.config.subscriber_buffer_bytes,
            seekable=True,
        )

    async def browse(
        self,
        stream: str,
        *,
        partitions: Sequence[int] = (),
        newest_first: bool = True,
        limit: int = DEFAULT_BROWSE_LIMIT,
        start_ns: int | None = None,
        token: str | None = None,
        keep: BrowseFilter | None = None,
        max_scan: int = DEFAULT_BROWSE_MAX_SCAN,
        max_scan_seconds: float = DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    ) -> BrowseResult:
        """One page of ``stream`` merged across ``partitions`` (all when empty) in timestamp
        order (``browse.py``), from ``start_ns``, or from a previous page's ``token`` (which
        overrides it); only records passing ``keep``. Paused partitions are resumed (a read
        opens them, as a resuming subscribe does). Every argument is checked here."""
        target = self.stream(stream)
        if not 1 <= limit <= MAX_BROWSE_LIMIT:
            raise InvalidArgument(f"browse limit must be 1..{MAX_BROWSE_LIMIT}, got {limit}")
        if max_scan < 1:
            raise InvalidArgument(f"max_scan must be at least 1 message, got {max_scan}")
        if not 0 < max_scan_seconds <= MAX_BROWSE_MAX_SCAN_SECONDS:
            raise InvalidArgument(
                f"max_scan_seconds must be above 0 and at most {MAX_BROWSE_MAX_SCAN_SECONDS:g}, "
                f"got {max_scan_seconds}"
            )
        numbers = sorted(set(partitions))
        for number in numbers:
            target.partition(number)  # PartitionNotFound for a number the stream lacks
        position = None
        if token:
            position = decode_token(token)
            check_token(
                position,
                stream=stream,
                newest_first=newest_first,
                partition_count=len(target.partitions),
                partitions=numbers,
            )
            numbers = list(position.partitions)
        chosen = target.select(numbers)
        for partition in chosen:
            if partition.paused:
                self.resume(partition)
            partition.check_serving()
        query = BrowseQuery(
            partitions=tuple(p.number for p in chosen),
            newest_first=newest_first,
            limit=limit,
            start_ns=start_ns,
            position=position,
            filter=keep or BrowseFilter(),
            max_scan=max_scan,
            max_scan_seconds=max_scan_seconds,
        )
        logs = {p.number: p.log for p in chosen}
        return await asyncio.to_thread(read_page, stream, logs, query)

    # -- materialised views ----------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        """Add a view to ``stream`` (idempotent for an identical definition); it is built from
        the stream's oldest retained record and then follows every append."""
        target = self.stream(stream)
        if stream.startswith("__"):
            raise InvalidArgument(f"stream {stream!r} is internal and takes no views")
        if await target.views.declare(spec):
            await asyncio.to_thread(target.save)

    async def drop_view(self, stream: str, name: str) -> None:
        target = self.stream(stream)
        await target.views.drop(name)
        await asyncio.to_thread(target.save)

    def views(self, stream: str) -> StreamViews:
        """The views of ``stream``, for queries."""
        return self.stream(stream).views

    # -- cursors ---------------------------------------------------------------------------------

    @property
    def cursors(self) -> CursorStore:
        self._check_open()
        assert self._cursors is not None, "Broker.start() has not run"
        return self._cursors

    # -- maintenance -----------------------------------------------------------------------------

    async def _maintain_forever(self) -> None:
        interval = self.config.maintenance_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.maintain()
            except Exception:  # one bad partition must not stop maintenance for the others
                LOG.exception("maintenance pass failed")

    async def maintain(self) -> None:
        """One pass: roll over-age segments, apply retention, pause idle partitions, snapshot
        the cursor indexes, checkpoint the views."""
        now = time.monotonic()
        self.groups.expire()
        if self._cursors is not None:
            await self._cursors.save()
        for stream in list(self.streams.values()):
            await stream.views.checkpoint()
            for partition in stream.partitions:
                if partition.paused or partition.deleted or partition.closed:
                    continue
                deleted = await asyncio.to_thread(partition.log.maintain)
                if stream.config.compact:
                    await asyncio.to_thread(partition.log.compact)
                await asyncio.to_thread(partition.save_producers)
                if deleted:
                    LOG.info(
                        "retention removed %d segments of %s/%d",
                        len(deleted),
                        stream.name,
                        partition.number,
                    )
                idle = now - partition.stats.last_activity_monotonic
                auto_pause = stream.config.auto_pause_s
                # Not a partition of a cluster (a role): closing a replica stops its
                # replication, and a follower has no publishes to count as activity.
                if (
                    auto_pause
                    and partition.role is None
                    and partition.subscribers == 0
                    and idle >= auto_pause
                ):
                    partition.pause()
                    stream.save()
                    LOG.info("auto-paused idle partition %s/%d", stream.name, partition.number)
