"""The broker: every stream of one data directory, on one asyncio event loop.

It owns stream lifecycle (create, delete, pause/resume, read-only), publishing with optimistic
concurrency, subscriptions, cursors, and periodic maintenance (age rolls, retention,
auto-pause). Structural changes happen on the loop; blocking log work (syncs, retention's file
deletion, cursor scans) runs in threads.

:class:`Broker` is a facade over parts, one concern each: the state and lookups they all share
(``core.py``), deleting a stream and its tombstones (``deletion.py``), reads resolved and handed
over (``reads.py``), periodic maintenance (``maintenance.py``) and the data directory's lock and
broker id (``data_dir.py``). It keeps start and close, creating streams, their flags, publishing,
views and cursors.

Deleting a stream never touches the files of a later stream of the same name (``deletion.py``
says how). A stream directory without its ``stream.json`` (a create cut short) is never loaded
and is moved aside at start.

Consumer groups are saved in ``<data_dir>/groups.json`` (``groups.py``; off the loop, many
changes per write, by ``group_writer.py``) after every membership change and restored at start
before any stream opens; an unreadable file stops the start.

Internal streams (``__`` names, e.g. ``__cursors``) are written, paused and made read-only only
by the broker; the client-facing methods here refuse with ``PermissionDenied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from tidelog.broker.config import StreamConfig, validate_stream_name
from tidelog.broker.core import check_not_internal, open_files_capacity
from tidelog.broker.cursors import CursorStore
from tidelog.broker.data_dir import stored_broker_id
from tidelog.broker.deletion import TOMBSTONES, StreamDeletion
from tidelog.broker.groups import GROUPS_FILE, read_groups
from tidelog.broker.limits import check_new_stream, check_new_view, client_streams
from tidelog.broker.maintenance import Maintenance
from tidelog.broker.partition import Partition, ReplicaRole
from tidelog.broker.partition_view import ViewSpec
from tidelog.broker.producers import Published, check_headers, validate_producer
from tidelog.broker.reads import Reads
from tidelog.broker.stream import METADATA_FILE, Stream
from tidelog.broker.stream_views import StreamViews
from tidelog.broker.subscription import arm_faults_from_environment
from tidelog.durable import make_dirs, make_private
from tidelog.errors import (
    FailedPrecondition,
    InvalidArgument,
    StreamDeleting,
    StreamExists,
    resource_error,
)
from tidelog.log import NewRecord
from tidelog.wire import CURSORS_STREAM, INTERNAL_PREFIX

__all__ = ["Broker", "open_files_capacity"]  # the capacity rule is checked through this module

LOG = logging.getLogger("tidelog.broker")


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


class Broker(StreamDeletion, Reads, Maintenance):
    """Create with a :class:`BrokerConfig`, then ``await start()`` on the loop that will run it.

    Its state and the lookups (``stream``, ``partition``, ``find_stream``, ``list_streams``,
    ``resume``) are :class:`~tidelog.broker.core.BrokerCore`'s; ``delete_stream`` and
    ``wait_deleted`` come from ``deletion.py``, ``subscribe``, ``consume`` and ``browse`` from
    ``reads.py``, ``maintain`` from ``maintenance.py``."""

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
        make_dirs(self.data_dir / "streams")
        # Private whatever an older release or the umask left, when it is ours to change (files
        # and directories beneath it are 0600 and 0700 anyway: durable.py).
        exposed = make_private(self.data_dir)
        if exposed is not None:
            LOG.warning("%s; set its mode to 700 if only this server should use it", exposed)
        # Made now, so that deleting a stream on a full disk needs no new directory.
        make_dirs(self.data_dir / TOMBSTONES)
        self._data_dir_lock.acquire()
        self.broker_id = self.config.broker_id or stored_broker_id(self.data_dir)
        try:  # before any stream opens: an unreadable file stops the start with nothing open
            self.groups.restore(read_groups(self.data_dir / GROUPS_FILE))
            self.group_writer.restart()
        except BaseException:
            self._data_dir_lock.release()
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
                self.descriptors,
            )
            self._hold(stream)
            self.streams[stream.name] = stream
            stream.views.start()
            LOG.info("opened stream %s (%d partitions)", stream.name, len(stream.partitions))
        self._remove_tombstones()
        if CURSORS_STREAM not in self.streams:
            self._create(
                CURSORS_STREAM,
                StreamConfig(partitions=self.config.cursor_partitions, compact=True),
                internal=True,
            )
        self._repair_internal(self.streams[CURSORS_STREAM])
        self._cursors = CursorStore(
            self.streams[CURSORS_STREAM],
            self.resume,
            check_target=self.check_readable,
            max_per_stream=self.config.max_cursors_per_stream,
        )
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
        await self.group_writer.flush()
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
        self._data_dir_lock.release()

    # -- streams ---------------------------------------------------------------------------------

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

    def subject_shared(self, subject: str) -> bool:
        """Whether a new stream on ``subject`` would receive publishes some client stream here
        already receives: one on the same subject, or on ``subject`` + ``.n``, or on its base
        when ``subject`` is ``S.n`` (:meth:`subject_targets`' routing). No side effect."""
        for stream in self.list_streams():
            if stream.name.startswith(INTERNAL_PREFIX):
                continue
            theirs = stream.subject
            if theirs == subject or _numbered(theirs, subject) or _numbered(subject, theirs):
                return True
        return False

    def create_stream(self, name: str, config: StreamConfig | None = None) -> Stream:
        """Create ``name``; raises ``StreamDeleting`` while an older stream of that name is
        being deleted (``await wait_deleted(name)`` first to wait instead)."""
        self._check_open()
        validate_stream_name(name)
        config = config or StreamConfig()
        if name not in self.streams:  # a taken name is StreamExists, whatever the caps
            check_new_stream(self.config, name, config, client_streams(self.streams))
        return self._create(name, config, internal=False)

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
                budget=self.descriptors,
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

    def pause(self, name: str, partitions: list[int] | None, resume_all: bool) -> None:
        stream = self.stream(name)
        check_not_internal(name, "pause")
        if any(p.role is not None for p in stream.select(partitions)):
            raise FailedPrecondition(
                f"stream {name!r} is replicated by a cluster: pausing it would stop its "
                f"replication, so tidelog does not pause replicated partitions (docs/cluster.md)"
            )
        for partition in stream.select(partitions):
            partition.pause()
        stream.resume_all = resume_all
        stream.save()

    def set_readonly(self, name: str, partitions: list[int] | None, readonly: bool) -> None:
        stream = self.stream(name)
        check_not_internal(name, "change the read-only flag of")
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
        check_not_internal(stream, "publish to")
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
        owner: str = "",
    ) -> Published:
        """Publish batch ``sequence`` of producer ``producer_id`` to one partition: appended
        atomically, or not at all when the partition holds it (or a later one) already — then
        ``duplicate`` is set (see ``producers.py``). The duplicate check comes first, so a retry
        of a publish that got through is a duplicate, never an incorrect expected offset.
        ``owner``: the caller's principal; ``ProducerIdTaken`` (``PermissionDenied``) when the
        producer id belongs to another one, before the duplicate check."""
        validate_producer(producer_id, sequence)
        if not messages:
            raise InvalidArgument("an idempotent publish needs at least one message")
        check_headers(messages)
        target, expected_offset = self._publish_target(stream, partition, expected_offset)
        return await target.publish_idempotent(
            messages,
            producer_id,
            sequence,
            expected_offset=expected_offset,
            durable=durable,
            owner=owner,
        )

    # -- materialised views ----------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None:
        """Add a view to ``stream`` (idempotent for an identical definition); it is built from
        the stream's oldest retained record and then follows every append."""
        target = self.stream(stream)
        if stream.startswith("__"):
            raise InvalidArgument(f"stream {stream!r} is internal and takes no views")
        if spec.name not in target.views.specs:
            count = sum(len(s.views.specs) for s in self.streams.values())
            check_new_view(self.config, stream, spec.name, count)
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


def _numbered(base: str, subject: str) -> bool:
    """Whether ``subject`` is ``base`` + ``.n`` (a publish to it reaches a partition of a stream
    on ``base``)."""
    head, dot, number = subject.rpartition(".")
    return bool(dot) and head == base and number.isdigit()
