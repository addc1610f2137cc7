"""The broker: streams of partitioned commit logs, subscriptions, cursors, groups and views.

This package's face (the names below) is what the layers above it call (the api, the control,
the cluster and the sites), no more: nothing above the broker imports ``tidelog.log`` or a broker
submodule (the broker's own tests may, as they mirror its modules). The contract, promise by
promise:

- **Streams** are created, paused, made read-only and deleted by name (:class:`Broker`). A
  delete keeps the name reserved until the stream's files are out of the way; a create of the
  same name waits for it (``wait_deleted``) and can never touch the old stream's files.
- **Publishing** appends a batch to one partition atomically: every message of it is stored and
  numbered with consecutive offsets, or none is (``publish``; ``publish_idempotent`` also drops a
  producer's retry of a batch the partition holds). The returned offsets are readable at once;
  ``durable=True`` returns only once they are on disk.
- **Reading** a partition as it grows happens in one place, :class:`Subscription`: Subscribe,
  SubscribeBatches and Consume (``subscribe`` / ``consume``) all pull verified
  :class:`MessageBatch` objects from it, by offset, so a subscriber never misses or repeats a
  message between catching up and following live appends. Its states and
  events are one table (``subscription.TRANSITIONS``). Each subscriber holds at most one batch,
  bounded by ``subscriber_buffer_bytes``; delivery turns (:func:`delivery_gate`) keep many
  subscribers' sends from crowding out publishers.
- **Browsing** (``browse``) reads one page of a stream merged across partitions in timestamp
  order, newest or oldest first, with filters given as data and a scan budget; a token
  continues it (``browse.py`` has the theory of the merge).
- **Consumer groups** (``groups``) are coordinated by the broker alone, saved in its data
  directory; in a cluster its :class:`GroupCoordinator` becomes a mirror of what the cluster
  decides (``mirror``), and :func:`assign_partitions` is the one assignment rule of both.
- **Errors** are ``tidelog.errors`` classes, each of which the api maps to one status; anything
  else escaping the broker is a bug.
- **Defaults** of every layer are named once (``log/config.py``, ``broker/config.py``) and
  re-exported here, so the server's settings name them rather than repeat them.
- **Resources** are bounded: open segment files and views' stores by ``open_files_max`` (shared
  by every partition, ``descriptors.py``), subscriber buffers by ``subscriber_buffer_bytes``;
  streams, partitions per stream, groups, views and cursors per stream by their ``max_*``
  settings (``LimitReached`` beyond them, naming the setting).
"""

from tidelog.broker.broker import Broker
from tidelog.broker.browse import BrowseAnchor, BrowseResult
from tidelog.broker.browse_filter import BrowseFilter
from tidelog.broker.config import (
    DEFAULT_BROWSE_LIMIT,
    DEFAULT_BROWSE_MAX_SCAN,
    DEFAULT_BROWSE_MAX_SCAN_SECONDS,
    DEFAULT_CONSUME_BATCH_MESSAGES,
    DEFAULT_CURSOR_PARTITIONS,
    DEFAULT_DATA_DIR,
    DEFAULT_MAINTENANCE_INTERVAL_S,
    DEFAULT_MAX_CURSORS_PER_STREAM,
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_PARTITIONS_PER_STREAM,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_VIEWS,
    DEFAULT_OPEN_FILES_MAX,
    DEFAULT_SUBSCRIBER_BUFFER_BYTES,
    MAX_CURSOR_ID_BYTES,
    MAX_PARTITIONS,
    BrokerConfig,
    StreamConfig,
    validate_stream_name,
)
from tidelog.broker.cursors import CursorStore
from tidelog.broker.delivery import delivery_gate
from tidelog.broker.groups import (
    Group,
    GroupCoordinator,
    GroupMember,
    MemberOfAnotherPrincipal,
    assign_partitions,
    check_group_join,
    check_owner,
)
from tidelog.broker.limits import check_new_stream, client_streams
from tidelog.broker.partition import (
    HW_CHECKPOINT,
    CommitSignal,
    Partition,
    ReplicaRole,
    running_on,
    saved_high_watermark,
)
from tidelog.broker.partition_view import ViewEntry, ViewKind, ViewSpec
from tidelog.broker.positions import StartPosition, StopPosition, SubscribeRequest
from tidelog.broker.producers import ProducerIdTaken, Published
from tidelog.broker.stream import Stream
from tidelog.broker.stream_views import (
    StreamViews,
    merge_view_ranges,
    merge_view_windows,
    newest_view_entry,
    view_query_limit,
)
from tidelog.broker.subscription import EndReason, Subscription

# What the broker takes and hands out that the log defines: part of the broker's face.
from tidelog.log import FlushPolicy, LogConfig, MessageBatch, NewRecord
from tidelog.log.bodies import RecordBodies
from tidelog.log.config import (
    DEFAULT_FLUSH_INTERVAL_S,
    DEFAULT_FLUSH_POLICY,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_RETENTION_AGE_S,
    DEFAULT_SEGMENT_MAX_AGE_S,
    DEFAULT_SEGMENT_MAX_BYTES,
    MAX_MESSAGE_BYTES_LIMIT,
    MIN_SEGMENT_BYTES,
)
from tidelog.log.readahead import Lease, ReadAheadBudget
from tidelog.log.record import HeaderedValues, PackedValues

__all__ = [
    "DEFAULT_BROWSE_LIMIT",
    "DEFAULT_BROWSE_MAX_SCAN",
    "DEFAULT_BROWSE_MAX_SCAN_SECONDS",
    "DEFAULT_CONSUME_BATCH_MESSAGES",
    "DEFAULT_CURSOR_PARTITIONS",
    "DEFAULT_DATA_DIR",
    "DEFAULT_FLUSH_INTERVAL_S",
    "DEFAULT_FLUSH_POLICY",
    "DEFAULT_MAINTENANCE_INTERVAL_S",
    "DEFAULT_MAX_CURSORS_PER_STREAM",
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_PARTITIONS_PER_STREAM",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_MAX_VIEWS",
    "DEFAULT_OPEN_FILES_MAX",
    "DEFAULT_RETENTION_AGE_S",
    "DEFAULT_SEGMENT_MAX_AGE_S",
    "DEFAULT_SEGMENT_MAX_BYTES",
    "DEFAULT_SUBSCRIBER_BUFFER_BYTES",
    "HW_CHECKPOINT",
    "MAX_CURSOR_ID_BYTES",
    "MAX_MESSAGE_BYTES_LIMIT",
    "MAX_PARTITIONS",
    "MIN_SEGMENT_BYTES",
    "Broker",
    "BrokerConfig",
    "BrowseAnchor",
    "BrowseFilter",
    "BrowseResult",
    "CommitSignal",
    "CursorStore",
    "EndReason",
    "FlushPolicy",
    "Group",
    "GroupCoordinator",
    "GroupMember",
    "HeaderedValues",
    "Lease",
    "LogConfig",
    "MemberOfAnotherPrincipal",
    "MessageBatch",
    "NewRecord",
    "PackedValues",
    "Partition",
    "ProducerIdTaken",
    "Published",
    "ReadAheadBudget",
    "RecordBodies",
    "ReplicaRole",
    "StartPosition",
    "StopPosition",
    "Stream",
    "StreamConfig",
    "StreamViews",
    "SubscribeRequest",
    "Subscription",
    "ViewEntry",
    "ViewKind",
    "ViewSpec",
    "assign_partitions",
    "check_group_join",
    "check_new_stream",
    "check_owner",
    "client_streams",
    "delivery_gate",
    "merge_view_ranges",
    "merge_view_windows",
    "newest_view_entry",
    "running_on",
    "saved_high_watermark",
    "validate_stream_name",
    "view_query_limit",
]
