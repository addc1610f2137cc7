"""How far behind each remote site is, told apart: caught up, behind and acking, or stalled.

``lag_entries`` counts the entries for the site after the last position it acknowledged (the tag
index keeps running totals per site, so this reads at most one record); ``lag_seconds`` is the
age of the oldest of them. A site that does not acknowledge is never shown as lag 0 while
entries for it exist: lag is measured from its acknowledgements, not from what was sent. It is
*caught up* when nothing is outstanding and its sender is in delta sync, and *stalled* when
entries are outstanding and it has not acknowledged for ``stall_after_s`` (or never has since
this server started). ``reason`` says why a site is not syncing (the sender's last
negotiation or error), or that it is caught up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidelog.sites.envelope import routed_for
from tidelog.sites.negotiation import NONE
from tidelog.sites.send_queue import SendQueue
from tidelog.sites.sender import Sender
from tidelog.sites.sync_states import SyncState

STALL_AFTER_S = 10.0


@dataclass(frozen=True, slots=True)
class SiteState:
    site_id: str
    address: str
    state: SyncState
    acked: int
    lag_entries: int
    lag_seconds: float
    last_ack_s: float | None
    caught_up: bool
    stalled: bool
    reason: str


def site_state(
    queue: SendQueue,
    sender: Sender,
    *,
    now: float | None = None,
    stall_after_s: float = STALL_AFTER_S,
) -> SiteState:
    now = time.time() if now is None else now
    site, status = sender.site, sender.status
    number, acked = site.number, status.acked
    log = queue.partition.log
    positions = queue.positions_of(number)
    if acked == NONE:
        lag, first_open = queue.index.entries_for(number, 0), site.since
    else:
        record = positions.record_of(acked)
        lag = queue.index.entries_for(number, record + 1)
        first_open = record + 1
        if queue.index.records_for(number, record, 1) == [record]:
            for batch in log.forward_reader(record, stop_offset=record):
                for offset, value in zip(batch.offsets.tolist(), batch.values(), strict=True):
                    first = positions.position(offset, 0)
                    entries = routed_for(value, offset, number, first)
                    later = [e for e in entries if e.position > acked]
                    lag += len(later)
                    if later:
                        first_open = record
    lag_seconds = 0.0
    if lag:
        (oldest,) = queue.index.records_for(number, first_open, 1) or (None,)
        if oldest is not None:
            for batch in log.forward_reader(oldest, stop_offset=oldest):
                lag_seconds = max(0.0, now - int(batch.timestamps[0]) / 1e9)
    silent = status.last_ack_s is None or now - status.last_ack_s > stall_after_s
    caught_up = lag == 0 and status.state is SyncState.LOG_ENTRY_SYNC
    reason = status.reason
    if caught_up:
        # The sender's reason is how the session began ("resuming after ..."), which reads as
        # a site still on its way long after it caught up.
        upto = "" if acked == NONE else f" (up to position {acked})"
        reason = f"caught up: every entry for it is acknowledged{upto}"
    return SiteState(
        site.site_id,
        site.address,
        status.state,
        acked,
        lag,
        lag_seconds,
        status.last_ack_s,
        caught_up,
        stalled=lag > 0 and silent,
        reason=reason,
    )
