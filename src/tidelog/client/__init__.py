"""The tidelog client: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking)."""

from tidelog.client.aio import DEFAULT_SERVER, AsyncClient
from tidelog.client.errors import (
    AlreadyExists,
    ClientError,
    DataLoss,
    FailedPrecondition,
    IncorrectOffset,
    InvalidArgument,
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
from tidelog.client.settings import ClientSettings
from tidelog.client.site_calls import SiteInfo, SiteStatus
from tidelog.client.snapshot_provider import SnapshotRequest
from tidelog.client.sync import Client
from tidelog.client.view_calls import View, ViewEntry, ViewStatus

__all__ = [
    "DEFAULT_SERVER",
    "Ack",
    "AlreadyExists",
    "AsyncClient",
    "BrowsePage",
    "Client",
    "ClientError",
    "ClientSettings",
    "DataLoss",
    "FailedPrecondition",
    "IncorrectOffset",
    "InvalidArgument",
    "Message",
    "MessageTooLarge",
    "NotFound",
    "PartitionInfo",
    "PartitionPaused",
    "PartitionReadonly",
    "ReceivedMessage",
    "RoutedMessage",
    "SiteInfo",
    "SiteStatus",
    "SnapshotRequest",
    "StreamEmpty",
    "StreamInfo",
    "Unavailable",
    "Unimplemented",
    "View",
    "ViewEntry",
    "ViewStatus",
]
