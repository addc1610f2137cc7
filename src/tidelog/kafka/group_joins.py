"""What a JoinGroup does to a group (no I/O): admit, refuse, answer at once, or wait.

In order, as Kafka's coordinator decides:

1. The request itself: a session timeout outside the limits is ``INVALID_SESSION_TIMEOUT``; more
   protocol metadata than one join may carry is ``GROUP_MAX_SIZE_REACHED`` (more than the
   coordinator has room for: ``COORDINATOR_NOT_AVAILABLE``, retriable); no protocol type or no
   protocol, or protocols that the other members do not share (with the group's protocol type),
   is ``INCONSISTENT_GROUP_PROTOCOL``.
2. A join without a member id is a new member. With an instance id the group knows, it takes
   that static member's place (:func:`_replace_static`). Else, in a full group,
   ``GROUP_MAX_SIZE_REACHED``; from JoinGroup v4 a dynamic member is first given its id with
   ``MEMBER_ID_REQUIRED`` (it joins again with it: so a member that loses the answer does not
   leave a member behind in the group); before v4, or a static member, it is added at once.
3. A join with a member id: one handed out by ``MEMBER_ID_REQUIRED`` is added. An instance id
   held by another member id is ``FENCED_INSTANCE_ID``; an id the group does not know (or that
   another principal joined as) is ``UNKNOWN_MEMBER_ID``. A known member is answered at once
   with the current generation when nothing would change (the same metadata, while the group is
   CompletingRebalance, or Stable and it is not the leader); otherwise it waits for a
   rebalance, which its join starts unless one is under way. The leader's join always
   rebalances: that is how a client asks for one (its topics' partitions changed).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tidelog.kafka.group_model import (
    JoinAnswer,
    JoinRequest,
    Member,
    Pending,
    Step,
    SyncAnswer,
    common_protocols,
    refused,
)
from tidelog.kafka.group_state import Group, GroupState


def join(group: Group, request: JoinRequest, now: float, room: int) -> Step:
    """A JoinGroup (module docstring); ``room``: the bytes the coordinator may still hold."""
    if group.state is GroupState.DEAD:
        return refused(ErrorCode.coordinator_not_available, request.member_id)
    code = _check(group, request, room)
    if code is not None:
        return refused(code, request.member_id)
    if not request.member_id:
        return _new(group, request, now)
    return _known(group, request, now)


def _check(group: Group, request: JoinRequest, room: int) -> ErrorCode | None:
    limits = group.limits
    if (
        not limits.min_session_timeout_s
        <= request.session_timeout_s
        <= (limits.max_session_timeout_s)
    ):
        return ErrorCode.invalid_session_timeout
    size = sum(len(metadata) for _, metadata in request.protocols)
    if size > limits.max_join_metadata_bytes:
        return ErrorCode.group_max_size_reached
    if size > room:
        return ErrorCode.coordinator_not_available
    if not request.protocol_type or not request.protocols:
        return ErrorCode.inconsistent_group_protocol
    others = [m for m in group.members.values() if m.member_id != request.member_id]
    if not others:
        return None
    shared = common_protocols([request.protocols, *(m.protocols for m in others)])
    if request.protocol_type != group.protocol_type or not shared:
        return ErrorCode.inconsistent_group_protocol
    return None


def _new(group: Group, request: JoinRequest, now: float) -> Step:
    instance = request.instance_id
    if instance is not None and instance in group.static:
        return _replace_static(group, request, group.members[group.static[instance]], now)
    if len(group.members) + len(group.pending) >= group.limits.max_members:
        return refused(ErrorCode.group_max_size_reached)
    member_id = group.new_member_id(instance or request.client_id)
    if instance is None and request.require_known_member_id:
        group.pending[member_id] = Pending(request.principal, now + request.session_timeout_s)
        return refused(ErrorCode.member_id_required, member_id)
    return group.add(member_id, request, now)


def _known(group: Group, request: JoinRequest, now: float) -> Step:
    member_id = request.member_id
    pending = group.pending.get(member_id)
    if pending is not None:
        if pending.principal != request.principal:
            return refused(ErrorCode.unknown_member_id, member_id)
        del group.pending[member_id]
        if request.instance_id is not None and request.instance_id in group.static:
            return refused(ErrorCode.fenced_instance_id, member_id)
        return group.add(member_id, request, now)
    instance = request.instance_id
    if instance is not None and group.fenced(member_id, instance):
        return refused(ErrorCode.fenced_instance_id, member_id)
    member = group.members.get(member_id)
    if (
        member is None
        or member.principal != request.principal
        or (instance is not None and instance not in group.static)
    ):
        return refused(ErrorCode.unknown_member_id, member_id)
    same = member.protocols == request.protocols
    if len(group.members) == 1:  # alone, it may change the group's protocol type
        same = same and request.protocol_type == group.protocol_type
        group.protocol_type = request.protocol_type
    _update(member, request, now)
    if same and (
        group.state is GroupState.COMPLETING_REBALANCE
        or (group.state is GroupState.STABLE and member_id != group.leader)
    ):
        return Step(member_id, group.join_answer(member))
    return group.wait_for_rebalance(member, now)


def _replace_static(group: Group, request: JoinRequest, old: Member, now: float) -> Step:
    """A static member back under a new member id: the old id is fenced (its waiting requests
    are answered ``FENCED_INSTANCE_ID``) and the new one takes its place, its assignment and,
    when nothing else changed in a Stable group, the current generation without a rebalance."""
    if old.principal != request.principal:
        return refused(ErrorCode.fenced_instance_id)
    assert request.instance_id is not None
    new_id = group.new_member_id(request.instance_id)
    if old.awaiting_join:
        group.deliver(old, JoinAnswer(ErrorCode.fenced_instance_id, old.member_id))
    if old.awaiting_sync:
        group.deliver(old, SyncAnswer(ErrorCode.fenced_instance_id))
    was_leader = group.leader == old.member_id
    same = old.protocols == request.protocols
    group.members = {
        (new_id if key == old.member_id else key): value for key, value in group.members.items()
    }  # the same place in the join order
    old.member_id = new_id
    old.awaiting_join = old.awaiting_sync = False
    group.static[request.instance_id] = new_id
    if was_leader:
        group.leader = new_id
    _update(old, request, now)
    if group.state is GroupState.STABLE and same and not was_leader:
        return Step(new_id, group.join_answer(old), group.flush())
    return group.wait_for_rebalance(old, now)


def _update(member: Member, request: JoinRequest, now: float) -> None:
    member.protocols = request.protocols
    member.session_timeout_s = request.session_timeout_s
    member.rebalance_timeout_s = request.rebalance_timeout_s
    member.client_id = request.client_id
    member.client_host = request.client_host
    member.last_heard = now
