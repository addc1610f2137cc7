"""What one Kafka request may ask of the broker: frame sizes, element counts, repeated entries.

A request is decoded whole (kio's native reader) before any handler sees it, and decoding holds
the event loop for every connection: about 0.3 s per MiB of the smallest elements (a Metadata of
empty topic names). And a handler that loops over what the request names works for each entry.
So three bounds keep one request from holding the broker for everyone:

- a frame's size, by api (:func:`check_frame`): Produce and SyncGroup carry records and
  assignments and may use the listener's ``request_max_bytes`` (Kafka's
  ``socket.request.max.bytes``, 100 MiB by default); every other api at most
  :data:`LIGHT_REQUEST_MAX_BYTES`, which bounds its decoding to about a second at worst and
  holds any request a real client sends (10,000 topic names of 249 bytes are 2.5 MB);
- the elements of its arrays (:func:`check_counts`), right after decoding: at most
  :data:`MAX_TOP_ITEMS` in any top-level array (topics, groups, coordinator keys, resources)
  and :data:`MAX_ITEMS` counted over every array of the request (partitions, members, ...);
- an entry named twice, where answering it twice would do the work twice (Fetch, ListOffsets,
  Produce, OffsetCommit): the first is served, each repeat answered ``INVALID_REQUEST``
  (:class:`Seen`), as Kafka's broker answers ListOffsets.

A request over a bound closes its connection after a log line (:class:`RequestTooBig`), as an
undecodable one does: a client that sends one is broken or hostile, and has nothing to retry.
Handlers that loop over many entries give the loop a turn every :data:`TURN_EVERY` of them
(:func:`turn`), and the answer to a request of many entries is encoded in a worker thread
(:data:`ENCODE_APART_ITEMS`), so other connections are answered meanwhile. Decoding cannot be
shared so (kio's native reader holds the interpreter): the frame bound is what limits it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from types import UnionType
from typing import Any, Final, Union, get_args, get_origin

LIGHT_REQUEST_MAX_BYTES: Final = 4 << 20
"""The largest frame of every api but those in :data:`HEAVY_APIS`."""
HEAVY_APIS: Final = frozenset({0, 14})
"""Produce (records) and SyncGroup (the leader's assignments): frames up to the listener's
``request_max_bytes``."""
MAX_TOP_ITEMS: Final = 10_000
"""Elements of any one top-level array of a request (topics, groups, keys)."""
MAX_ITEMS: Final = 100_000
"""Elements of every array of a request together (topics and their partitions, ...)."""
TURN_EVERY: Final = 500
"""A handler looping over a request's entries lets other connections run this often."""
ENCODE_APART_ITEMS: Final = 5_000
"""A request of more elements than this has its answer encoded in a worker thread: kio's writer
calls back into Python for every field (about 6 us a Fetch partition), and the thread lets the
event loop serve other connections meanwhile."""


class RequestTooBig(Exception):
    """A request over a bound (module docstring): its connection is closed after a log line."""


def check_frame(api_key: int, size: int, request_max_bytes: int) -> None:
    """Raise :class:`RequestTooBig` when a frame of ``size`` bytes is too large for its api."""
    limit = request_max_bytes if api_key in HEAVY_APIS else LIGHT_REQUEST_MAX_BYTES
    if size > limit:
        raise RequestTooBig(f"api {api_key}: a request of {size} bytes (at most {limit})")


def check_counts(body: Any) -> int:
    """The elements of every array of ``body`` (a decoded kio request); :class:`RequestTooBig`
    when they are more than the bounds allow. Stops counting at the bound, and visits only
    elements that hold arrays themselves (a Fetch's topics, not their partitions), so a
    refusal costs no more than an allowed request's count."""
    total = 0
    pending: list[Any] = [body]
    top = True
    while pending:
        entity = pending.pop()
        for name in _array_fields(type(entity)):
            value = getattr(entity, name)
            if not value:
                continue
            if top and len(value) > MAX_TOP_ITEMS:
                raise RequestTooBig(
                    f"{type(body).__name__}.{name}: {len(value)} elements (at most {MAX_TOP_ITEMS})"
                )
            total += len(value)
            if total > MAX_ITEMS:
                raise RequestTooBig(
                    f"{type(body).__name__}: over {MAX_ITEMS} elements in its arrays"
                )
            if _array_fields(type(value[0])):
                pending.extend(value)
        top = False
    return total


_ARRAY_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def _array_fields(cls: type[Any]) -> tuple[str, ...]:
    """The fields of kio class ``cls`` that hold arrays (none for any other class)."""
    found = _ARRAY_FIELDS.get(cls)
    if found is None:
        names = []
        for name, spec in getattr(cls, "__dataclass_fields__", {}).items():
            kind = spec.type
            options = get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,)
            if any(get_origin(option) is tuple for option in options):
                names.append(name)
        found = _ARRAY_FIELDS[cls] = tuple(names)
    return found


class Seen:
    """The entries of a request served so far: :meth:`first` is True once per key."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: set[Hashable] = set()

    def first(self, key: Hashable) -> bool:
        if key in self._keys:
            return False
        self._keys.add(key)
        return True


async def turn(index: int) -> None:
    """Let other tasks run when ``index`` (a loop's count) is a multiple of
    :data:`TURN_EVERY` (and not 0)."""
    if index and index % TURN_EVERY == 0:
        await asyncio.sleep(0)
