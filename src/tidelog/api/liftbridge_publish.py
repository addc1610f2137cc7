"""Liftbridge's publishing calls (``Publish``, ``PublishAsync``, ``PublishToSubject``), mixed into
:class:`tidelog.api.liftbridge.LiftbridgeService`.

A publish is appended by this broker when it leads the partition; otherwise (a broker of a
cluster) it is handed once to the leader through the control, as Liftbridge clients publish on
any broker. ``PublishAsync`` coalesces the requests queued when it gets to them into one append
per partition, and answers every failed request whatever its ack policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.api.draining import DRAINED
from tidelog.api.inflight import InFlight
from tidelog.api.status import as_tidelog_error, handed_over, is_refusal, log_failure, status_of
from tidelog.broker import NewRecord, Partition, Published
from tidelog.control import Control, Forwarded
from tidelog.errors import (
    FailedPrecondition,
    IncorrectOffset,
    InvalidArgument,
    MessageTooLarge,
    NotLeader,
    PartitionNotFound,
    PartitionReadonly,
    PermissionDenied,
    StreamNotFound,
    SubjectNotFound,
    TidelogError,
)
from tidelog.wire import FORWARDED

Context = grpc.aio.ServicerContext[object, object]

_log = logging.getLogger("tidelog.api.liftbridge")

# Coalesce at most this many queued PublishAsync requests into one append.
_ASYNC_BATCH = 1000


def _check_ack_policy(policy: int) -> None:
    if policy not in (pb.LEADER, pb.ALL, pb.NONE):
        raise InvalidArgument(f"unknown ackPolicy {policy}: use LEADER (0), ALL (1) or NONE (2)")


# Liftbridge's exact texts: Go clients have no sentinel errors for these and compare the text.
INCORRECT_OFFSET_TEXT = "incorrect expected offset"
OCC_NEEDS_ACK_TEXT = "stream with concurrency control must have AckPolicy set"


def _liftbridge_text(error: IncorrectOffset) -> str:
    """The conflict as Liftbridge words it; tidelog's explanation (which offset the partition
    is at) goes to the server's debug log."""
    _log.debug("publish refused: %s", error)
    return INCORRECT_OFFSET_TEXT


FORWARD_TIMEOUT_S = 30.0
"""How long a publish handed to the partition's leader may take when the caller set no deadline."""


def _message(request: pb.PublishRequest | pb.PublishToSubjectRequest) -> bytes | NewRecord:
    if not request.key and not request.headers:
        return request.value
    return NewRecord(request.value, key=request.key or None, headers=dict(request.headers))


def _async_error(error: BaseException) -> pb.PublishAsyncError:
    codes = pb.PublishAsyncError
    error = as_tidelog_error(error)  # a raw OSError for a full disk: as DiskFull
    if isinstance(error, StreamNotFound | PartitionNotFound):
        code = codes.NOT_FOUND
    elif isinstance(error, PartitionReadonly):
        code = codes.READONLY
    elif isinstance(error, IncorrectOffset):
        return pb.PublishAsyncError(code=codes.INCORRECT_OFFSET, message=_liftbridge_text(error))
    elif isinstance(error, PermissionDenied):
        code = codes.PERMISSION_DENIED
    elif isinstance(error, InvalidArgument | MessageTooLarge):
        code = codes.BAD_REQUEST
    elif isinstance(error, TidelogError):
        code = codes.INTERNAL
    else:
        code = codes.UNKNOWN
    return pb.PublishAsyncError(code=code, message=status_of(error)[1])


def _failure_response(
    request: pb.PublishRequest, failure: pb.PublishAsyncError
) -> pb.PublishResponse:
    """A failed request's answer, shaped as Liftbridge's: the error, the request's correlation
    id, and an ack with an empty correlation id (older clients look for an ack in every
    response)."""
    return pb.PublishResponse(
        asyncError=failure, correlationId=request.correlationId, ack=pb.Ack(correlationId="")
    )


class PublishService(pb_grpc.APIServicer):
    """The publishing half of the Liftbridge service (module docstring)."""

    control: Control
    _latency: Any
    _inflight: InFlight

    def _observe(self, started: float) -> None:
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - started)

    # -- publishing ------------------------------------------------------------------------------

    def _check_publish(self, request: pb.PublishRequest) -> None:
        """Liftbridge's checks before a publish, answered whatever the ack policy: a stream
        name, a known ack policy, and an ack policy on streams with optimistic concurrency
        (checked after the partition exists and is writable, as Liftbridge orders them)."""
        if not request.stream:
            raise InvalidArgument("publish needs a stream name")
        _check_ack_policy(request.ackPolicy)
        if request.ackPolicy != pb.NONE:
            return
        stream = self.control.find_stream(request.stream)
        if stream is not None and stream.config.optimistic_concurrency:
            partition = stream.partition(request.partition)
            if partition.readonly:
                raise PartitionReadonly(request.stream, request.partition)
            raise InvalidArgument(OCC_NEEDS_ACK_TEXT)

    def _ack(
        self, request: pb.PublishRequest, offset: int, received: int, committed: int
    ) -> pb.Ack:
        subject = self.control.stream(request.stream).subject
        return pb.Ack(
            stream=request.stream,
            partitionSubject=subject
            if request.partition == 0
            else f"{subject}.{request.partition}",
            msgSubject=subject,
            offset=offset,
            ackInbox=request.ackInbox,
            correlationId=request.correlationId,
            ackPolicy=request.ackPolicy,
            receptionTimestamp=received,
            commitTimestamp=committed,
        )

    async def Publish(self, request: pb.PublishRequest, context: Context) -> pb.PublishResponse:
        async with self._inflight.admit(context, request):  # bytes in flight (inflight.py)
            return await self._publish_one(request, context)

    async def _publish_one(
        self, request: pb.PublishRequest, context: Context
    ) -> pb.PublishResponse:
        started = time.perf_counter()
        self._check_publish(request)
        try:
            published = await self.control.publish(
                request.stream,
                request.partition,
                [_message(request)],
                expected_offset=request.expectedOffset if request.expectedOffset >= 0 else None,
                durable=request.ackPolicy == pb.ALL,
            )
        except IncorrectOffset as error:
            raise FailedPrecondition(_liftbridge_text(error)) from None
        except NotLeader as error:
            # Liftbridge takes a publish on any broker: hand it to the leader, once (a publish
            # handed here is refused, so two brokers with stale views never pass it around).
            if handed_over(context):
                raise
            return await self._forward(request, error, context.time_remaining())
        self._observe(started)
        if request.ackPolicy == pb.NONE:
            return pb.PublishResponse()
        stored = published.timestamp
        ack = self._ack(request, published.offsets[0], stored, max(stored, time.time_ns()))
        return pb.PublishResponse(ack=ack, correlationId=request.correlationId)

    async def _forward(
        self, request: pb.PublishRequest, refusal: NotLeader, timeout: float | None
    ) -> pb.PublishResponse:
        """A publish sent to a broker of a cluster that does not lead its partition, published
        on the leader (Liftbridge clients publish on any broker); the refusal if none leads."""

        async def publish(channel: grpc.aio.Channel) -> pb.PublishResponse:
            response: pb.PublishResponse = await pb_grpc.APIStub(channel).Publish(
                request,
                timeout=FORWARD_TIMEOUT_S if timeout is None else timeout,
                metadata=((FORWARDED, "1"),),
            )
            return response

        return await self.control.on_leader(request.stream, request.partition, refusal, publish)

    async def _publish_run(self, run: Sequence[pb.PublishRequest]) -> list[pb.PublishResponse]:
        """Append consecutive requests for one partition as one batch; one response each."""
        first = run[0]
        started = time.perf_counter()
        try:
            self._check_publish(first)
            published = await self.control.publish(
                first.stream,
                first.partition,
                [_message(r) for r in run],
                expected_offset=first.expectedOffset if first.expectedOffset >= 0 else None,
                durable=any(r.ackPolicy == pb.ALL for r in run),
            )
        except Exception as error:
            if isinstance(error, NotLeader):
                return [await self._forward_async(r, error) for r in run]
            if not is_refusal(error):
                raise
            if len(run) > 1:
                # Nothing of the run was written (appends are all or nothing): publish each
                # request alone, so only the bad one fails.
                responses: list[pb.PublishResponse] = []
                for request in run:
                    responses += await self._publish_run([request])
                return responses
            log_failure(error)
            # Answered whatever the ack policy (as Liftbridge answers request errors): a
            # publisher that asked for no ack still learns that nothing was written.
            return [_failure_response(first, _async_error(error))]
        received = published.timestamp
        committed = max(received, time.time_ns())
        self._observe(started)
        return [
            pb.PublishResponse(
                ack=self._ack(r, offset, received, committed), correlationId=r.correlationId
            )
            for r, offset in zip(run, published.offsets, strict=True)
            if r.ackPolicy != pb.NONE
        ]

    async def _forward_async(
        self, request: pb.PublishRequest, refusal: NotLeader
    ) -> pb.PublishResponse:
        """One PublishAsync request published on the leader, answered as PublishAsync does."""
        try:
            forwarded = await self._forward(request, refusal, None)
        except (NotLeader, Forwarded) as error:
            log_failure(error)
            return _failure_response(request, _async_error(error))
        if request.ackPolicy == pb.NONE:
            return pb.PublishResponse(correlationId=request.correlationId)
        return forwarded

    def _checks_offsets(self, stream: str) -> bool:
        found = self.control.find_stream(stream)
        return found is not None and found.config.optimistic_concurrency

    async def _publish_group(self, requests: list[pb.PublishRequest]) -> list[pb.PublishResponse]:
        """Append runs of consecutive requests for one partition together. On streams with
        optimistic concurrency each request is its own run: each carries its own expectation."""
        responses: list[pb.PublishResponse] = []
        run: list[pb.PublishRequest] = []
        for request in requests:
            same = (
                run
                and request.stream == run[0].stream
                and request.partition == run[0].partition
                and request.ackPolicy in (pb.LEADER, pb.ALL, pb.NONE)
                and not self._checks_offsets(request.stream)
            )
            if run and not same:
                responses += await self._publish_run(run)
                run = []
            run.append(request)
        if run:
            responses += await self._publish_run(run)
        return responses

    async def PublishAsync(
        self, request_iterator: AsyncIterator[pb.PublishRequest], context: Context
    ) -> AsyncIterator[pb.PublishResponse]:
        """One response per request with an ack policy other than NONE. Requests that arrive
        together are appended together (one write per partition), in order."""
        queue: asyncio.Queue[pb.PublishRequest | None] = asyncio.Queue(maxsize=4 * _ASYNC_BATCH)
        broken: list[BaseException] = []
        pacer = self._inflight.pacer(context)  # bytes in flight: read on once they fit

        async def pump() -> None:
            try:
                async for request in request_iterator:
                    await pacer.take(request)
                    await queue.put(request)
            except Exception as error:  # an unparsable frame ends the call
                broken.append(error)
            # Not in a ``finally``: once the call is gone (cancelled, or closed at a ``yield``
            # whose client vanished) nobody empties a full queue, and this put would wait forever,
            # keeping the task, its queue and the call alive.
            await queue.put(None)

        def stop_reading() -> None:
            # Shutdown: stop at the next request. Requests still queued were not appended and
            # get no ack, so the client knows to publish them again. A full queue is drained by
            # the loop below, which checks ``broker.draining`` before each group.
            reader.cancel()
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

        reader = asyncio.create_task(pump())
        withdraw = self.control.when_draining(stop_reading)
        try:
            ended = False
            while not ended and not self.control.draining:
                head = await queue.get()
                if head is None:
                    break
                group = [head]
                while len(group) < _ASYNC_BATCH and not queue.empty():
                    item = queue.get_nowait()
                    if item is None:
                        ended = True
                        break
                    group.append(item)
                responses = await self._publish_group(group)
                pacer.done(len(group))
                for response in responses:
                    yield response
            if self.control.draining:
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINED)
            if broken:
                error = broken[0]
                if isinstance(error, PermissionDenied):  # the guard refused a frame
                    raise error
                detail = str(error) if isinstance(error, TidelogError) else repr(error)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed PublishAsync request; the requests before it were published: "
                    f"{detail}",
                )
        finally:
            withdraw()
            reader.cancel()
            pacer.close()

    async def PublishToSubject(
        self, request: pb.PublishToSubjectRequest, context: Context
    ) -> pb.PublishToSubjectResponse:
        """Append to every stream partition listening on the subject (one stream of each
        load-balance group); the ack is the first one's, in stream-name order."""
        async with self._inflight.admit(context, request):  # bytes in flight (inflight.py)
            return await self._publish_to_subject(request)

    async def _publish_to_subject(
        self, request: pb.PublishToSubjectRequest
    ) -> pb.PublishToSubjectResponse:
        if not request.subject:
            raise InvalidArgument("publish to a subject needs a subject")
        _check_ack_policy(request.ackPolicy)
        targets = self.control.subject_targets(request.subject)
        if not targets:
            raise SubjectNotFound(request.subject)
        message = _message(request)
        first: tuple[Partition, Published] | None = None
        failures: list[Exception] = []
        for target in targets:
            try:
                published = await self.control.publish(
                    target.stream,
                    target.number,
                    [message],
                    durable=request.ackPolicy == pb.ALL,
                )
            except Exception as error:
                if not is_refusal(error):
                    raise
                failures.append(error)
                continue
            first = first or (target, published)
        if first is None:
            raise failures[0]
        for failure in failures:  # stored elsewhere: the publisher cannot be told more
            _log.warning("publish to subject %r: %s", request.subject, failure)
        if request.ackPolicy == pb.NONE:
            return pb.PublishToSubjectResponse()
        target, published = first
        stored = published.timestamp
        return pb.PublishToSubjectResponse(
            ack=pb.Ack(
                stream=target.stream,
                partitionSubject=request.subject,
                msgSubject=request.subject,
                offset=published.offsets[0],
                ackInbox=request.ackInbox,
                correlationId=request.correlationId,
                ackPolicy=request.ackPolicy,
                receptionTimestamp=stored,
                commitTimestamp=max(stored, time.time_ns()),
            )
        )
