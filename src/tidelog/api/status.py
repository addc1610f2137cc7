"""Every tidelog error mapped to a gRPC status, in one place.

The guard (``guard.py``) answers whatever a servicer raises with the status of this one table,
:data:`STATUS`, and the exception's own message (each says what to do). An ``OSError`` that means a
machine resource ran out (no disk space, no file descriptors; :func:`tidelog.errors.resource_error`)
is answered RESOURCE_EXHAUSTED like :class:`~tidelog.errors.ResourceExhausted`, and logged as one
WARNING line (at most one per resource and place every :data:`RESOURCE_WARNING_INTERVAL_S`).
Anything else is a bug: it is logged with its traceback and answered INTERNAL, and the server
stays up. Every status detail is capped at :data:`DETAIL_BYTES` (gRPC sends it as metadata, and
a detail over its 8 KiB limit reaches the client as a different error altogether).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Final

import grpc

from tidelog.control import Forwarded
from tidelog.errors import (
    BrokerClosed,
    CorruptRecord,
    FailedPrecondition,
    Fenced,
    GroupNotFound,
    IncorrectOffset,
    InvalidArgument,
    LimitReached,
    LogClosed,
    LogLocked,
    MessageTooLarge,
    MetadataUnavailable,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    PartitionNotFound,
    PartitionPaused,
    PartitionReadonly,
    PermissionDenied,
    PositionJump,
    PositionTrimmed,
    ReadonlyEnd,
    ResourceExhausted,
    SiteExists,
    SiteMoving,
    SiteNotFound,
    StaleEpoch,
    StopReached,
    StreamDeleted,
    StreamDeleting,
    StreamEmpty,
    StreamExists,
    StreamNotFound,
    SubjectNotFound,
    SyncFailed,
    TidelogError,
    TooManySites,
    Unauthenticated,
    ViewExists,
    ViewNotFound,
    resource_error,
)
from tidelog.wire import FORWARDED

LOG = logging.getLogger("tidelog.api")

STATUS: Final[tuple[tuple[type[Exception], grpc.StatusCode], ...]] = (
    (StreamNotFound, grpc.StatusCode.NOT_FOUND),
    (SubjectNotFound, grpc.StatusCode.NOT_FOUND),
    (GroupNotFound, grpc.StatusCode.NOT_FOUND),
    (ViewNotFound, grpc.StatusCode.NOT_FOUND),
    (ViewExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Fenced, grpc.StatusCode.FAILED_PRECONDITION),
    (PositionTrimmed, grpc.StatusCode.FAILED_PRECONDITION),
    (PositionJump, grpc.StatusCode.OUT_OF_RANGE),  # the sender answers with a snapshot sync
    (PartitionNotFound, grpc.StatusCode.NOT_FOUND),
    (StreamDeleted, grpc.StatusCode.NOT_FOUND),
    (StreamExists, grpc.StatusCode.ALREADY_EXISTS),
    (SiteExists, grpc.StatusCode.ALREADY_EXISTS),
    (SiteNotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (OffsetOutOfRange, grpc.StatusCode.INVALID_ARGUMENT),
    (MessageTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LimitReached, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StopReached, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ReadonlyEnd, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StreamEmpty, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PartitionPaused, grpc.StatusCode.FAILED_PRECONDITION),
    (PartitionReadonly, grpc.StatusCode.FAILED_PRECONDITION),
    (IncorrectOffset, grpc.StatusCode.FAILED_PRECONDITION),
    (CorruptRecord, grpc.StatusCode.DATA_LOSS),
    (StreamDeleting, grpc.StatusCode.UNAVAILABLE),
    (BrokerClosed, grpc.StatusCode.UNAVAILABLE),
    (NotLeader, grpc.StatusCode.FAILED_PRECONDITION),  # Liftbridge clients refresh metadata
    (NotEnoughReplicas, grpc.StatusCode.UNAVAILABLE),  # retryable, once the ISR recovers
    (SiteMoving, grpc.StatusCode.UNAVAILABLE),  # retryable, once a broker runs the site
    (StaleEpoch, grpc.StatusCode.FAILED_PRECONDITION),  # a follower refreshes its metadata
    (MetadataUnavailable, grpc.StatusCode.UNAVAILABLE),
    (LogClosed, grpc.StatusCode.UNAVAILABLE),
    (LogLocked, grpc.StatusCode.UNAVAILABLE),
    (SyncFailed, grpc.StatusCode.RESOURCE_EXHAUSTED),  # written, not yet durable: says so
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManySites, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
)


DETAIL_BYTES: Final = 1024
"""Longest status detail sent (UTF-8 bytes); longer ones are cut, saying how long they were."""

RESOURCE_WARNING_INTERVAL_S: Final = 10.0


def cap_detail(detail: str, limit: int = DETAIL_BYTES) -> str:
    """``detail`` cut to at most ``limit`` UTF-8 bytes (plus a short note of its full size)."""
    raw = detail.encode(errors="replace")
    if len(raw) <= limit:
        return detail
    return raw[:limit].decode(errors="ignore") + f"…({len(raw)} bytes)"


class Throttle:
    """Allows one event per key every ``interval_s`` seconds and counts the ones it holds back.

    For log lines a client can cause at any rate: ``allow(key)`` is None when the line should be
    suppressed, else the number suppressed since the last allowed one. Thread-safe."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._suppressed.pop(key, 0)


_RESOURCE_WARNINGS = Throttle(RESOURCE_WARNING_INTERVAL_S)


def as_tidelog_error(error: BaseException) -> BaseException:
    """``error``, or the :class:`ResourceExhausted` it stands for when it is an ``OSError`` that
    means a resource ran out."""
    if isinstance(error, OSError):
        # No file name: the write was to a file whose name the error lost (a replaced JSON file,
        # a socket); descriptors run out for the whole process.
        where = error.filename or (
            "this process" if error.errno in (errno.EMFILE, errno.ENFILE) else "the data directory"
        )
        return resource_error(error, where) or error
    return error


def handed_over(context: grpc.aio.ServicerContext[object, object]) -> bool:
    """Whether another broker of the cluster handed this call over (``FORWARDED``): the
    receiver does the work itself and never hands it on."""
    return any(key == FORWARDED for key, _ in context.invocation_metadata() or ())


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and detail message tidelog answers ``error`` with."""
    error = as_tidelog_error(error)
    if isinstance(error, Forwarded):
        return error.code, cap_detail(str(error))
    for kind, code in STATUS:
        if isinstance(error, kind):
            return code, cap_detail(str(error))
    if isinstance(error, TidelogError):
        return grpc.StatusCode.INTERNAL, cap_detail(str(error))
    if isinstance(error, ValueError | TypeError):
        # Raised by our argument checks and by malformed columns in a request.
        return grpc.StatusCode.INVALID_ARGUMENT, cap_detail(str(error))
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); see the server log"


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` refuses the request (a tidelog error, a bad argument, a resource that ran
    out) rather than being a bug."""
    return isinstance(as_tidelog_error(error), TidelogError | ValueError | TypeError)


def log_failure(error: BaseException) -> None:
    """Log what the server log should say about ``error`` before it is answered: nothing for a
    refused request, one rate-limited WARNING line for a resource that ran out, the traceback for
    a bug."""
    mapped = as_tidelog_error(error)
    if isinstance(mapped, ResourceExhausted):
        suppressed = _RESOURCE_WARNINGS.allow((mapped.resource, mapped.path))
        if suppressed is not None:
            more = f" ({suppressed} more since the last warning)" if suppressed else ""
            LOG.warning("request refused: %s%s", mapped, more)
    elif not isinstance(mapped, TidelogError | ValueError | TypeError):
        LOG.error("unexpected error while serving a request", exc_info=error)
