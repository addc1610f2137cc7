"""The tidelog client: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking)."""

from tidelog.client.aio import DEFAULT_SERVER, AsyncClient
from tidelog.client.batches import BinaryColumn, ReceivedBatch
from tidelog.client.cluster_calls import ClusterStatus, PartitionReplicas
from tidelog.client.describe_calls import (
    GroupInfo,
    GroupMemberInfo,
    PartitionDetails,
    StreamDetails,
    StreamSettings,
)
from tidelog.client.errors import (
    AlreadyExists,
    ClientError,
    DataLoss,
    FailedPrecondition,
    IncorrectOffset,
    InvalidArgument,
    LimitReached,
    MessageTooLarge,
    NotFound,
    PartitionPaused,
    PartitionReadonly,
    StreamEmpty,
    Unavailable,
    Unimplemented,
)
from tidelog.client.models import (
    Ack,
    BrowsePage,
    Message,
    PartitionInfo,
    ReceivedMessage,
    StreamInfo,
)
from tidelog.client.routing_listener import RoutedMessage
from tidelog.client.settings import ClientSettings, tls_from
from tidelog.client.site_calls import SiteInfo, SiteStatus
from tidelog.client.snapshot_provider import SnapshotRequest
from tidelog.client.sync import Client
from tidelog.client.view_calls import View, ViewEntry, ViewStatus
from tidelog.security import ClientTls, TlsError

__all__ = [
    "DEFAULT_SERVER",
    "Ack",
    "AlreadyExists",
    "AsyncClient",
    "BinaryColumn",
    "BrowsePage",
    "Client",
    "ClientError",
    "ClientSettings",
    "ClientTls",
    "ClusterStatus",
    "DataLoss",
    "FailedPrecondition",
    "GroupInfo",
    "GroupMemberInfo",
    "IncorrectOffset",
    "InvalidArgument",
    "LimitReached",
    "Message",
    "MessageTooLarge",
    "NotFound",
    "PartitionDetails",
    "PartitionInfo",
    "PartitionPaused",
    "PartitionReadonly",
    "PartitionReplicas",
    "ReceivedBatch",
    "ReceivedMessage",
    "RoutedMessage",
    "SiteInfo",
    "SiteStatus",
    "SnapshotRequest",
    "StreamDetails",
    "StreamEmpty",
    "StreamInfo",
    "StreamSettings",
    "TlsError",
    "Unavailable",
    "Unimplemented",
    "View",
    "ViewEntry",
    "ViewStatus",
    "tls_from",
]
