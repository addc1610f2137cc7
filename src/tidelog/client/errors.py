"""Client-side errors: one type per kind of failure the server reports.

The server answers every failure with a gRPC status whose message says what to do; the client
raises the matching type below with that message. ``code`` keeps the raw status code.

One hierarchy: where the server's failure is a concept of ``tidelog.errors`` (an invalid argument,
an empty stream, a failed precondition, a paused or read-only partition, an incorrect expected
offset), the client's type is a subclass of that class too, so ``except
tidelog.errors.InvalidArgument`` catches it in-process and over the wire alike. A client error
carries the server's message only, not the broker's fields (``stream``, ``partition``...).
``MessageTooLarge`` stands for every RESOURCE_EXHAUSTED answer (a full disk too) but a limit the
operator configured (``LimitReached``, bytes of publishes in flight among them) and an empty
stream (``StreamEmpty``), so it is not the log's ``MessageTooLarge``.
"""

from __future__ import annotations

import grpc

from tidelog import errors
from tidelog.errors import TidelogError


class ClientError(TidelogError):
    """A call failed; ``code`` is the gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        # Not super(): the core classes a client type also derives from take the broker's fields.
        Exception.__init__(self, message)
        if code is not None:
            self.code = code


class NotFound(ClientError):
    """Unknown stream or partition (or the stream was deleted meanwhile)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ClientError):
    code = grpc.StatusCode.ALREADY_EXISTS


class InvalidArgument(ClientError, errors.InvalidArgument):
    code = grpc.StatusCode.INVALID_ARGUMENT


class MessageTooLarge(ClientError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class LimitReached(ClientError, errors.LimitReached):
    """The request would go past a limit the operator configured, named in ``setting`` (streams,
    views, cursors, bytes of publishes in flight...): nothing of it was done. A publish refused
    for bytes in flight (``max_inflight_bytes_per_connection``/``_per_principal``) may be sent
    again once earlier publishes are answered; it is not a message too large."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    setting = ""


class StreamEmpty(ClientError, errors.StreamEmpty):
    """A subscription asked to stop at the latest offset of a partition that holds nothing."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(ClientError, errors.FailedPrecondition):
    """The partition is paused or read-only, or an expected offset did not match."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class PartitionReadonly(FailedPrecondition, errors.PartitionReadonly):
    pass


class PartitionPaused(FailedPrecondition, errors.PartitionPaused):
    pass


class IncorrectOffset(FailedPrecondition, errors.IncorrectOffset):
    pass


class Unavailable(ClientError):
    """The server is unreachable or shutting down; retrying later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(ClientError):
    """The server found stored data damaged (a CRC mismatch) and refused to return it."""

    code = grpc.StatusCode.DATA_LOSS


class Unimplemented(ClientError):
    code = grpc.StatusCode.UNIMPLEMENTED


_BY_CODE: dict[grpc.StatusCode, type[ClientError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: MessageTooLarge,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    # Received (not raised by this client's own cancel, which asyncio reports as
    # CancelledError): a server that shuts down cancels the calls it had accepted but not yet
    # started (gRPC core does, grpc/grpc#41785), and those still running after its grace time.
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}

_PRECONDITIONS: tuple[tuple[str, type[FailedPrecondition]], ...] = (
    ("readonly partition", PartitionReadonly),
    ("incorrect expected offset", IncorrectOffset),
    ("is paused", PartitionPaused),
)


def from_rpc_error(error: grpc.RpcError) -> ClientError:
    """The typed error for a failed call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(code)
    return error_for(code, details)


def error_for_number(number: int, details: str) -> ClientError:
    """The typed error for a status code given as its number (as in ``PublishBatchResponse``)."""
    code = next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)
    return error_for(code, details)


def error_for(code: grpc.StatusCode, details: str) -> ClientError:
    kind = _BY_CODE.get(code, ClientError)
    if kind is MessageTooLarge and "stream is empty" in details:
        kind = StreamEmpty
    setting = _limit_setting(details) if kind is MessageTooLarge else None
    if setting is not None:  # a LimitReached of the server (``tidelog.errors``) names its setting
        limit = LimitReached(details, code)
        limit.setting = setting
        return limit
    if kind is FailedPrecondition:
        for marker, sub in _PRECONDITIONS:
            if marker in details:
                kind = sub
                break
    if code == grpc.StatusCode.CANCELLED:
        details = f"the server cancelled the call, as a server shutting down does: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        details = f"cannot reach the tidelog server: {details}"
    return kind(details, code)


_LIMIT = "(limit: "


def _limit_setting(details: str) -> str | None:
    """The setting a server's ``LimitReached`` message names, or None when it is none."""
    start = details.find(_LIMIT)
    if start < 0:
        return None
    name = details[start + len(_LIMIT) :].split(";", 1)[0].split(")", 1)[0].strip()
    return name if name.isidentifier() else None
