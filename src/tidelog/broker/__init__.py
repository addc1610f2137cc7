"""The broker: streams of partitioned commit logs, subscriptions, cursors, maintenance."""

from tidelog.broker.broker import Broker
from tidelog.broker.config import (
    CURSORS_STREAM,
    DEFAULT_OPEN_FILES_MAX,
    DEFAULT_SUBSCRIBER_BUFFER_BYTES,
    BrokerConfig,
    StreamConfig,
    validate_stream_name,
)
from tidelog.broker.partition import Partition
from tidelog.broker.stream import Stream
from tidelog.broker.subscription import (
    StartPosition,
    StopPosition,
    SubscribeRequest,
    SubscriberState,
    Subscription,
)
from tidelog.broker.view_set import StreamViews
from tidelog.broker.views import ViewEntry, ViewKind, ViewSpec
from tidelog.log import MessageBatch  # what a Subscription yields: part of the broker's face

__all__ = [
    "CURSORS_STREAM",
    "DEFAULT_OPEN_FILES_MAX",
    "DEFAULT_SUBSCRIBER_BUFFER_BYTES",
    "Broker",
    "BrokerConfig",
    "MessageBatch",
    "Partition",
    "StartPosition",
    "StopPosition",
    "Stream",
    "StreamConfig",
    "StreamViews",
    "SubscribeRequest",
    "SubscriberState",
    "Subscription",
    "ViewEntry",
    "ViewKind",
    "ViewSpec",
    "validate_stream_name",
]
