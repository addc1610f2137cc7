"""The one door every gRPC call of the server passes, and its table of what each call touches.

Every service is registered through :class:`~tidelog.api.decoding.GuardedRegistry`, which wraps
each method's behaviour here. For each call, in order:

1. the request is decoded without ever raising into grpc (``decoding.py``);
2. the caller is identified from its connection, never from the request (:class:`Door`: a
   client certificate or a bearer token; ``UNAUTHENTICATED`` when the server requires one and
   there is none it accepts); :data:`RPC_ACCESS` names the operations and resources the request
   touches (a request stream: each frame as it is read), and :class:`~tidelog.access.Guard`
   checks them for that identity (``PERMISSION_DENIED`` otherwise), before the servicer runs;
3. the servicer runs; whatever it raises becomes the call's status from the one table in
   ``status.py`` (a not-leader refusal also carries the leader's id and epoch as trailing
   metadata, :data:`~tidelog.wire.NOT_LEADER_KEY`), and a bug is logged with its traceback
   and answered INTERNAL.

A method missing from :data:`RPC_ACCESS` cannot be registered: a new RPC must say what it
touches before it can be served.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import grpc

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.access import (
    ANONYMOUS,
    Access,
    Caller,
    Guard,
    Kind,
    Operation,
    cursor_access,
    on,
    serving,
)
from tidelog.api.open_calls import OpenCall, OpenCalls
from tidelog.api.status import log_failure, status_of
from tidelog.errors import NotLeader, TidelogError
from tidelog.security import Authenticator
from tidelog.wire import LEADER_EPOCH_KEY, NOT_LEADER_KEY

Op = Operation
Accesses = tuple[Access, ...]
Rule = Callable[[Any], Accesses]
"""A request (or one frame of a request stream) -> what it touches."""


def _stream(op: Operation, field: str = "stream") -> Rule:
    return lambda request: (on(op, Kind.STREAM, getattr(request, field)),)


def _fixed(*accesses: Access) -> Rule:
    return lambda _request: accesses


def _create(request: pb.CreateStreamRequest) -> Accesses:
    # A stream on a subject receives what is published to the subject: reading it is a grant.
    create = on(Op.CREATE, Kind.STREAM, request.name)
    if request.subject and request.subject != request.name:
        return (create, on(Op.SUBSCRIBE, Kind.SUBJECT, request.subject))
    return (create,)


def _metadata(request: pb.FetchMetadataRequest) -> Accesses:
    # Named streams and groups are checked; without names the answer lists only what the caller
    # may see (liftbridge.py filters it).
    return (
        *(on(Op.DESCRIBE, Kind.STREAM, s) for s in request.streams),
        *(on(Op.DESCRIBE, Kind.GROUP, g) for g in request.groups),
    )


def _cursor(request: pb.SetCursorRequest | pb.FetchCursorRequest) -> Accesses:
    return (cursor_access(request.cursorId), on(Op.DESCRIBE, Kind.STREAM, request.stream))


def _group(request: Any) -> Accesses:
    return (on(Op.GROUP, Kind.GROUP, request.groupId),)


def _join(request: pb.JoinConsumerGroupRequest) -> Accesses:
    return (
        on(Op.GROUP, Kind.GROUP, request.groupId),
        *(on(Op.SUBSCRIBE, Kind.STREAM, s) for s in request.streams),
    )


def _subscribe(request: Any) -> Accesses:
    # Resuming a paused partition undoes an `alter`; reading as a group's member is acting in
    # the group (its subscriber fences the member's older one).
    accesses = [on(Op.SUBSCRIBE, Kind.STREAM, request.stream)]
    if request.resume:
        accesses.append(on(Op.ALTER, Kind.STREAM, request.stream))
    consumer = getattr(request, "consumer", None)
    if consumer is not None and consumer.groupId:
        accesses.append(on(Op.GROUP, Kind.GROUP, consumer.groupId))
    return tuple(accesses)


def _consume(frame: v1.ConsumeRequest) -> Accesses:
    # Only the first frame names a stream; permits and seeks stay on it.
    if frame.WhichOneof("kind") == "start":
        return (on(Op.SUBSCRIBE, Kind.STREAM, frame.start.stream),)
    return ()


def _site(op: Operation) -> Rule:
    return lambda request: (on(op, Kind.SITE, request.site_id),)


_CLUSTER = Kind.CLUSTER
_SITE = Kind.SITE
_LISTING: Final = _fixed()
"""A listing: open to every identified caller, its answer filtered to what it may see."""

RPC_ACCESS: Final[dict[str, Rule]] = {
    # -- Liftbridge proto.API
    "/proto.API/CreateStream": _create,
    "/proto.API/DeleteStream": lambda r: (on(Op.DELETE, Kind.STREAM, r.name),),
    "/proto.API/PauseStream": lambda r: (on(Op.ALTER, Kind.STREAM, r.name),),
    "/proto.API/SetStreamReadonly": lambda r: (on(Op.ALTER, Kind.STREAM, r.name),),
    "/proto.API/Subscribe": _subscribe,
    "/proto.API/FetchMetadata": _metadata,
    "/proto.API/FetchPartitionMetadata": _stream(Op.DESCRIBE),
    "/proto.API/Publish": _stream(Op.PUBLISH),
    "/proto.API/PublishAsync": _stream(Op.PUBLISH),  # per frame
    "/proto.API/PublishToSubject": lambda r: (on(Op.PUBLISH, Kind.SUBJECT, r.subject),),
    "/proto.API/SetCursor": _cursor,
    "/proto.API/FetchCursor": _cursor,
    "/proto.API/JoinConsumerGroup": _join,
    "/proto.API/LeaveConsumerGroup": _group,
    "/proto.API/FetchConsumerGroupAssignments": _group,
    "/proto.API/ReportConsumerGroupCoordinator": _group,
    # -- tidelog.v1.Tidelog
    "/tidelog.v1.Tidelog/PublishBatch": _stream(Op.PUBLISH),
    "/tidelog.v1.Tidelog/PublishStream": _stream(Op.PUBLISH),  # per frame
    "/tidelog.v1.Tidelog/SubscribeBatches": _subscribe,
    "/tidelog.v1.Tidelog/Consume": _consume,  # per frame
    "/tidelog.v1.Tidelog/Browse": _stream(Op.SUBSCRIBE),
    "/tidelog.v1.Tidelog/DeclareView": _stream(Op.VIEW),
    "/tidelog.v1.Tidelog/DropView": _stream(Op.VIEW),
    "/tidelog.v1.Tidelog/ListViews": _stream(Op.DESCRIBE),
    "/tidelog.v1.Tidelog/ViewGet": _stream(Op.SUBSCRIBE),
    "/tidelog.v1.Tidelog/ViewRange": _stream(Op.SUBSCRIBE),
    "/tidelog.v1.Tidelog/WindowFetch": _stream(Op.SUBSCRIBE),
    "/tidelog.v1.Tidelog/AddSite": _site(Op.SITE),
    "/tidelog.v1.Tidelog/RemoveSite": _site(Op.SITE),
    "/tidelog.v1.Tidelog/ListSites": _fixed(on(Op.SITE, _SITE)),
    "/tidelog.v1.Tidelog/Transmit": _fixed(on(Op.PUBLISH, _SITE)),
    "/tidelog.v1.Tidelog/SiteStatus": _fixed(on(Op.SITE, _SITE)),
    "/tidelog.v1.Tidelog/Replicate": _fixed(on(Op.REPLICATE, _SITE)),  # per frame
    "/tidelog.v1.Tidelog/TransmitSnapshot": _site(Op.SITE),
    "/tidelog.v1.Tidelog/ResyncSite": _site(Op.SITE),
    "/tidelog.v1.Tidelog/DescribeStream": _stream(Op.DESCRIBE),
    "/tidelog.v1.Tidelog/ListGroups": _LISTING,
    # -- tidelog.v1.Replication and ClusterAdmin
    "/tidelog.v1.Replication/ReplicaFetch": _fixed(on(Op.CLUSTER, _CLUSTER)),
    "/tidelog.v1.Replication/ReplicaStream": _fixed(on(Op.CLUSTER, _CLUSTER)),  # per frame
    "/tidelog.v1.Replication/OffsetForLeaderEpoch": _fixed(on(Op.CLUSTER, _CLUSTER)),
    "/tidelog.v1.ClusterAdmin/ClusterStatus": _fixed(on(Op.ADMIN, _CLUSTER)),
    "/tidelog.v1.ClusterAdmin/Reassign": _fixed(on(Op.ADMIN, _CLUSTER)),
    # -- grpc.health.v1: anyone may ask whether the server is up, without credentials
    "/grpc.health.v1.Health/Check": _fixed(),
    "/grpc.health.v1.Health/List": _fixed(),
    "/grpc.health.v1.Health/Watch": _fixed(),
}
"""Full method name -> what a request (each frame of a request stream) touches. A method not
named here is refused at registration (module docstring); ``tests/api/test_guard.py`` checks
this table against every service's descriptor."""

OPEN_METHODS: Final = frozenset(m for m in RPC_ACCESS if m.startswith("/grpc.health.v1."))
"""Served without asking who calls: a load balancer's probe has no credentials."""


class Door:
    """Who a caller is (``authenticator``) and what it may do (``guard``): the two halves of
    the check every call passes. Either may be replaced while calls run (a SIGHUP reload); the
    calls already open are then checked again (:meth:`recheck`, ``open_calls.py``), and each
    frame of a request stream is checked against the policy of the moment it arrives."""

    def __init__(self, guard: Guard | None = None, authenticator: Authenticator | None = None):
        self.guard = guard or Guard()
        self.authenticator = authenticator or Authenticator()
        self.open_calls = OpenCalls()

    def identify(self, context: Any) -> str:
        """The caller's identity from its connection (certificate) and metadata (token);
        :class:`~tidelog.errors.Unauthenticated` when it has none the server accepts."""
        auth = context.auth_context() or {}
        return self.authenticator.identify(auth, context.invocation_metadata())

    def _identify_again(self, auth_context: Any, metadata: Any) -> str:
        return self.authenticator.identify(auth_context, metadata)

    def recheck(self) -> int:
        """End the open calls the current authenticator and policy refuse; how many."""
        return len(self.open_calls.recheck(self._identify_again, self.guard))


async def _answer(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    """End the call with ``error``'s status (``status.py``'s table)."""
    log_failure(error)
    code, detail = status_of(error)
    trailing: tuple[tuple[str, str], ...] = ()
    if isinstance(error, NotLeader):
        trailing = ((NOT_LEADER_KEY, error.leader_id), (LEADER_EPOCH_KEY, str(error.leader_epoch)))
    await context.abort(code, detail, trailing)


def _checked(
    frames: AsyncIterator[Any], rule: Rule, door: Door, call: OpenCall
) -> AsyncIterator[Any]:
    async def each() -> AsyncIterator[Any]:
        async for frame in frames:
            accesses = rule(frame)
            door.guard.check(call.identity, accesses)  # the policy of this moment
            call.touched(accesses)
            yield frame

    return each()


def guarded_behaviour(
    method: str,
    behaviour: Callable[..., Any],
    door: Door,
    *,
    streamed_in: bool,
    streamed_out: bool,
) -> Callable[..., Any]:
    """``behaviour`` (an async servicer method, grpc's reader/writer form for a response stream
    or an async generator) behind the door: caller identified, access checked, errors answered
    by the table. While it runs, :func:`tidelog.access.caller` names the caller, and the call is
    among the door's open calls (a reload that revokes it ends it with the refusal)."""
    rule = RPC_ACCESS.get(method)
    if rule is None:
        raise LookupError(
            f"{method} is not in tidelog.api.guard.RPC_ACCESS: say what it touches before "
            f"serving it"
        )
    open_method = method in OPEN_METHODS

    def admitted(request: Any, context: Any, call: OpenCall) -> Any:
        serving(Caller(call.identity, door.guard))
        if streamed_in:
            return _checked(request, rule, door, call)
        accesses = rule(request)
        door.guard.check(call.identity, accesses)
        call.touched(accesses)
        return request

    def opened(context: Any) -> OpenCall:
        if open_method:
            return OpenCall(ANONYMOUS, None, None, None)
        auth, metadata = context.auth_context() or {}, context.invocation_metadata()
        identity = door.authenticator.identify(auth, metadata)
        return door.open_calls.open(identity, auth, metadata)

    if not inspect.iscoroutinefunction(behaviour) and not inspect.isasyncgenfunction(behaviour):
        return _sync(behaviour, rule, door, streamed_in=streamed_in, streamed_out=streamed_out)

    async def revoked(context: Any, call: OpenCall | None) -> None:
        """A recheck cancelled the call: answer with its refusal (else it was grpc's cancel)."""
        if call is None or call.revoked is None:
            raise asyncio.CancelledError
        await _answer(context, call.revoked)

    if inspect.isasyncgenfunction(behaviour):

        async def written(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            call = None
            try:
                call = opened(context)
                responses: AsyncIterator[object] = behaviour(
                    admitted(request, context, call), context
                )
                async with contextlib.aclosing(responses):  # type: ignore[type-var]
                    async for response in responses:
                        await context.write(response)
                if call.revoked is not None:  # the servicer took the cancel as an end
                    await _answer(context, call.revoked)
            except grpc.aio.AbortError:
                raise
            except asyncio.CancelledError:
                await revoked(context, call)
            except Exception as error:
                await _answer(context, error)
            finally:
                if call is not None:
                    door.open_calls.close(call)

        return written

    async def called(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        call = None
        try:
            call = opened(context)
            answer = await behaviour(admitted(request, context, call), context)
            if call.revoked is not None:  # the servicer took the cancel as an end
                await _answer(context, call.revoked)
            return answer
        except grpc.aio.AbortError:
            raise
        except asyncio.CancelledError:
            await revoked(context, call)
        except Exception as error:
            await _answer(context, error)
        finally:
            if call is not None:
                door.open_calls.close(call)

    return called


def _sync(
    behaviour: Callable[..., Any],
    rule: Rule,
    door: Door,
    *,
    streamed_in: bool,
    streamed_out: bool,
) -> Callable[..., Any]:
    """A synchronous behaviour (grpc runs it in its thread pool: the health service, which is
    grpc's own code, open to every caller): the access check, its refusal answered with grpc's
    synchronous abort."""

    def admitted(request: Any, context: grpc.ServicerContext) -> Any:
        guard = door.guard
        try:
            if streamed_in:
                frames = list(request)  # the health service takes no request stream
                for frame in frames:
                    guard.check(ANONYMOUS, rule(frame))
                return iter(frames)
            guard.check(ANONYMOUS, rule(request))
        except TidelogError as error:
            code, detail = status_of(error)
            context.abort(code, detail)
        return request

    if streamed_out:

        def streamed(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            yield from behaviour(admitted(request, context), context)

        return streamed

    def called(request: Any, context: grpc.ServicerContext) -> Any:
        return behaviour(admitted(request, context), context)

    return called
