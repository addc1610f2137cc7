"""tidelog's errors as Kafka error codes: one table, as ``tidelog.api.status`` is for gRPC.

Kafka answers most failures inside the response, per topic or partition (an error code, and in
newer versions a message), and keeps the connection; a client acts on the code (refresh metadata
on ``NOT_LEADER_OR_FOLLOWER``, retry on retriable ones, give up on the rest). So a handler catches
what a call on the control raises and puts :func:`code_of` in the answer; anything not in the
table is a bug, answered ``UNKNOWN_SERVER_ERROR`` and logged with its traceback.
"""

from __future__ import annotations

import logging
from typing import Final

from kio.schema.errors import ErrorCode

from tidelog.errors import (
    BrokerClosed,
    DiskFull,
    FailedPrecondition,
    Fenced,
    GroupNotFound,
    InvalidArgument,
    LimitReached,
    MessageTooLarge,
    MetadataUnavailable,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    OutOfDescriptors,
    PartitionNotFound,
    PartitionPaused,
    PartitionReadonly,
    PermissionDenied,
    StreamDeleted,
    StreamDeleting,
    StreamExists,
    StreamNotFound,
    SyncFailed,
    TidelogError,
    Unauthenticated,
)

LOG = logging.getLogger("tidelog.kafka")

CODES: Final[tuple[tuple[type[BaseException], ErrorCode], ...]] = (
    (NotLeader, ErrorCode.not_leader_or_follower),
    (StreamNotFound, ErrorCode.unknown_topic_or_partition),
    (PartitionNotFound, ErrorCode.unknown_topic_or_partition),
    (StreamDeleted, ErrorCode.unknown_topic_or_partition),
    (StreamDeleting, ErrorCode.unknown_topic_or_partition),
    (StreamExists, ErrorCode.topic_already_exists),
    (MessageTooLarge, ErrorCode.message_too_large),
    (OffsetOutOfRange, ErrorCode.offset_out_of_range),
    (NotEnoughReplicas, ErrorCode.not_enough_replicas),
    (MetadataUnavailable, ErrorCode.leader_not_available),
    (BrokerClosed, ErrorCode.leader_not_available),  # shutting down: another broker, or later
    (PartitionPaused, ErrorCode.leader_not_available),
    (DiskFull, ErrorCode.kafka_storage_error),
    (SyncFailed, ErrorCode.kafka_storage_error),
    (OutOfDescriptors, ErrorCode.kafka_storage_error),
    (PermissionDenied, ErrorCode.topic_authorization_failed),
    (Unauthenticated, ErrorCode.sasl_authentication_failed),
    (PartitionReadonly, ErrorCode.policy_violation),
    (LimitReached, ErrorCode.policy_violation),
    (Fenced, ErrorCode.fenced_leader_epoch),
    (GroupNotFound, ErrorCode.group_id_not_found),
    (InvalidArgument, ErrorCode.invalid_request),
    (FailedPrecondition, ErrorCode.invalid_request),
)
"""The first entry whose class the error is an instance of wins (subclasses before bases)."""


def code_of(error: BaseException) -> tuple[ErrorCode, str]:
    """The Kafka error code for ``error`` and the message to send with it (where the response
    version carries one). An error outside the table is logged with its traceback."""
    for cls, code in CODES:
        if isinstance(error, cls):
            return code, str(error)
    if not isinstance(error, TidelogError):
        LOG.error("kafka request failed unexpectedly", exc_info=error)
    else:
        LOG.error("kafka front has no code for %s: %s", type(error).__name__, error)
    return ErrorCode.unknown_server_error, f"{type(error).__name__}: the broker failed (its log)"
