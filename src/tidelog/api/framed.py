"""Messages of a server stream already serialised and framed, for a transport that can take them.

gRPC frames each message of a stream as one byte of flags (0: not compressed), a 4-byte
big-endian length, then the message's bytes. A handler that can lay out many messages at once
(a subscription's batch of Liftbridge ``Message`` s) yields one :class:`Framed` holding all of
them, in order, each with its prefix, instead of one object per message.

Invariants: ``data`` is a whole number of framed messages (never a partial one), ``count`` of
them; every one is a valid encoding of the method's response type, exactly what the method's
serializer would produce for the message it stands for; ``data`` is not written once the
Framed is yielded (the transport may send from it later, without a copy).

Only a transport whose context says so (:func:`takes_framed`) receives them; grpcio's server
sends one message per write and is handed messages one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

FRAMED_ATTRIBUTE = "takes_framed"
"""The attribute a servicer context sets to True when its transport passes Framed through."""


@dataclass(frozen=True, slots=True)
class Framed:
    """``count`` gRPC messages of one stream, serialised and prefixed, back to back."""

    data: bytes | bytearray | memoryview
    count: int


def takes_framed(context: object) -> bool:
    """Whether the call's transport writes :class:`Framed` as they are (tidelog's own HTTP/2
    server does; grpcio's does not)."""
    return getattr(context, FRAMED_ATTRIBUTE, False) is True
