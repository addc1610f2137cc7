"""Request bytes that do not decode: INVALID_ARGUMENT for the caller, one warning line for us.

(The first step of the guard every call passes; ``guard.py`` has the others.)

grpc aio decodes a request before the servicer runs, with the method's ``request_deserializer``;
if that raises, grpc logs the exception with its traceback at ERROR and answers UNKNOWN, so one
bad client could flood the log. Every service is therefore registered through
:class:`GuardedRegistry`, which gives each method handler a decoder that never lets a decode
error reach grpc:

- a single request that does not decode becomes an :class:`Undecodable` value, and the wrapped
  behaviour answers it with INVALID_ARGUMENT before the servicer sees it;
- a frame of a request stream that does not decode raises :class:`UndecodableRequest` (an
  :class:`~tidelog.errors.InvalidArgument`) where the servicer reads its requests: the servicer's
  own error handling, or else the wrapped behaviour, ends the call with INVALID_ARGUMENT. The
  requests before the bad frame were served.

Each failure is logged as one WARNING line, at most one per method every
:data:`WARNING_INTERVAL_S` (the next line says how many were suppressed in between).

A streamed response that is already ``bytes`` is sent as it is (:func:`passing_bytes`): a
handler may lay a frame out itself rather than build the message. Streaming responses go through
``context.write`` (grpc's reader/writer form) rather than a second
async generator, so guarding costs no extra generator step per response.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from tidelog.api.guard import Door, guarded_behaviour
from tidelog.api.status import Throttle, cap_detail
from tidelog.errors import InvalidArgument

LOG = logging.getLogger("tidelog.api")

WARNING_INTERVAL_S: Final = 10.0

Handler = Any
"""A ``grpc.RpcMethodHandler`` (the generated code's namedtuple; grpc's stubs leave it untyped)."""


class UndecodableRequest(InvalidArgument):
    """A request (or a frame of a request stream) whose bytes are not a message of its type."""


class Undecodable:
    """Stands for a single request that did not decode; never reaches a servicer."""

    __slots__ = ("error",)

    def __init__(self, error: UndecodableRequest) -> None:
        self.error = error


def _type_name(deserializer: Callable[[bytes], object], method: str) -> str:
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", f"the request of {method}"))


class GuardedRegistry:
    """Stands in for a ``grpc.aio.Server`` in the generated ``add_*Servicer_to_server`` functions
    and registers every method handler on the real server guarded (module docstring)."""

    def __init__(
        self,
        server: grpc.aio.Server,
        interval_s: float = WARNING_INTERVAL_S,
        door: Door | None = None,
    ) -> None:
        """``door``: identifies every caller and checks its access (``guard.py``; by default
        anonymous callers that may do everything)."""
        self._server = server
        self._throttle = Throttle(interval_s)
        self._access = door or Door()
        self._guarded: dict[str, Handler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers([_GuardedGeneric(h, self) for h in handlers])

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Handler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: self.guard(f"/{service}/{name}", h) for name, h in handlers.items()}
        )

    def guard(self, method: str, handler: Handler) -> Handler:
        """``handler`` with a decoder that never raises into grpc (one guarded copy per method)."""
        if handler is None:
            return handler
        known = self._guarded.get(method)
        if known is not None:
            return known
        if handler.request_deserializer is None:  # raw bytes: nothing to decode, still guarded
            guarded = handler._replace(
                **_behaviour(method, handler, self._access), **_serializer(handler)
            )
            self._guarded[method] = guarded
            return guarded
        decode = handler.request_deserializer
        type_name = _type_name(decode, method)
        streamed = handler.request_streaming

        def failed(error: Exception) -> UndecodableRequest:
            detail = cap_detail(str(error) or type(error).__name__, 300)
            failure = UndecodableRequest(f"request could not be decoded as {type_name}: {detail}")
            suppressed = self._throttle.allow(method)
            if suppressed is not None:
                more = f" ({suppressed} more since the last warning)" if suppressed else ""
                LOG.warning("%s: %s%s", method, failure, more)
            return failure

        def guarded_decode(raw: bytes) -> object:
            try:
                return decode(raw)
            except (DecodeError, ValueError) as error:  # bad bytes, bad UTF-8 in a string
                failure = failed(error)
                if streamed:
                    raise failure from None
                return Undecodable(failure)

        guarded = handler._replace(
            request_deserializer=guarded_decode,
            **_behaviour(method, handler, self._access),
            **_serializer(handler),
        )
        self._guarded[method] = guarded
        return guarded


class _GuardedGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, registry: GuardedRegistry) -> None:
        self._inner = inner
        self._registry = registry

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._registry.guard(handler_call_details.method, handler)


_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``serialize``, except that a response already serialised (``bytes``: a protobuf message
    never is) is sent as it is."""

    def serialized(message: Any) -> bytes:
        return message if type(message) is bytes else serialize(message)

    return serialized


def _serializer(handler: Handler) -> dict[str, Callable[[Any], bytes]]:
    """A streamed response may be yielded already serialised (``SubscribeBatches`` frames,
    ``tidelog.api.frames.encoded_record_batch``)."""
    if not handler.response_streaming or handler.response_serializer is None:
        return {}
    return {"response_serializer": passing_bytes(handler.response_serializer)}


def _behaviour(method: str, handler: Handler, access: Door) -> dict[str, Callable[..., Any]]:
    """The handler's behaviour wrapped: Undecodable answered, then the guard's checks and error
    table (``guard.py``). Async behaviours stay async and sync ones sync (grpc runs those in its
    thread pool)."""

    def behind(behaviour: Callable[..., Any], streamed_out: bool) -> Callable[..., Any]:
        return guarded_behaviour(
            method,
            behaviour,
            access,
            streamed_in=handler.request_streaming,
            streamed_out=streamed_out,
        )

    if handler.unary_unary is not None:
        return {"unary_unary": _unary(behind(handler.unary_unary, False))}
    if handler.unary_stream is not None:
        return {"unary_stream": _stream_out(behind(handler.unary_stream, True), single=True)}
    if handler.stream_unary is not None:
        return {"stream_unary": _unary(behind(handler.stream_unary, False))}
    return {"stream_stream": _stream_out(behind(handler.stream_stream, True), single=False)}


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(behaviour):

        async def guarded(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, Undecodable):
                await context.abort(_INVALID, str(request.error))
            try:
                return await behaviour(request, context)
            except UndecodableRequest as error:
                await context.abort(_INVALID, str(error))

        return guarded

    def guarded_sync(request: object, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            context.abort(_INVALID, str(request.error))
        try:
            return behaviour(request, context)
        except UndecodableRequest as error:
            context.abort(_INVALID, str(error))

    return guarded_sync


def _stream_out(behaviour: Callable[..., Any], *, single: bool) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):

        async def guarded(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            if single and isinstance(request, Undecodable):
                await context.abort(_INVALID, str(request.error))
            responses: AsyncIterator[object] = behaviour(request, context)
            try:
                async with contextlib.aclosing(responses):  # type: ignore[type-var]
                    async for response in responses:
                        await context.write(response)
            except UndecodableRequest as error:
                await context.abort(_INVALID, str(error))

        return guarded

    if inspect.iscoroutinefunction(behaviour):  # already the reader/writer form

        async def guarded_writer(
            request: object, context: grpc.aio.ServicerContext[Any, Any]
        ) -> None:
            if single and isinstance(request, Undecodable):
                await context.abort(_INVALID, str(request.error))
            try:
                await behaviour(request, context)
            except UndecodableRequest as error:
                await context.abort(_INVALID, str(error))

        return guarded_writer

    def guarded_sync(request: object, context: grpc.ServicerContext) -> Iterator[object]:
        if single and isinstance(request, Undecodable):
            context.abort(_INVALID, str(request.error))
        try:
            yield from behaviour(request, context)
        except UndecodableRequest as error:
            context.abort(_INVALID, str(error))

    return guarded_sync
