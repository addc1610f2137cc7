"""Messages of a server stream already serialised and framed, for a transport that can take them.

gRPC frames each message of a stream as one byte of flags (0: not compressed), a 4-byte
big-endian length, then the message's bytes. A handler that can lay out many messages at once
(a subscription's batch of Liftbridge ``Message`` s) yields one :class:`Framed` holding all of
them, in order, each with its prefix, instead of one object per message.

``data`` may also be a tuple of pieces whose bytes, one after the other, are the framed messages
(:meth:`Framed.of_message`: a message laid out in pieces, its large ones sent without being
joined into one buffer first).

Invariants: ``data`` (its pieces joined, for a tuple) is a whole number of framed messages
(never a partial one), ``count`` of them; every one is a valid encoding of the method's
response type, exactly what the method's serializer would produce for the message it stands
for; ``data`` (and every piece) is not written once the Framed is yielded (the transport may
send from it later, without a copy).

Only a transport whose context says so (:func:`takes_framed`) receives them; grpcio's server
sends one message per write and is handed messages one by one.

The module also holds what every writer of framed messages shares: the prefix
(:data:`PREFIX`, also read by the native transport) and a buffer (:data:`Piece`); protobuf's
varint is ``tidelog.wire.varints.uvarint``, which the cluster's encoder uses too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

Piece = bytes | bytearray | memoryview
"""One buffer of a message's bytes (``memoryview`` s of bytes, one-dimensional)."""

PREFIX: Final = struct.Struct(">BI")
"""A gRPC message's prefix: the compressed flag (0) and the message's length."""

FRAMED_ATTRIBUTE = "takes_framed"
"""The attribute a servicer context sets to True when its transport passes Framed through."""


@dataclass(frozen=True, slots=True)
class Framed:
    """``count`` gRPC messages of one stream, serialised and prefixed, back to back."""

    data: Piece | tuple[Piece, ...]
    count: int

    @classmethod
    def of_message(cls, pieces: Sequence[Piece]) -> Framed:
        """One uncompressed message whose serialised bytes are ``pieces`` joined, prefixed,
        the pieces kept as they are."""
        return cls((PREFIX.pack(0, sum(map(len, pieces))), *pieces), 1)


def takes_framed(context: object) -> bool:
    """Whether the call's transport writes :class:`Framed` as they are (tidelog's own HTTP/2
    server does; grpcio's does not)."""
    return getattr(context, FRAMED_ATTRIBUTE, False) is True


def outbound_of(context: object) -> Callable[[], tuple[int, int]] | None:
    """The call's ``outbound`` report, ``(pending, sent)`` response bytes, where the transport
    gives one (tidelog's own server does, ``transport/context.py``; grpcio's does not)."""
    outbound = getattr(context, "outbound", None)
    return outbound if takes_framed(context) and callable(outbound) else None
