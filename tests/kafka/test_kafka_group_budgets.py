"""The coordinator's per-principal budgets: one principal that creates groups or holds metadata
up to its budget is refused, and another's groups are still served; a rebalance timeout is
lowered to the bound."""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from tests.kafka.kafka_wire import run

from tidelog.access import ANONYMOUS
from tidelog.kafka.group_coordinator import Coordinator
from tidelog.kafka.group_model import GroupLimits, JoinRequest


def joining(
    principal: str,
    metadata: bytes = b"m",
    rebalance: float = 2.0,
    require_known_member_id: bool = True,
) -> JoinRequest:
    return JoinRequest(
        member_id="",
        instance_id=None,
        principal=principal,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_s=10.0,
        rebalance_timeout_s=rebalance,
        protocol_type="consumer",
        protocols=(("range", metadata),),
        require_known_member_id=require_known_member_id,
    )


LIMITS = GroupLimits(
    min_session_timeout_s=0.05,
    initial_rebalance_delay_s=0.0,
    max_groups=8,
    max_groups_per_principal=2,
    max_total_bytes=10_000,
    max_bytes_per_principal=3_000,
)


def test_one_principal_cannot_take_every_group() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(LIMITS)
        codes = [(await coordinator.join(f"m{i}", joining("mallory"))).error for i in range(8)]
        # each join leaves a member id handed out: its group is kept, not evictable
        assert codes[:2] == [ErrorCode.member_id_required] * 2
        assert codes[2:] == [ErrorCode.coordinator_not_available] * 6
        answer = await coordinator.join("alice-app", joining("alice"))
        assert answer.error is ErrorCode.member_id_required
        coordinator.close()

    run(scenario)


def test_anonymous_callers_share_the_global_bounds_only() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(LIMITS)
        codes = [(await coordinator.join(f"a{i}", joining(ANONYMOUS))).error for i in range(9)]
        assert codes[:8] == [ErrorCode.member_id_required] * 8
        assert codes[8] is ErrorCode.coordinator_not_available
        coordinator.close()

    run(scenario)


def test_one_principal_cannot_take_every_byte() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(LIMITS)
        big = b"x" * 2_000
        codes = []
        for i in range(2):
            answer = await coordinator.join(
                f"m{i}", joining("mallory", big, require_known_member_id=False)
            )
            codes.append(answer.error)
        # the second would pass the global room (10,000) but not mallory's own (3,000)
        assert codes == [ErrorCode.none, ErrorCode.coordinator_not_available]
        for name in ("alice-1", "alice-2"):  # others still have room
            answer = await coordinator.join(
                name, joining("bob", b"y" * 1_000, require_known_member_id=False)
            )
            assert answer.error is ErrorCode.none
        # leaving gives mallory her room back
        group = coordinator.find("m0")
        assert group is not None
        (member,) = group.members
        assert coordinator.leave("m0", member, None, "mallory") is ErrorCode.none
        answer = await coordinator.join(
            "m1", joining("mallory", big, require_known_member_id=False)
        )
        assert answer.error is ErrorCode.none
        coordinator.close()

    run(scenario)


def test_a_rebalance_timeout_is_lowered_to_the_bound() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(LIMITS)
        answer = await coordinator.join(
            "g", joining("alice", rebalance=3600.0, require_known_member_id=False)
        )
        assert answer.error is ErrorCode.none
        group = coordinator.find("g")
        assert group is not None
        (member,) = group.members.values()
        assert member.rebalance_timeout_s == LIMITS.max_rebalance_timeout_s == 300.0
        coordinator.close()

    run(scenario)
