"""What every part of the broker shares (``broker.py`` is the facade over them): its settings and
state, the loop it runs on, and the lookups every call starts with.

Invariants. ``streams`` holds exactly the streams clients can reach: a stream leaves it, on the
loop, before anything of its deletion starts, and a name is never in ``streams`` and in
``_deleting`` at once (``deletion.py``). ``stream`` and ``partition`` refuse once the broker is
closing (``BrokerClosed``), and name what another broker of a cluster holds with ``NotLeader``
rather than ``StreamNotFound``. The state here is touched on the loop only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from collections.abc import Callable
from pathlib import Path

from tidelog.broker.config import BrokerConfig
from tidelog.broker.cursors import CursorStore
from tidelog.broker.data_dir import DataDirLock
from tidelog.broker.descriptors import DescriptorBudget
from tidelog.broker.group_writer import GroupWriter
from tidelog.broker.groups import GROUPS_FILE, GroupCoordinator, write_groups
from tidelog.broker.partition import Partition, ReplicaRole
from tidelog.broker.stream import Stream
from tidelog.errors import (
    BrokerClosed,
    NotLeader,
    PartitionNotFound,
    PermissionDenied,
    StreamNotFound,
)
from tidelog.log.filecache import MOST_PER_SEGMENT, FileCache
from tidelog.wire import INTERNAL_PREFIX

LOG = logging.getLogger("tidelog.broker")


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


def check_not_internal(name: str, action: str) -> None:
    if name.startswith(INTERNAL_PREFIX):
        raise PermissionDenied(
            f"stream {name!r} is internal: only the broker may {action} it (it is read with "
            f"the usual calls; cursors are set with SetCursor)"
        )


class BrokerCore:
    """The broker's state and lookups, shared by its parts (the module's invariants)."""

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
            max_groups=self.config.max_groups,
        )
        """Consumer groups, saved in ``<data_dir>/groups.json`` and restored by :meth:`start`."""
        self.group_writer = GroupWriter(
            self.groups, functools.partial(write_groups, self.data_dir / GROUPS_FILE)
        )
        """Saves the groups off the loop; a join or leave awaits its ``saved()``."""
        self._closed = False
        self._data_dir_lock = DataDirLock(self.data_dir)
        self.started_ns = 0
        capacity = open_files_capacity(self.config.open_files_max)
        self.files = FileCache(capacity)
        """Open segment files of every partition, bounded (``open_files_max`` descriptors)."""
        self.descriptors = DescriptorBudget(capacity, self.files)
        """``open_files_max`` shared by the segment files and the views (``descriptors.py``)."""
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

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerClosed("the broker is shutting down")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Broker.start() has not run"
        return self._loop

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

    def check_readable(self, name: str, number: int) -> None:
        """``StreamNotFound`` or ``PartitionNotFound`` unless partition ``number`` of ``name``
        exists here or, in a cluster, on another broker (what a cursor may name)."""
        found = self.streams.get(name)
        if found is not None and 0 <= number < len(found.partitions):
            return
        elsewhere = self.hosted_elsewhere
        if number >= 0 and elsewhere is not None and elsewhere(name, number) is not None:
            return
        if found is None:
            raise StreamNotFound(name)
        raise PartitionNotFound(name, number, len(found.partitions))

    def partition(self, stream: str, number: int) -> Partition:
        found = self.stream(stream)
        if number >= len(found.partitions):
            self._check_elsewhere(stream, number)
        return found.partition(number)

    def resume(self, partition: Partition) -> None:
        # Here, not with pause: publishes and reads resume the partitions they open.
        stream = self.stream(partition.stream)
        targets = stream.partitions if stream.resume_all else [partition]
        for p in targets:
            p.resume()
        stream.resume_all = False
        stream.save()
