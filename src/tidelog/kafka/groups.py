"""Kafka's classic consumer-group apis, translated onto the server's group coordinator.

FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups and DescribeGroups are
here; OffsetCommit and OffsetFetch, which keep the committed offsets as tidelog cursors, are
:mod:`tidelog.kafka.group_offsets`. The decisions are :mod:`group_state` and :mod:`group_joins`,
the waiting and the timers :mod:`group_coordinator`; a handler checks what the caller may do,
reads the request into those calls and their answer into the response of its version.

Access (``docs/kafka.md``). Every call about a group needs ``group`` on that group
(``GROUP_AUTHORIZATION_FAILED``), except FindCoordinator, DescribeGroups and ListGroups, which
need only to see it (any grant on the group; ListGroups lists only the groups the caller may
see), so a monitoring principal finds and describes groups it may not join. A member belongs to the
principal that joined as it (the connection's, never a request field): another principal naming
it is ``UNKNOWN_MEMBER_ID``. A group id is refused (``INVALID_GROUP_ID``) when it is empty or
too long to name a cursor. A group this broker does not coordinate is ``NOT_COORDINATOR``.

FindCoordinator answers the coordinator of a group (key type 0); transactions (key type 1) are not
served (``UNSUPPORTED_VERSION``: the clients' producer stops with that instead of retrying), and
other key types are ``INVALID_REQUEST``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.access import Kind, Operation
from tidelog.errors import TidelogError
from tidelog.kafka import group_offsets
from tidelog.kafka.group_coordinator import coordinator_broker, coordinator_of, refusal
from tidelog.kafka.group_model import JoinAnswer, JoinRequest
from tidelog.kafka.group_state import Group, GroupState
from tidelog.kafka.protocol import Request, answer, nested
from tidelog.kafka.session import Session, node_id

GROUP_KEY: Final = 0
TRANSACTION_KEY: Final = 1
NO_OPERATIONS: Final = -(2**31)
"""``authorized_operations`` when the client did not ask for them."""


def _host(peer: str) -> str:
    """Kafka's client host: a slash, then the address."""
    return "/" + peer.rsplit(":", 1)[0]


# -- FindCoordinator ------------------------------------------------------------------------------


async def _find(session: Session, key_type: int, key: str) -> tuple[int, str, int, ErrorCode, str]:
    """(node id, host, port, error, message) of the coordinator of ``key``."""
    if key_type == TRANSACTION_KEY:
        return -1, "", -1, ErrorCode.unsupported_version, "transactions are not served"
    if key_type != GROUP_KEY:
        return -1, "", -1, ErrorCode.invalid_request, f"key type {key_type} is not served"
    code = await refusal(session, key, Operation.DESCRIBE)  # Kafka's: describe on the group
    broker = session.control.broker_id
    if code is ErrorCode.not_coordinator:
        try:
            found = await coordinator_broker(session.control, key)
        except TidelogError:  # the cursor store moved since refusal() asked: retriable
            found = None
        address = None if found is None else session.broker_address(found)
        if found is None or address is None:
            return -1, "", -1, ErrorCode.coordinator_not_available, "no coordinator now"
        return node_id(found), address[0], address[1], ErrorCode.none, ""
    if code is not None:
        return -1, "", -1, code, ""
    host, port = session.advertised
    return node_id(broker), host, port, ErrorCode.none, ""


async def find_coordinator(session: Session, request: Request) -> Any:
    body = request.body
    key_type = getattr(body, "key_type", GROUP_KEY)
    if request.version < 4:
        found, host, port, code, message = await _find(session, key_type, body.key)
        return answer(
            request,
            throttle_time=timedelta(0),
            error_code=code,
            error_message=message or None,
            node_id=found,
            host=host,
            port=port,
        )
    coordinators = []
    for key in body.coordinator_keys:
        found, host, port, code, message = await _find(session, key_type, key)
        coordinators.append(
            nested(
                request,
                "Coordinator",
                key=key,
                node_id=found,
                host=host,
                port=port,
                error_code=code,
                error_message=message or None,
            )
        )
    return answer(request, throttle_time=timedelta(0), coordinators=tuple(coordinators))


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------------


def _join_response(request: Request, result: JoinAnswer) -> Any:
    members = tuple(
        nested(
            request,
            "JoinGroupResponseMember",
            member_id=member_id,
            group_instance_id=instance_id,
            metadata=metadata,
        )
        for member_id, instance_id, metadata in result.members
    )
    nullable = request.version >= 7  # before, the protocol name is a plain string
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if nullable else (result.protocol_name or ""),
        leader=result.leader,
        skip_assignment=False,
        member_id=result.member_id,
        members=members,
    )


async def _tidelog_group(session: Session, group_id: str) -> ErrorCode | None:
    """``INCONSISTENT_GROUP_PROTOCOL`` when ``group_id`` is a tidelog group (its members join
    through tidelog's own group calls): one id, one membership, as Kafka refuses a classic
    member in a group of the other protocol."""
    try:
        found = await session.control.group_coordinator(group_id)
    except TidelogError:
        return ErrorCode.coordinator_not_available
    return None if found is None else ErrorCode.inconsistent_group_protocol


async def join_group(session: Session, request: Request) -> Any:
    body = request.body
    refused = await refusal(session, body.group_id) or await _tidelog_group(session, body.group_id)
    if refused is not None:
        return _join_response(request, JoinAnswer(refused, body.member_id))
    session_s = body.session_timeout.total_seconds()
    rebalance = getattr(body, "rebalance_timeout", None)
    rebalance_s = rebalance.total_seconds() if rebalance is not None else 0.0
    joining = JoinRequest(
        member_id=body.member_id,
        instance_id=getattr(body, "group_instance_id", None),
        principal=session.identity,
        client_id=request.client_id or "",
        client_host=_host(session.peer),
        session_timeout_s=session_s,
        rebalance_timeout_s=rebalance_s if rebalance_s > 0 else session_s,  # v0: the session's
        protocol_type=body.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in body.protocols),
        require_known_member_id=request.version >= 4,
    )
    result = await coordinator_of(session.control).join(body.group_id, joining)
    return _join_response(request, result)


async def sync_group(session: Session, request: Request) -> Any:
    body = request.body
    refused = await refusal(session, body.group_id)
    if refused is not None:
        return answer(request, throttle_time=timedelta(0), error_code=refused, assignment=b"")
    result = await coordinator_of(session.control).sync(
        body.group_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
        session.identity,
        body.generation_id,
        (getattr(body, "protocol_type", None), getattr(body, "protocol_name", None)),
        {a.member_id: bytes(a.assignment) for a in body.assignments},
    )
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def heartbeat(session: Session, request: Request) -> Any:
    body = request.body
    code = await refusal(session, body.group_id)
    if code is None:
        code = coordinator_of(session.control).heartbeat(
            body.group_id,
            body.member_id,
            getattr(body, "group_instance_id", None),
            session.identity,
            body.generation_id,
        )
    return answer(request, throttle_time=timedelta(0), error_code=code)


async def leave_group(session: Session, request: Request) -> Any:
    body = request.body
    if request.version < 3:
        leaving: tuple[tuple[str, str | None], ...] = ((body.member_id, None),)
    else:
        leaving = tuple((m.member_id, m.group_instance_id) for m in body.members)
    refused = await refusal(session, body.group_id)
    if refused is not None:
        return answer(request, throttle_time=timedelta(0), error_code=refused, members=())
    coordinator = coordinator_of(session.control)
    codes = [
        coordinator.leave(body.group_id, member_id, instance_id, session.identity)
        for member_id, instance_id in leaving
    ]
    if request.version < 3:
        return answer(request, throttle_time=timedelta(0), error_code=codes[0])
    members = tuple(
        nested(
            request,
            "MemberResponse",
            member_id=member_id,
            group_instance_id=instance_id,
            error_code=code,
        )
        for (member_id, instance_id), code in zip(leaving, codes, strict=True)
    )
    return answer(request, throttle_time=timedelta(0), error_code=ErrorCode.none, members=members)


# -- ListGroups, DescribeGroups -------------------------------------------------------------------


async def list_groups(session: Session, request: Request) -> Any:
    wanted = {s.lower() for s in getattr(request.body, "states_filter", ())}
    listed = tuple(
        nested(
            request,
            "ListedGroup",
            group_id=group.group_id,
            protocol_type=group.protocol_type or "",
            group_state=group.state.value,
        )
        for group in sorted(coordinator_of(session.control).groups.values(), key=_by_id)
        if group.state is not GroupState.DEAD
        and (not wanted or group.state.value.lower() in wanted)
        and session.may_see(Kind.GROUP, group.group_id)
    )
    return answer(request, throttle_time=timedelta(0), error_code=ErrorCode.none, groups=listed)


def _by_id(group: Group) -> str:
    return group.group_id


def _described(request: Request, group_id: str, code: ErrorCode, group: Group | None) -> Any:
    members: tuple[Any, ...] = ()
    state, protocol_type, protocol = GroupState.DEAD.value, "", ""
    if group is not None:
        state, protocol_type = group.state.value, group.protocol_type or ""
        stable = group.state is GroupState.STABLE
        protocol = (group.protocol_name or "") if stable else ""
        members = tuple(
            nested(
                request,
                "DescribedGroupMember",
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata(group.protocol_name) if stable else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
    return nested(
        request,
        "DescribedGroup",
        error_code=code,
        error_message=None,
        group_id=group_id,
        group_state=state if code is ErrorCode.none else "",
        protocol_type=protocol_type,
        protocol_data=protocol,
        members=members,
        authorized_operations=NO_OPERATIONS,
    )


async def describe_groups(session: Session, request: Request) -> Any:
    coordinator = coordinator_of(session.control)
    described = []
    for group_id in request.body.groups:
        code = await refusal(session, group_id, Operation.DESCRIBE)
        group = coordinator.find(group_id) if code is None else None
        described.append(_described(request, group_id, code or ErrorCode.none, group))
    return answer(request, throttle_time=timedelta(0), groups=tuple(described))


SERVED: Final = (
    (8, "OffsetCommit", 2, 8, group_offsets.offset_commit),
    (9, "OffsetFetch", 1, 8, group_offsets.offset_fetch),
    (10, "FindCoordinator", 0, 4, find_coordinator),
    (11, "JoinGroup", 0, 9, join_group),
    (12, "Heartbeat", 0, 4, heartbeat),
    (13, "LeaveGroup", 0, 5, leave_group),
    (14, "SyncGroup", 0, 5, sync_group),
    (15, "DescribeGroups", 0, 5, describe_groups),
    (16, "ListGroups", 0, 4, list_groups),
)
"""(api key, name, min version, max version, handler): ``apis.py`` serves each."""
