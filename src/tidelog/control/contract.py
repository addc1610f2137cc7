"""What every front needs from the server, as one contract, whatever the server's mode.

A front (the Liftbridge ``proto.API``, ``tidelog.v1``, later the Kafka listener) translates a
request into a call on :class:`Control` and its answer back into the wire's shape; it never asks
whether the server is one broker or a broker of a cluster. The server picks the implementation
once, at start: :class:`~tidelog.control.single.SingleBroker` or
:class:`~tidelog.control.clustered.ClusterControl`.

The promises each implementation keeps:

- **Local data, replicated decisions.** Reads and appends are served from this broker's own
  partitions (``publish``, ``subscribe``, ``consume``, ``browse``, ``views``); what a cluster
  decides together (which streams exist, who leads, group membership, which views exist) goes
  through the implementation, which in a cluster asks the controller or the metadata store.
- **Not the leader is an answer, not a guess.** A partition this broker does not lead raises
  :class:`~tidelog.errors.NotLeader` carrying the leader's broker id and leader epoch as this
  broker knows them. :meth:`Control.on_leader` runs a front's call on that leader (a single broker
  has no other: it raises the refusal), so no front matches error texts or reads metadata.
- **Errors are types** from ``tidelog.errors`` (the guard maps them to statuses); a mode that
  lacks a capability says so with :class:`~tidelog.errors.FailedPrecondition` and what to do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    import grpc

    from tidelog._proto.tidelog.v1 import cluster_pb2 as cpb
    from tidelog.broker import (
        BrowseAnchor,
        BrowseFilter,
        BrowseResult,
        CursorStore,
        Group,
        LogConfig,
        NewRecord,
        PackedValues,
        Partition,
        Published,
        Stream,
        StreamConfig,
        StreamViews,
        SubscribeRequest,
        Subscription,
        ViewSpec,
    )
    from tidelog.control.site_host import SiteHost
    from tidelog.errors import NotLeader

T = TypeVar("T")

LeaderCall = Callable[["grpc.aio.Channel"], Awaitable[T]]
"""A front's own call (its request, its stub) to run on another broker's channel."""


@dataclass(frozen=True, slots=True)
class Advertised:
    """How this broker names itself to clients: its id and the address they reach it at."""

    broker_id: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker as metadata describes it."""

    broker_id: str
    host: str
    port: int
    partitions: int
    """How many partitions it holds a replica of."""
    leading: int
    """How many of them it leads."""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as metadata describes it: where its replicas are and, when this broker
    holds one, its replica here (``local``; None: its offsets are unknown here)."""

    number: int
    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    readonly: bool
    local: Partition | None
    leader_epoch: int = -1
    """Raised by every change of leader (a cluster's; a single broker's is 0); -1: unknown."""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream as metadata describes it."""

    name: str
    subject: str
    created_ns: int
    """When this broker created its copy (0: it holds none)."""
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    config: StreamConfig | None = None
    """The settings it was created with (None: not known here); the server's defaults fill
    those it left unset (:attr:`Control.log_defaults`)."""
    replication_factor: int = 1
    min_isr: int = 1


@dataclass(frozen=True, slots=True)
class ViewProgress:
    """A view's progress, partition by partition (index = partition number)."""

    spec: ViewSpec
    applied_offsets: list[int]
    partition_entries: list[int]


class Control(Protocol):
    """The server as the fronts see it (module docstring). Every method raises
    ``tidelog.errors`` types only; arguments are checked here, not in the fronts."""

    @property
    def broker_id(self) -> str:
        """This broker's id."""
        ...

    @property
    def sites(self) -> SiteHost | None:
        """Where this server's site runs (None: no site id is set)."""
        ...

    @property
    def log_defaults(self) -> LogConfig:
        """The commit-log settings a stream's partitions here take where its own
        :class:`~tidelog.broker.StreamConfig` leaves one unset (the server's)."""
        ...

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self, name: str, config: StreamConfig, replication_factor: int, min_isr: int
    ) -> None:
        """Create ``name``; ``replication_factor`` -1 means every broker, 0 the default.
        ``StreamExists`` when it exists; a single broker refuses more than one replica."""
        ...

    async def delete_stream(self, name: str) -> None: ...

    def pause(self, name: str, partitions: list[int], resume_all: bool) -> None:
        """Pause (or with ``resume_all`` resume) the partitions here (all when empty)."""
        ...

    async def set_readonly(self, name: str, partitions: list[int], readonly: bool) -> None: ...

    def find_stream(self, name: str) -> Stream | None:
        """This broker's copy of ``name`` (None: it holds none)."""
        ...

    def stream(self, name: str) -> Stream:
        """This broker's copy of ``name``; ``StreamNotFound`` when it holds none."""
        ...

    def partition(self, stream: str, number: int) -> Partition:
        """This broker's replica of the partition (``StreamNotFound``/``PartitionNotFound``)."""
        ...

    def readable(self, stream: str, number: int) -> Partition:
        """This broker's replica of the partition for a front that reads its log itself (the
        Kafka front's Fetch and ListOffsets): ``NotLeader`` unless this broker leads it, and
        opened if it was paused (a read resumes a paused partition, as a resuming subscribe
        does)."""
        ...

    def subject_targets(self, subject: str) -> list[Partition]:
        """The partitions here that a publish to ``subject`` goes to."""
        ...

    def subject_shared(self, subject: str) -> bool:
        """Whether a stream on ``subject`` would receive publishes that streams here already
        receive (a stream joining others' traffic). No side effect."""
        ...

    # -- metadata --------------------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        """Every broker known, sorted by id."""
        ...

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        """Broker id -> (host, port) Kafka clients reach that broker's Kafka listener at, for
        every live broker that registered one, as of now (it follows membership: read it at
        each use). A single broker knows no other: empty (its listener names itself)."""
        ...

    def stream_names(self) -> list[str]:
        """Every stream's name, sorted."""
        ...

    def describe_stream(self, name: str) -> StreamInfo | None:
        """``name`` as metadata describes it (None: no such stream)."""
        ...

    def describe_partition(self, stream: str, number: int) -> PartitionInfo:
        """The partition as its leader describes it: ``NotLeader`` on another broker."""
        ...

    async def group_coordinator(self, group_id: str) -> tuple[str, int] | None:
        """(coordinator broker id, epoch) of the group as of now (None: no such group)."""
        ...

    # -- publishing ------------------------------------------------------------------------------

    async def publish(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord] | PackedValues,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
    ) -> Published:
        """Append to the partition's leader here (``NotLeader`` elsewhere); ``durable``: on
        disk, and in a cluster acknowledged by ``minIsr`` in-sync replicas."""
        ...

    async def publish_idempotent(
        self,
        stream: str,
        partition: int,
        messages: Sequence[bytes | NewRecord] | PackedValues,
        producer_id: str,
        sequence: int,
        *,
        expected_offset: int | None = None,
        durable: bool = False,
        owner: str = "",
    ) -> Published:
        """``publish`` that drops a producer's retry of a batch the partition holds. ``owner``
        is the caller's principal (``tidelog.access.caller().identity``, passed by the front:
        the broker does not read the access layer); a producer id belongs to the first one
        that stores a batch under it, and another's batch is ``PermissionDenied``."""
        ...

    async def on_leader(
        self, stream: str, partition: int, refusal: NotLeader, call: LeaderCall[T]
    ) -> T:
        """``call`` run on the channel of the partition's leader, for a request this broker
        refused with ``refusal`` (a :class:`~tidelog.errors.NotLeader`). Raises ``refusal`` when
        no other broker leads it (a single broker; no leader now). A failed call's
        ``grpc.aio.AioRpcError`` is raised as :class:`~tidelog.errors.Forwarded`."""
        ...

    # -- reading ---------------------------------------------------------------------------------

    async def subscribe(
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
        principal: str | None = None,
    ) -> Subscription:
        """A subscription to the partition here (``group``: (group id, consumer id, epoch),
        checked against the group's current assignment). Every error is raised here.

        ``principal`` (here and in every group call below) is the caller's, for the members
        the server binds to the principal that joined (``tidelog.broker.groups``, "Owners"):
        ``PermissionDenied`` for a member another principal joined as. None acts for any
        member (the server's own calls; a broker of the cluster passing a member's on). The
        front passes it as a plain string: the broker does not read the access layer."""
        ...

    def consume(
        self, stream: str, partition: int, request: SubscribeRequest, *, max_messages: int
    ) -> Subscription:
        """A seekable subscription (``Consume``) to the partition here."""
        ...

    async def browse(
        self,
        stream: str,
        *,
        partitions: Sequence[int],
        newest_first: bool,
        limit: int,
        start_ns: int | None,
        anchor: BrowseAnchor | None,
        token: str | None,
        keep: BrowseFilter | None,
        max_scan: int,
        max_scan_seconds: float,
    ) -> BrowseResult:
        """One page of the stream's partitions here, merged (``Broker.browse``)."""
        ...

    @property
    def draining(self) -> bool:
        """The server is shutting down: streams of requests end."""
        ...

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once a drain starts; returns its withdrawal."""
        ...

    # -- cursors and groups ----------------------------------------------------------------------

    async def cursors(self) -> CursorStore:
        """Where consumer cursors are kept (in a cluster, a replicated stream whose partitions'
        leaders take the calls)."""
        ...

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Store a cursor (``CursorStore.set``: durable, and in a cluster acknowledged by the
        ISR) on the leader of the cursor partition its key hashes to: this broker on a single
        broker or when it leads that partition, else that leader, called as this broker (the
        cluster's principal: the front checked its own caller first). For a front whose
        keys belong to one owner placed elsewhere (a Kafka group's coordinator); the cursors
        stay where any other set puts them. A leader moving meanwhile is looked up again a few
        times, then ``NotEnoughReplicas``; the leader's refusal is
        :class:`~tidelog.errors.Forwarded`."""
        ...

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int | None:
        """A cursor's value as the leader of its cursor partition holds it (None: never set;
        -1 is a value like any other), reached as :meth:`set_cursor` does."""
        ...

    @property
    def group_timeouts(self) -> tuple[float, float]:
        """(consumer timeout, coordinator timeout) in seconds."""
        ...

    def local_groups(self) -> Mapping[str, Group]:
        """The groups this broker coordinates (in a cluster: mirrors), by id."""
        ...

    async def join_group(
        self, group_id: str, consumer_id: str, streams: list[str], *, principal: str | None = None
    ) -> tuple[str, int]:
        """Join (or rejoin); (coordinator broker id, group epoch)."""
        ...

    async def leave_group(
        self, group_id: str, consumer_id: str, *, principal: str | None = None
    ) -> None: ...

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> tuple[int, dict[str, list[int]]]:
        """(group epoch, stream -> partitions assigned to the consumer)."""
        ...

    async def report_coordinator(
        self,
        group_id: str,
        consumer_id: str,
        coordinator: str,
        epoch: int,
        *,
        handed: bool,
        principal: str | None = None,
    ) -> None:
        """A consumer reports its coordinator unreachable (``handed``: another broker passed
        the report on, so it goes no further)."""
        ...

    # -- views -----------------------------------------------------------------------------------

    async def declare_view(self, stream: str, spec: ViewSpec) -> None: ...

    async def drop_view(self, stream: str, name: str) -> None: ...

    def views(self, stream: str) -> StreamViews:
        """This broker's views of ``stream``, for queries of the partitions it leads."""
        ...

    async def view_answers(
        self,
        stream: str,
        partition: int | None,
        view: str,
        local: Callable[[int | None], Awaitable[T]],
        remote: Callable[[grpc.aio.Channel, int], Awaitable[T]],
        *,
        handed: bool,
    ) -> list[T]:
        """The answers to merge for a view query on ``partition`` (None: all): this broker's
        own (``local``), or in a cluster each partition's leader's (``remote`` on the leader's
        channel for partition N alone). ``handed``: another broker passed the query on, so it is
        answered here alone, and refused when this broker does not lead ``partition``."""
        ...

    async def view_progress(
        self,
        stream: str,
        remote: Callable[[grpc.aio.Channel, int], Awaitable[list[ViewProgress]]],
        *,
        handed: bool,
    ) -> list[ViewProgress]:
        """Every view of ``stream`` with each partition's progress as its leader sees it."""
        ...

    # -- the cluster's own calls -----------------------------------------------------------------

    async def replica_fetch(self, request: cpb.ReplicaFetchRequest) -> cpb.ReplicaFetchResponse:
        """A follower's fetch (``FailedPrecondition`` on a single broker)."""
        ...

    def replica_stream(
        self, first: cpb.ReplicaFetchRequest, acks: AsyncIterator[cpb.ReplicaFetchRequest]
    ) -> AsyncIterator[bytes]:
        """A follower's replication stream opened by ``first``: its responses, each a
        ``ReplicaFetchResponse`` serialised (``FailedPrecondition`` on a single broker, when
        iterated)."""
        ...

    def epoch_end(
        self, request: cpb.OffsetForLeaderEpochRequest
    ) -> cpb.OffsetForLeaderEpochResponse:
        """Where a leader epoch ends in this leader's log (a follower asks before truncating)."""
        ...

    async def cluster_status(self, stream: str, local_only: bool) -> cpb.ClusterStatusResponse:
        """Every partition's replicas, ISR and offsets (``FailedPrecondition`` on one broker)."""
        ...

    async def reassign(
        self, stream: str, partition: int, replicas: list[str]
    ) -> cpb.ClusterStatusResponse:
        """Move the partition's replicas; the partition's status afterwards."""
        ...
