"""Every failure tidelog reports, one exception type each.

All layers raise these types; ``tidelog.api.status`` (a later layer) maps them to gRPC status
codes in one place. Each message says what happened and what the caller can do about it.
"""

from __future__ import annotations

import errno
from typing import Final

ECHO_CHARS: Final = 200
"""Longest client input (a name, an id) an error message repeats in full."""


def echo(value: str | bytes, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message; past ``limit`` characters, its start and its size.

    A client's input is echoed so people can see what was refused, but a 10 KB stream name must
    not make a 10 KB message (gRPC refuses a status detail over its 8 KiB metadata limit)."""
    if len(value) <= limit:
        return repr(value)
    size = len(value) if isinstance(value, bytes) else len(value.encode(errors="replace"))
    return f"{value[:limit]!r}…({size} bytes)"


class TidelogError(Exception):
    """Base class of every error tidelog raises on purpose."""


class TidelogWarning(UserWarning):
    """Warnings tidelog emits (swapped bounds, data skipped during recovery, ...)."""


class LogError(TidelogError):
    """A commit-log failure."""


class MessageTooLarge(LogError):
    """A message exceeds the log's ``max_message_bytes``; nothing of its batch was written."""

    def __init__(self, size: int, limit: int, index: int = 0) -> None:
        self.size = size
        self.limit = limit
        self.index = index
        super().__init__(
            f"message {index} of the batch is {size} bytes (key + value + headers), over the log's "
            f"limit of {limit} bytes; nothing in the batch was written. Split the payload or raise "
            f"max_message_bytes."
        )


class CorruptRecord(LogError):
    """Stored bytes fail their CRC-32C or framing check; the damaged bytes are never returned."""

    def __init__(self, segment: str, position: int, detail: str) -> None:
        self.segment = segment
        self.position = position
        self.detail = detail
        super().__init__(f"corrupt record in {segment} at byte {position}: {detail}")


class OffsetOutOfRange(LogError):
    """An offset argument that can never be valid (negative, or below an explicit bound)."""


class LogClosed(LogError):
    """The log was closed (or deleted) while the call was in progress or before it started."""


class LogLocked(LogError):
    """Another process (or another open log object) holds the log directory."""


class BrokerError(TidelogError):
    """A broker-level failure (streams, partitions, subscriptions, cursors)."""


class InvalidArgument(BrokerError):
    """A request that can never succeed as given (bad name, negative offset, stop before start)."""


class StreamNotFound(BrokerError):
    """No stream of that name exists."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        super().__init__(f"no such stream: {echo(stream)}; create it first or check the name")


class SubjectNotFound(BrokerError):
    """No stream listens on that subject (``PublishToSubject``): nothing was stored."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(
            f"no stream listens on subject {echo(subject)}: nothing was stored; create a stream "
            f"with that subject (partition n > 0 listens on '<subject>.<n>') or check the name"
        )


class SiteNotFound(BrokerError):
    """No remote site of that id is declared (multi-site replication)."""

    def __init__(self, site_id: str) -> None:
        self.site_id = site_id
        super().__init__(
            f"unknown site {echo(site_id)}: declare it with `tidelog site add ID HOST:PORT` "
            f"or check the id"
        )


class SiteExists(BrokerError):
    """A remote site of that id is declared already."""

    def __init__(self, site_id: str) -> None:
        self.site_id = site_id
        super().__init__(f"site {echo(site_id)} is declared already; remove it first")


class SiteMoving(BrokerError):
    """A cluster's site is between brokers: no broker runs it now (its delta queue's leader is
    being elected, or is opening the site). Retryable."""

    def __init__(self, site_id: str) -> None:
        self.site_id = site_id
        super().__init__(
            f"site {echo(site_id)} is moving to another broker of the cluster (its delta "
            f"queue's leader is being elected or is opening it): try again shortly"
        )


class PositionTrimmed(BrokerError):
    """A remote site's next entries may have been removed by the delta queue's retention: deltas
    cannot go on from its position, only a snapshot sync (multi-site replication)."""

    def __init__(self, site_id: str, after: int, held_from: int) -> None:
        self.site_id = site_id
        self.after = after
        self.held_from = held_from
        super().__init__(
            f"site {echo(site_id)}: retention trimmed the delta queue past position {after} "
            f"(it holds the site's entries from position {held_from}): the site needs a "
            f"snapshot sync"
        )


class PositionJump(BrokerError):
    """A source's delta batch reaches further past what this sink applied from it than the sink
    can account for (``sites_position_window_records``): nothing of it is applied. A real sender
    steps below the bound (``sites/sender_deltas.py``); one that did not (its setting larger
    than this sink's) answers with a snapshot sync; a forged batch (a
    position far ahead, which would make the sink drop every real entry below it) goes no
    further (multi-site replication)."""

    def __init__(self, source: str, position: int, applied: int, window: int) -> None:
        self.source = source
        self.position = position
        super().__init__(
            f"a delta batch from site {echo(source)} reaches position {position}, more than "
            f"{window} positions past what this sink applied from it ({applied}): refused, "
            f"nothing applied (keep sites_position_window_records the same on every site; "
            f'docs/security.md, "Sites trust sites")'
        )


class TooManySites(BrokerError):
    """AddSite past the cap on declared remote sites (``sites_max_declared``)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        super().__init__(
            f"{cap} remote sites are declared, the cap (the server setting "
            f"sites_max_declared): remove one, or raise the setting"
        )


class PartitionNotFound(BrokerError):
    """The stream exists but has no partition of that number."""

    def __init__(self, stream: str, partition: int, count: int) -> None:
        self.stream = stream
        self.partition = partition
        super().__init__(
            f"no such partition: stream {echo(stream)} has partitions 0..{count - 1}, "
            f"not {partition}"
        )


class StreamExists(BrokerError):
    """A stream of that name already exists."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        super().__init__(f"stream already exists: {echo(stream)}")


class PartitionPaused(BrokerError):
    """The partition is paused; publishing or subscribing with ``resume`` wakes it."""

    def __init__(self, stream: str, partition: int) -> None:
        super().__init__(
            f"partition {partition} of stream {echo(stream)} is paused; publish to it or "
            f"subscribe with resume=true to resume it"
        )


class PartitionReadonly(BrokerError):
    """The partition is read-only; publishing is refused."""

    def __init__(self, stream: str, partition: int) -> None:
        super().__init__(
            f"readonly partition: {partition} of stream {echo(stream)} accepts no publishes; "
            f"clear the flag with SetStreamReadonly(readonly=false)"
        )


class IncorrectOffset(BrokerError):
    """Optimistic concurrency: the message would not get the offset the publisher expected."""

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"incorrect expected offset: the publish expected offset {expected} but the next "
            f"offset is {actual}; re-read the partition and retry"
        )


class StreamDeleted(BrokerError):
    """The stream was deleted while a subscription or publish was using it."""


class StreamDeleting(BrokerError):
    """A stream of that name is being deleted; creating it again succeeds once that is done."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        super().__init__(
            f"stream {echo(stream)} is being deleted; create it again in a moment (the delete "
            f"finishes within milliseconds)"
        )


class StopReached(BrokerError):
    """A subscription delivered its stop bound (Liftbridge ends the call with this)."""


class ReadonlyEnd(BrokerError):
    """A subscription reached the end of a read-only partition."""


class StreamEmpty(BrokerError):
    """A subscription asked to stop at the latest offset of a partition that holds nothing."""


class FailedPrecondition(BrokerError):
    """The request does not fit the current state (a consumer group's members or epoch)."""


class GroupNotFound(BrokerError):
    """No consumer group of that id exists."""


class GroupStateUnreadable(BrokerError):
    """The saved consumer groups (``groups.json``) cannot be read at start. The broker refuses
    to start rather than drop every group; the message names the file and what is wrong."""


class Fenced(BrokerError):
    """A group subscriber was replaced by one with a newer epoch."""


class NotLeader(BrokerError):
    """A request that only a partition's leader serves reached another broker of a cluster.

    The text is Liftbridge's, which its clients look for before refreshing their metadata; tidelog
    itself never reads it: ``leader_id`` and ``leader_epoch`` say who leads as this broker knows
    it (empty and -1: nobody now), and the guard sends them as the status's trailing metadata."""

    def __init__(
        self,
        stream: str,
        partition: int,
        leader: str = "",
        *,
        leader_id: str = "",
        leader_epoch: int = -1,
    ) -> None:
        where = f" (the leader is {leader})" if leader else " (no leader now; retry shortly)"
        what = stream if partition < 0 else f"{stream}/{partition}"
        super().__init__(f"Server not partition leader for {what}{where}")
        self.stream = stream
        self.partition = partition
        self.leader = leader
        """The leader's address (``HOST:PORT``), empty when unknown."""
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch


class StaleEpoch(BrokerError):
    """A follower's fetch named a leader epoch that is not the leader's current one: the
    follower refreshes its metadata."""

    def __init__(self, asked: int, current: int) -> None:
        super().__init__(f"leader epoch {asked} is not the current one ({current}): refresh")
        self.asked = asked
        self.current = current


class MetadataUnavailable(BrokerError):
    """The cluster's metadata store (etcd) cannot be reached or answered with an error."""


class NotEnoughReplicas(BrokerError):
    """A publish with ack policy ALL was appended by the leader but not acknowledged: the
    partition's in-sync replicas stayed below ``minIsr`` (or did not copy it) for the ack
    timeout. Retryable: publish again (with a producer id, a retry is never a duplicate)."""


class BrokerClosed(BrokerError):
    """The broker is shutting down."""


class ViewNotFound(BrokerError):
    """The stream has no materialised view of that name."""

    def __init__(self, stream: str, view: str) -> None:
        self.stream = stream
        self.view = view
        super().__init__(
            f"no such view: stream {echo(stream)} has no view {echo(view)}; declare it first "
            f"(tidelog view declare) or list the stream's views"
        )


class ViewExists(BrokerError):
    """A view of that name already exists on the stream with a different definition."""

    def __init__(self, stream: str, view: str) -> None:
        self.stream = stream
        self.view = view
        super().__init__(
            f"view already exists: stream {echo(stream)} has a view {echo(view)} with another "
            f"definition; drop it first or choose another name"
        )


class ResourceExhausted(TidelogError):
    """A machine resource ran out (disk space, file descriptors). Which subclass says what
    became of the write: :class:`DiskFull` from the log layer undid it, :class:`SyncFailed`
    kept it (written, not yet durable).

    ``resource`` names what ran out (``"disk space"``, ``"file descriptors"``), ``path`` where,
    and ``reason`` how (the system's words, e.g. "No space left on device").
    """

    def __init__(self, resource: str, path: str, detail: str, *, reason: str = "") -> None:
        self.resource = resource
        self.path = path
        self.reason = reason or detail
        super().__init__(f"out of {resource} at {path}: {detail}")


class DiskFull(ResourceExhausted, LogError):
    """A write found no space (ENOSPC, EDQUOT, or a short write). From the log layer the write
    was undone: the log is as it was before (the message says so only then)."""

    def __init__(self, path: str, detail: str = "", *, reason: str = "") -> None:
        super().__init__(
            "disk space",
            path,
            detail
            or "the write was refused and nothing of it was kept; free space or add disk, reads "
            "still work",
            reason=reason,
        )


class SyncFailed(ResourceExhausted, LogError):
    """Records were written but could not be synced to stable storage (no space for the sync or
    the recovery point, no descriptor to reopen a segment). Unlike :class:`DiskFull` nothing was
    undone: the records stay in the log, the next sync retries them (and commits them under
    ``FlushPolicy.ALWAYS``), and after a crash recovery checks them."""

    def __init__(self, resource: str, path: str, reason: str) -> None:
        super().__init__(
            resource,
            path,
            f"{reason}; the records were written but not confirmed durable: the data will be "
            "synced again or checked by recovery (a retried publish may store them twice)",
            reason=reason,
        )


class OutOfDescriptors(ResourceExhausted):
    """The process reached its open-file limit (EMFILE, ENFILE)."""

    def __init__(self, path: str, detail: str = "", *, reason: str = "") -> None:
        super().__init__(
            "file descriptors",
            path,
            detail
            or "the process is at its open-file limit; raise `ulimit -n` or lower "
            "TIDELOG_OPEN_FILES_MAX (see docs/operations.md)",
            reason=reason,
        )


class LimitReached(BrokerError):
    """A request would go past a limit the operator configured (streams, partitions, groups,
    views, cursors, bytes in flight, the descriptors views may hold). ``setting`` names the
    setting to raise; nothing of the request was done. Answered RESOURCE_EXHAUSTED."""

    def __init__(self, setting: str, detail: str) -> None:
        self.setting = setting
        super().__init__(f'{detail} (limit: {setting}; docs/operations.md, "Limits")')


class PermissionDenied(BrokerError):
    """The caller may not do this (e.g. write to or pause a stream the broker owns, or an
    operation the access policy does not grant it). The message names the operation and the
    resource, never the policy."""


class Unauthenticated(TidelogError):
    """The caller presented no credentials where they are required, or credentials the server
    does not accept (an unknown token, a token on a plaintext connection)."""


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def resource_error(
    error: OSError, path: object = None, *, undone: bool = False
) -> ResourceExhausted | None:
    """The :class:`ResourceExhausted` an ``OSError`` stands for, or None when it is another
    failure. ``path`` defaults to the error's own file name. ``undone``: the caller guarantees
    that nothing of the failed write stays (the log layer's writes); only then does the message
    say so."""
    where = str(path if path is not None else (error.filename or "?"))
    reason = str(error.strerror or error)
    if error.errno in _DISK_FULL_ERRNOS:
        kept = "nothing of the write was kept; " if undone else ""
        return DiskFull(where, f"{reason}; {kept}free space or add disk", reason=reason)
    if error.errno in _DESCRIPTOR_ERRNOS:
        return OutOfDescriptors(where, reason=reason)
    return None


# -- the state stores (tidelog.store) -------------------------------------------------------------


class StoreError(TidelogError):
    """A state-store failure."""


class StoreClosed(StoreError):
    """The store was closed: no read, write or iterator step is possible on it any more."""

    def __init__(self, store: str) -> None:
        self.store = store
        super().__init__(
            f"{store} is closed; open a new store object (a RocksDB store keeps its data on disk)"
        )


class StoreLayoutMismatch(StoreError):
    """A RocksDB store directory was written with settings that change its on-disk layout.

    A window store's ``retain_duplicates`` decides whether its keys carry an insertion sequence,
    so a directory written with one setting cannot be read with the other.
    """

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"store at {path}: {detail}")


class ValuesOmitted(TidelogError, ValueError):
    """A batch read without its values (``SubscribeBatchesRequest.without_values``) was asked for
    them: its ``values``, its messages or an Arrow ``value`` column."""


class MissingExtra(TidelogError, ImportError):
    """A feature needs a package of an optional extra that is not installed (Arrow batches need
    pyarrow, the ``spark`` extra); the message names the extra to install."""


# -- the Spark data source (tidelog.spark) --------------------------------------------------------
# Spark wraps whatever a data source raises (``PythonException`` / ``AnalysisException``), so the
# type is for tests and Python callers; the message is what a Spark user sees, and it names the
# option to change.


class SparkSourceError(TidelogError):
    """Base class of the data source's own errors."""


class InvalidOption(SparkSourceError, ValueError):
    """An option is missing, malformed, or contradicts another (ending before starting)."""


class UnknownStream(SparkSourceError):
    """The ``stream`` option names no stream on the broker."""


class UnknownPartition(SparkSourceError):
    """An option names a partition the stream does not have."""


class OffsetsLost(SparkSourceError):
    """Retention removed offsets the query still needed, and ``failOnDataLoss`` is true."""


class UnknownColumn(SparkSourceError, ValueError):
    """A user-specified schema or the ``columns`` option names a column the source does not
    have, or gives one of its columns another type."""
