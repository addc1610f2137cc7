"""The controller's decisions, as pure functions of the cluster's state: where a new stream's
partitions go, who leads a partition whose leader died, who leaves or rejoins an ISR.

The controller (one broker, elected through etcd: ``metadata.py``) applies each decision with a
compare-and-set on the partition's epoch, so a decision made on a stale view is refused and
made again; these functions only say what the next state is.

- **Placement**: ``replication_factor`` replicas per partition on distinct brokers (-1: every
  broker), leaders spread so that no broker leads more than one partition more than another
  (counting the leaders it already has), each partition's replicas the next brokers after its
  leader in id order. All replicas start in the ISR.
- **Election**: when a leader is not live, the next leader is the first live ISR member in
  replica order, with the leader epoch raised; the ISR keeps its live members. With no live
  ISR member there is no leader (no unclean election: a replica outside the ISR may lack
  acknowledged records), and the partition is offline until one comes back.
- **Colocation**: a stream colocated with an anchor partition (the sites' queues, with their delta
  queue) is placed on the anchor's replicas with the anchor's leader leading, and each of its
  partitions hands its leadership to the anchor's leader once that broker is in its ISR (a clean
  move: the leader epoch is raised), so one broker leads them all.
- **Internal streams widen**: an internal stream placed on fewer brokers than it wants (created
  while fewer were live: the first brokers of a cluster start one by one) gets the missing
  replicas through a reassignment once more brokers are live, a colocated one from its anchor's
  replicas; never while one of its replicas is down (a reassignment asks for live brokers). A
  colocated stream is moved to its anchor's replicas whenever they differ (``align``: the anchor
  was widened or reassigned).
- **ISR changes**: a lagging follower leaves, never the leader, never below one member; a
  follower that caught up rejoins. Neither changes the leader epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tidelog.cluster.metadata import PartitionState
from tidelog.errors import InvalidArgument

EVERY_BROKER = -1


def place(
    partitions: int,
    replication_factor: int,
    brokers: Sequence[str],
    leading: Mapping[str, int] | None = None,
) -> list[PartitionState]:
    """The first state of each of ``partitions`` partitions (``leading``: how many partitions
    each broker leads already)."""
    ring = sorted(set(brokers))
    if not ring:
        raise InvalidArgument("no live broker to place partitions on")
    factor = len(ring) if replication_factor == EVERY_BROKER else replication_factor
    if not 1 <= factor <= len(ring):
        raise InvalidArgument(
            f"replicationFactor {replication_factor} needs that many live brokers; "
            f"{len(ring)} are live ({', '.join(ring)}): use at most {len(ring)}, or -1 for all"
        )
    counts = {b: (leading or {}).get(b, 0) for b in ring}
    states = []
    for _ in range(partitions):
        leader = min(ring, key=lambda b: (counts[b], ring.index(b)))
        counts[leader] += 1
        at = ring.index(leader)
        replicas = tuple(ring[(at + i) % len(ring)] for i in range(factor))
        states.append(PartitionState(replicas, leader, replicas))
    return states


def colocated(partitions: int, anchor: PartitionState) -> list[PartitionState]:
    """The first state of each partition of a stream colocated with ``anchor``: its replicas,
    its leader first, and its leader (or the first replica while it has none)."""
    if not anchor.replicas:
        raise InvalidArgument("the colocation anchor has no replicas")
    leader = anchor.leader or anchor.replicas[0]
    replicas = (leader, *(r for r in anchor.replicas if r != leader))
    # In sync from the start: the anchor's in-sync replicas (all are empty), not one it
    # dropped for lagging or death, which would hold the first acknowledgements back.
    isr = tuple(r for r in replicas if r == leader or r in anchor.isr)
    return [PartitionState(replicas, leader, isr) for _ in range(partitions)]


def align(state: PartitionState, anchor: PartitionState, live: set[str]) -> PartitionState | None:
    """A reassignment of a colocated partition to its anchor's replicas when they differ (the
    anchor was reassigned or widened). None: the same brokers, either of them moving, or one
    of the anchor's replicas down."""
    if (
        state.target
        or anchor.target
        or set(state.replicas) == set(anchor.replicas)
        or not set(anchor.replicas) <= live
    ):
        return None
    return reassign(state, anchor.replicas, live)


def follow_anchor(
    state: PartitionState, anchor: PartitionState, live: set[str]
) -> PartitionState | None:
    """Leadership handed to the anchor's leader when it is live, a replica and in the ISR, and
    leads nothing here yet (None: nothing to change; a reassignment in progress is left to
    finish first)."""
    wanted = anchor.leader
    if (
        not wanted
        or wanted == state.leader
        or wanted not in live
        or wanted not in state.isr
        or state.target
    ):
        return None
    return replace(state, leader=wanted, leader_epoch=state.leader_epoch + 1)


def widen(
    state: PartitionState, wanted: int, live: set[str], candidates: Sequence[str]
) -> PartitionState | None:
    """A reassignment adding the first live ``candidates`` to a partition with fewer than
    ``wanted`` replicas (None: nothing to add, one moving already, or a replica is down)."""
    if state.target or len(state.replicas) >= wanted or not set(state.replicas) <= live:
        return None
    extra = [b for b in candidates if b in live and b not in state.replicas]
    if not extra:
        return None
    return reassign(state, state.replicas + tuple(extra[: wanted - len(state.replicas)]), live)


def elect(state: PartitionState, live: set[str]) -> PartitionState | None:
    """The next state when the leader may be gone: None when nothing changes (the leader is
    live) or no ISR member is live (offline: no unclean election)."""
    if state.leader in live:
        return None
    candidates = [r for r in state.replicas if r in state.isr and r in live]
    if not candidates:
        return None
    leader = candidates[0]
    isr = tuple(r for r in state.replicas if r in state.isr and r in live)
    return replace(state, leader=leader, isr=isr, leader_epoch=state.leader_epoch + 1)


def shrink_isr(state: PartitionState, lagging: set[str]) -> PartitionState | None:
    """``state`` without the lagging followers in its ISR (None: nothing to change)."""
    isr = tuple(r for r in state.isr if r == state.leader or r not in lagging)
    return replace(state, isr=isr) if isr != state.isr else None


def expand_isr(state: PartitionState, caught_up: str) -> PartitionState | None:
    """``state`` with a caught-up replica back in its ISR (None: nothing to change)."""
    if caught_up in state.isr or caught_up not in state.replicas:
        return None
    members = set(state.isr) | {caught_up}
    return replace(state, isr=tuple(r for r in state.replicas if r in members))


def reassign(state: PartitionState, target: Sequence[str], live: set[str]) -> PartitionState:
    """Start moving a partition to the replicas ``target``: they join ``replicas`` (and, once
    caught up, the ISR) beside the current ones; ``finish_reassignment`` drops the others."""
    wanted = tuple(dict.fromkeys(target))
    if not wanted:
        raise InvalidArgument("a reassignment needs at least one replica")
    unknown = [b for b in wanted if b not in live]
    if unknown:
        raise InvalidArgument(
            f"broker(s) {', '.join(unknown)} are not live: use live brokers "
            f"({', '.join(sorted(live))})"
        )
    replicas = state.replicas + tuple(b for b in wanted if b not in state.replicas)
    return replace(state, replicas=replicas, target=wanted)


def finish_reassignment(state: PartitionState) -> PartitionState | None:
    """Once every target replica is in the ISR: the partition's replicas become the target (a
    leader outside it hands over to the first target replica in the ISR). None: not yet."""
    if not state.target or not set(state.target) <= set(state.isr):
        return None
    isr = tuple(b for b in state.target if b in state.isr)
    if state.leader in state.target:
        return replace(state, replicas=state.target, isr=isr, target=())
    return replace(
        state,
        replicas=state.target,
        isr=isr,
        leader=isr[0],
        leader_epoch=state.leader_epoch + 1,
        target=(),
    )
