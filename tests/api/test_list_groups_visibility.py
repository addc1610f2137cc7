"""``ListGroups`` shows, of a group the caller may see, only the streams it may see: their names
in the members' stream lists and their partition assignments (``api/describe_service.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.access import Access, Caller, Guard, Kind, Operation, serving
from tidelog.api.describe_service import DescribeService
from tidelog.broker.groups import Group, GroupMember


class SeesOnlyPublic:
    """alice may see group g and stream ``public``; nothing else."""

    def allows(self, identity: str, access: Access) -> bool:
        resource = access.resource
        return (
            identity == "alice"
            and access.operation is Operation.DESCRIBE
            and (resource.kind, resource.name) in {(Kind.GROUP, "g"), (Kind.STREAM, "public")}
        )


class Groups:
    def __init__(self, groups: Mapping[str, Group]) -> None:
        self.groups = groups

    def local_groups(self) -> Mapping[str, Group]:
        return self.groups


def test_a_visible_group_hides_the_streams_the_caller_may_not_see() -> None:
    group = Group(
        "g",
        epoch=3,
        members={"c1": GroupMember("c1", ["public", "secret"], last_seen=0.0)},
        assignments={"c1": {"public": [0, 1], "secret": [0]}},
    )
    hidden = Group("h", epoch=1, members={"c2": GroupMember("c2", ["public"], last_seen=0.0)})
    service: Any = DescribeService()
    service.control = Groups({"g": group, "h": hidden})

    async def body() -> v1.ListGroupsResponse:
        serving(Caller("alice", Guard(SeesOnlyPublic())))
        answer: v1.ListGroupsResponse = await service.ListGroups(v1.ListGroupsRequest(), None)
        return answer

    answer = asyncio.run(body())
    assert [g.group_id for g in answer.groups] == ["g"]
    (shown,) = answer.groups
    assert [list(m.streams) for m in shown.members] == [["public"]]
    assert [(a.stream, list(a.partitions)) for a in shown.assignments] == [("public", [0, 1])]
    assert "secret" not in str(answer)
