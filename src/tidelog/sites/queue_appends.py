"""What a transmit does before and around its append to the delta queue.

:func:`encoded_call` checks a call whole (a valid client name, at least one destination per
payload, every destination a declared remote site and none this site, payloads within the size
limit) and packs its entries into as few records as the record size allows (``envelope.py``):
decisions only, no I/O, so a refused call has written nothing. :class:`TransmitGate` keeps a
change of the lifts (``positions.py``) from falling between a transmit's append and its answer.

Invariants: a call with anything refused gives no record (a payload over the limit refuses the
whole call, it is never split); the records keep the call's entries in order, each with at
least one entry and at most ``MAX_ENTRIES``, as many as fit ``max_message_bytes`` less
``ENVELOPE_ROOM``; while the gate is held for a change no transmit is appending, and none
starts until the change is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from tidelog.errors import InvalidArgument, echo
from tidelog.sites.envelope import MAX_ENTRIES, EntryKind, encode_packed
from tidelog.sites.registry import SiteRegistry, validate_site_id

Int64Array = npt.NDArray[np.int64]

ENVELOPE_ROOM: Final = 300
"""Bytes of a record's size limit kept for its envelope (kind, cycle, client name, counts):
the largest payload is the stream's ``max_message_bytes`` minus this."""
_ENTRY_ROOM: Final = 15
"""Bytes of framing per entry at most: a mask (8 bytes in the table), its index and a size."""


def encoded_call(
    client: str,
    payloads: bytes,
    sizes: Int64Array,
    destination_lists: Sequence[Sequence[str]],
    list_indexes: Int64Array,
    registry: SiteRegistry,
    max_message_bytes: int,
) -> list[bytes]:
    """The records of one transmit call (``SendQueue.transmit_packed``'s columns), checked whole
    first: raises ``InvalidArgument`` for the first thing refused."""
    check_call(client, payloads, sizes, len(destination_lists), list_indexes, max_message_bytes)
    table: dict[int, int] = {}  # two lists may name the same sites
    remap = [
        table.setdefault(destination_mask(tuple(d), registry), len(table))
        for d in destination_lists
    ]
    masks = list(table)
    mask_indexes = np.asarray(remap, dtype=np.int64)[list_indexes]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    values = []
    for a, b in packed(sizes, max_message_bytes):
        blob = payloads[int(starts[a]) : int(ends[b - 1])]
        values.append(
            encode_packed(EntryKind.DELTA, client, 0, masks, mask_indexes[a:b], sizes[a:b], blob)
        )
    return values


def check_call(
    client: str,
    payloads: bytes,
    sizes: Int64Array,
    lists: int,
    list_indexes: Int64Array,
    max_message_bytes: int,
) -> None:
    try:
        validate_site_id(client)
    except InvalidArgument:
        raise InvalidArgument(
            f"invalid client name {echo(client)}: use 1-63 letters, digits, '_' or '-', "
            f"starting with a letter or digit (it names the sinks' receive queues)"
        ) from None
    count = len(sizes)
    if not count:
        raise InvalidArgument("a transmit needs at least one payload")
    if int(sizes.sum()) != len(payloads):
        raise InvalidArgument(
            f"the payload sizes add up to {int(sizes.sum())} bytes, but {len(payloads)} "
            f"bytes of payloads were sent"
        )
    if len(list_indexes) != count:
        raise InvalidArgument(f"{count} payloads but {len(list_indexes)} destination indexes")
    if int(list_indexes.min()) < 0 or int(list_indexes.max()) >= lists:
        raise InvalidArgument(
            f"a destination index points past the call's {lists} destination lists"
        )
    limit = max_message_bytes - ENVELOPE_ROOM
    largest = int(sizes.max())
    if largest > limit:
        raise InvalidArgument(
            f"a payload of {largest} bytes is over the limit of {limit} "
            f"(the server's max_message_bytes less {ENVELOPE_ROOM}); nothing was stored"
        )


def destination_mask(destinations: tuple[str, ...], registry: SiteRegistry) -> int:
    if not destinations:
        raise InvalidArgument("every payload needs at least one destination site")
    mask = 0
    for site_id in destinations:
        if site_id == registry.local_site:
            raise InvalidArgument(
                f"{echo(site_id)} is this site: a payload goes to other sites only"
            )
        mask |= 1 << registry.get(site_id).number
    return mask


def packed(sizes: Int64Array, max_message_bytes: int) -> list[tuple[int, int]]:
    """Entries ``[a, b)`` of each record: as few records as the size limit allows (each
    record as many entries as fit, in order)."""
    room = max_message_bytes - ENVELOPE_ROOM
    costs = np.cumsum(sizes + _ENTRY_ROOM)
    bounds: list[tuple[int, int]] = []
    first, count = 0, len(sizes)
    while first < count:
        used_before = int(costs[first - 1]) if first else 0
        end = int(np.searchsorted(costs, used_before + room, side="right"))
        end = min(max(end, first + 1), first + MAX_ENTRIES, count)
        bounds.append((first, end))
        first = end
    return bounds


class TransmitGate:
    """Transmits appending, and changes of the lifts, kept apart."""

    def __init__(self) -> None:
        self._appending = 0
        """Transmits appending now (between their publish and their answer)."""
        self._changing = False
        self._condition = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def positions_changing(self) -> AsyncIterator[None]:
        """Entered once no transmit is appending; none starts until it is left."""
        async with self._condition:
            await self._condition.wait_for(lambda: not self._changing)
            self._changing = True
            await self._condition.wait_for(lambda: not self._appending)
        try:
            yield
        finally:
            async with self._condition:
                self._changing = False
                self._condition.notify_all()

    @contextlib.asynccontextmanager
    async def appending(self) -> AsyncIterator[None]:
        """Held by a transmit from its append to its answer."""
        async with self._condition:
            await self._condition.wait_for(lambda: not self._changing)
            self._appending += 1
        try:
            yield
        finally:
            async with self._condition:
                self._appending -= 1
                self._condition.notify_all()
