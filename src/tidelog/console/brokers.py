"""The cluster page's brokers: what the cluster says now, with the brokers this console saw before.

A broker that stops loses its registration; the cluster names it (down) only while a partition
lists it as a replica. So that a killed broker does not vanish from the page, the console keeps
each broker it has seen (its address and when it last saw it registered, at most
:data:`MAX_REMEMBERED`, the least recently seen dropped first) and shows one that the cluster
no longer lists as down, with when it was last seen. A console restart forgets them. No I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tidelog.client import ClusterStatus

MAX_REMEMBERED = 1000


@dataclass(frozen=True, slots=True)
class BrokerRow:
    broker_id: str
    address: str
    """empty when not known"""
    controller: bool
    down: bool
    last_seen_s: float | None
    """for a broker down: when this console last saw it registered (None: never)"""
    led: int
    """partitions it leads"""


class BrokerMemory:
    """The brokers seen registered, by id: their address and when (unix seconds)."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def rows(self, status: ClusterStatus, now_s: float) -> list[BrokerRow]:
        """The brokers of ``status`` (remembered as seen now when up), then the remembered ones
        it no longer lists, as down; by id."""
        led: dict[str, int] = {}
        for p in status.partitions:
            led[p.leader] = led.get(p.leader, 0) + 1
        rows: dict[str, BrokerRow] = {}
        for b in status.brokers:
            if not b.down:
                self._seen[b.broker_id] = (b.address, now_s)
                self._seen.move_to_end(b.broker_id)
            address, seen = self._seen.get(b.broker_id, (b.address, None))
            rows[b.broker_id] = BrokerRow(
                b.broker_id,
                b.address or (address if b.down else ""),
                b.controller,
                b.down,
                seen if b.down else None,
                led.get(b.broker_id, 0),
            )
        for broker_id, (address, seen) in self._seen.items():
            if broker_id not in rows:
                rows[broker_id] = BrokerRow(broker_id, address, False, True, seen, 0)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return [rows[b] for b in sorted(rows)]
