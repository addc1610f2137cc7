"""Every tidelog error mapped to a gRPC status, in one place.

Servicers wrap their work in :func:`grpc_errors`; anything tidelog raises becomes the status
below with the exception's own message (each says what to do). Anything else is a bug: it is
logged with its traceback and answered INTERNAL, and the server stays up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Final

import grpc

from tidelog.errors import (
    BrokerClosed,
    CorruptRecord,
    FailedPrecondition,
    Fenced,
    GroupNotFound,
    IncorrectOffset,
    InvalidArgument,
    LogClosed,
    LogLocked,
    MessageTooLarge,
    OffsetOutOfRange,
    PartitionNotFound,
    PermissionDenied,
    PartitionPaused,
    PartitionReadonly,
    ReadonlyEnd,
    ResourceExhausted,
    StopReached,
    StreamDeleted,
    StreamDeleting,
    StreamEmpty,
    StreamExists,
    StreamNotFound,
    TidelogError,
    ViewExists,
    ViewNotFound,
)

LOG = logging.getLogger("tidelog.api")

STATUS: Final[tuple[tuple[type[Exception], grpc.StatusCode], ...]] = (
    (StreamNotFound, grpc.StatusCode.NOT_FOUND),
    (GroupNotFound, grpc.StatusCode.NOT_FOUND),
    (ViewNotFound, grpc.StatusCode.NOT_FOUND),
    (ViewExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Fenced, grpc.StatusCode.FAILED_PRECONDITION),
    (PartitionNotFound, grpc.StatusCode.NOT_FOUND),
    (StreamDeleted, grpc.StatusCode.NOT_FOUND),
    (StreamExists, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (OffsetOutOfRange, grpc.StatusCode.INVALID_ARGUMENT),
    (MessageTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StopReached, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ReadonlyEnd, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StreamEmpty, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PartitionPaused, grpc.StatusCode.FAILED_PRECONDITION),
    (PartitionReadonly, grpc.StatusCode.FAILED_PRECONDITION),
    (IncorrectOffset, grpc.StatusCode.FAILED_PRECONDITION),
    (CorruptRecord, grpc.StatusCode.DATA_LOSS),
    (StreamDeleting, grpc.StatusCode.UNAVAILABLE),
    (BrokerClosed, grpc.StatusCode.UNAVAILABLE),
    (LogClosed, grpc.StatusCode.UNAVAILABLE),
    (LogLocked, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and detail message tidelog answers ``error`` with."""
    for kind, code in STATUS:
        if isinstance(error, kind):
            return code, str(error)
    if isinstance(error, TidelogError):
        return grpc.StatusCode.INTERNAL, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); see the server log"


@contextlib.asynccontextmanager
async def grpc_errors(context: grpc.aio.ServicerContext[object, object]) -> AsyncIterator[None]:
    """Turn errors raised inside the block into the call's status."""
    try:
        yield
    except TidelogError as error:
        code, detail = status_of(error)
        await context.abort(code, detail)
    except (ValueError, TypeError) as error:
        # Raised by our argument checks and by malformed columns in a request.
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    except grpc.aio.AbortError:
        raise
    except Exception as error:
        LOG.exception("unexpected error while serving a request")
        code, detail = status_of(error)
        await context.abort(code, detail)
