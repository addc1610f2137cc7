"""The values a Kafka consumer group is made of and answers with (no behaviour, no I/O).

A :class:`Member` is one consumer as the coordinator knows it: the principal that joined as it
(no other may act as it), its timeouts, its protocols in its order of preference (name and the
opaque metadata its assignor reads) and the assignment the leader gave it. A :class:`Pending`
member id was handed out with ``MEMBER_ID_REQUIRED`` and not used yet. JoinGroup and SyncGroup
may wait: their answers travel as :class:`Delivery` values addressed by member id, which the
shell hands to the requests that wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The coordinator's bounds and timings (constants; ``docs/kafka.md``)."""

    min_session_timeout_s: float = 6.0
    """Kafka's ``group.min.session.timeout.ms``."""
    max_session_timeout_s: float = 1800.0
    """Kafka's ``group.max.session.timeout.ms``."""
    initial_rebalance_delay_s: float = 0.1
    """Kafka's ``group.initial.rebalance.delay.ms`` (3 s there; :mod:`group_state`)."""
    max_members: int = 1000
    """Members (and member ids handed out, not yet used) per group: ``GROUP_MAX_SIZE_REACHED``."""
    max_join_metadata_bytes: int = 1 << 20
    """The protocols' metadata one JoinGroup may carry, summed."""
    max_groups: int = 10_000
    """Groups the coordinator keeps in memory (an Empty one is evicted to make room)."""
    max_total_bytes: int = 256 << 20
    """Metadata and assignments of every group together."""
    max_groups_per_principal: int = 1_250
    """Groups one identified principal may have created and still kept (1/8 of ``max_groups``),
    so that no principal fills the coordinator for the others."""
    max_bytes_per_principal: int = 32 << 20
    """Metadata and assignments of one identified principal's members (1/8 of
    ``max_total_bytes``)."""
    max_rebalance_timeout_s: float = 300.0
    """A member's rebalance timeout is lowered to this: a rebalance waits no longer for it."""


Protocols = tuple[tuple[str, bytes], ...]
"""A member's protocols, by its preference: (name, metadata)."""


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    instance_id: str | None
    principal: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool
    """JoinGroup v4+: a new dynamic member gets its id with ``MEMBER_ID_REQUIRED`` first."""


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    """The leader's answer only: (member id, instance id, metadata) of every member."""


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


Answer = JoinAnswer | SyncAnswer


@dataclass(frozen=True, slots=True)
class Delivery:
    """An answer for the JoinGroup (:class:`JoinAnswer`) or SyncGroup (:class:`SyncAnswer`)
    that member ``member_id`` is waiting with."""

    member_id: str
    answer: Answer


@dataclass(frozen=True, slots=True)
class Step:
    """What a join or sync did: the caller's answer now, or None when it waits (as
    ``member_id``) to be answered by a delivery; and the answers for other waiting members
    (possibly the caller's own, for a request that completed a rebalance)."""

    member_id: str
    answer: Answer | None
    deliveries: tuple[Delivery, ...] = ()


def refused(code: ErrorCode, member_id: str = "") -> Step:
    """A JoinGroup answered at once with an error."""
    return Step(member_id, JoinAnswer(code, member_id))


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    principal: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: Protocols
    last_heard: float
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False

    @property
    def size(self) -> int:
        """Bytes held for it: its protocols' metadata and its assignment."""
        return sum(len(m) for _, m in self.protocols) + len(self.assignment)

    def expires_at(self) -> float | None:
        """When it is removed unless heard from (None: a request of its own is waiting)."""
        if self.awaiting_join or self.awaiting_sync:
            return None
        return self.last_heard + self.session_timeout_s

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def names(self) -> set[str]:
        return {name for name, _ in self.protocols}


@dataclass(slots=True)
class Pending:
    """A member id handed out with ``MEMBER_ID_REQUIRED``, not used yet."""

    principal: str
    expires_at: float


def common_protocols(protocols: Iterable[Protocols]) -> set[str]:
    """The protocol names every one of ``protocols`` lists (empty for none)."""
    common: set[str] | None = None
    for listed in protocols:
        names = {name for name, _ in listed}
        common = names if common is None else common & names
    return common or set()


def select_protocol(members: list[Member]) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes for the one it
    lists first; most votes wins, a tie goes to the one the earliest member prefers. The members
    must share a protocol (each join was checked against the others)."""
    candidates = common_protocols(m.protocols for m in members)
    votes: dict[str, int] = {}
    for member in members:
        vote = next(name for name, _ in member.protocols if name in candidates)
        votes[vote] = votes.get(vote, 0) + 1
    best = max(votes.values())
    return next(name for name, _ in members[0].protocols if votes.get(name, 0) == best)
