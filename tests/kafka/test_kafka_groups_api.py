"""The group apis' handlers over a real broker, in-process: every answer is encoded as its
version's response (so a field a version lacks, or a null where it may not be, fails here), the
offsets land in the cursor store as tidelog reads them, and the ACL and the members' owners are
enforced."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from tests.broker.brokertools import broker_config

from tidelog.access import ANY, Access, Guard, Kind, Operation
from tidelog.broker import Broker, StreamConfig
from tidelog.control import Advertised, SingleBroker
from tidelog.kafka import groups
from tidelog.kafka.protocol import Request, build, encode_response, schema_module
from tidelog.kafka.session import KafkaConfig, Session, node_id
from tidelog.security import Authenticator

T = TypeVar("T")
HANDLERS = {entry[0]: entry[4] for entry in groups.SERVED}
FIND, JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST = 10, 11, 12, 13, 14, 15, 16
COMMIT, FETCH = 8, 9
_correlation = itertools.count(1)


class Grants:
    """A policy of exact grants: (identity, operation, kind, name), ``*`` for any name; any
    grant on a resource lets its holder describe it."""

    def __init__(self, *grants: tuple[str, Operation, Kind, str]) -> None:
        self.grants = set(grants)

    def allows(self, identity: str, access: Access) -> bool:
        kind, name = access.resource.kind, access.resource.name
        for who, operation, granted_kind, granted in self.grants:
            if who != identity or granted_kind is not kind or granted not in (ANY, name):
                continue
            if operation is access.operation or access.operation is Operation.DESCRIBE:
                return True
        return False


class Gate:
    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.authenticator = Authenticator()


class Server:
    """A broker with a 3-partition stream ``t`` and a session per principal."""

    def __init__(self, broker: Broker, control: SingleBroker, guard: Guard) -> None:
        self.broker = broker
        self.control = control
        self.guard = guard

    def session(self, identity: str = "alice") -> Session:
        return Session(
            self.control,
            KafkaConfig(),
            Gate(self.guard),
            "127.0.0.1:40000",
            ("127.0.0.1", 9092),
            identity=identity,
            authenticated=True,
        )


def run(scenario: Callable[[Server], Coroutine[Any, Any, T]], tmp_path: Path, **kw: Any) -> T:
    async def main() -> T:
        broker = Broker(broker_config(tmp_path))
        await broker.start()
        control = SingleBroker(broker, Advertised(broker.broker_id, "127.0.0.1", 1))
        await control.create_stream("t", StreamConfig(partitions=3), 1, 1)
        try:
            return await scenario(Server(broker, control, kw.get("guard", Guard())))
        finally:
            control.broker.drain()
            await broker.close()

    return asyncio.run(asyncio.wait_for(main(), 30))


def body(api_key: int, version: int, **fields: Any) -> Any:
    """The request of that api and version from ``fields`` (those it lacks left out)."""
    module = schema_module(api_key, version, EntityType.request)
    cls = next(
        v
        for k, v in vars(module).items()
        if k.endswith("Request") and getattr(v, "__type__", None) is EntityType.request
    )
    return build(cls, **fields)


def part(api_key: int, version: int, cls: str, /, **fields: Any) -> Any:
    return build(getattr(schema_module(api_key, version, EntityType.request), cls), **fields)


async def call(session: Session, api_key: int, version: int, **fields: Any) -> Any:
    """The handler's answer to that request; encoded as a check that its version can carry it."""
    request = Request(
        api_key, version, next(_correlation), "test-client", body(api_key, version, **fields)
    )
    answer = await HANDLERS[api_key](session, request)
    encode_response(request, answer)
    return answer


def protocols(version: int, metadata: bytes = b"meta") -> tuple[Any, ...]:
    return (part(JOIN, version, "JoinGroupRequestProtocol", name="range", metadata=metadata),)


async def join(
    session: Session, group: str, version: int = 9, member_id: str = "", **more: Any
) -> Any:
    return await call(
        session,
        JOIN,
        version,
        group_id=group,
        session_timeout=timedelta(seconds=10),
        rebalance_timeout=timedelta(seconds=10),
        member_id=member_id,
        protocol_type="consumer",
        protocols=protocols(version),
        **more,
    )


async def member(session: Session, group: str, version: int = 9) -> tuple[str, int]:
    """A lone member of a Stable ``group``: (member id, generation)."""
    first = await join(session, group, version)
    member_id = first.member_id
    if version >= 4:
        assert first.error_code is ErrorCode.member_id_required
        first = await join(session, group, version, member_id)
    assert first.error_code is ErrorCode.none and first.leader == member_id
    synced = await call(
        session,
        SYNC,
        5,
        group_id=group,
        generation_id=first.generation_id,
        member_id=member_id,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(
            part(SYNC, 5, "SyncGroupRequestAssignment", member_id=member_id, assignment=b"A"),
        ),
    )
    assert synced.error_code is ErrorCode.none and synced.assignment == b"A"
    return member_id, first.generation_id


async def commit(
    session: Session, group: str, offsets: dict[int, int], *, version: int = 8,
    member_id: str = "", generation: int = -1, topic: str = "t",
) -> dict[int, ErrorCode]:  # fmt: skip
    answer = await call(
        session,
        COMMIT,
        version,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        retention_time=timedelta(milliseconds=-1),
        topics=(
            part(
                COMMIT,
                version,
                "OffsetCommitRequestTopic",
                name=topic,
                partitions=tuple(
                    part(
                        COMMIT,
                        version,
                        "OffsetCommitRequestPartition",
                        partition_index=p,
                        committed_offset=o,
                        committed_leader_epoch=-1,
                        committed_metadata="kept?",
                    )
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    return {p.partition_index: p.error_code for p in answer.topics[0].partitions}


async def fetched(
    session: Session, group: str, partitions: tuple[int, ...] | None, version: int = 7
) -> Any:
    topics = (
        None
        if partitions is None
        else (
            part(FETCH, version, "OffsetFetchRequestTopic", name="t", partition_indexes=partitions),
        )
    )
    return await call(session, FETCH, version, group_id=group, topics=topics, require_stable=False)


# -- FindCoordinator ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_names_this_broker(tmp_path: Path, version: int) -> None:
    async def scenario(server: Server) -> None:
        answer = await call(server.session(), FIND, version, key="g", key_type=0)
        assert answer.error_code is ErrorCode.none
        assert (answer.node_id, answer.host, answer.port) == (
            node_id(server.control.broker_id), "127.0.0.1", 9092,
        )  # fmt: skip

    run(scenario, tmp_path)


def test_find_coordinator_v4_answers_each_key_and_refuses_transactions(tmp_path: Path) -> None:
    guard = Guard(
        Grants(
            ("alice", Operation.GROUP, Kind.GROUP, "mine"),
            ("alice", Operation.DESCRIBE, Kind.GROUP, "watched"),
        )
    )

    async def scenario(server: Server) -> None:
        answer = await call(
            server.session(),
            FIND,
            4,
            key_type=0,
            coordinator_keys=("mine", "watched", "theirs", ""),
        )
        codes = {c.key: c.error_code for c in answer.coordinators}
        assert codes == {
            "mine": ErrorCode.none,
            "watched": ErrorCode.none,  # describing is enough to find it
            "theirs": ErrorCode.group_authorization_failed,
            "": ErrorCode.invalid_group_id,
        }
        txn = await call(server.session(), FIND, 4, key_type=1, coordinator_keys=("tx",))
        assert txn.coordinators[0].error_code is ErrorCode.unsupported_version
        assert txn.coordinators[0].node_id == -1

    run(scenario, tmp_path, guard=guard)


# -- membership -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 4, 5, 7, 9])
def test_a_member_joins_and_syncs_at_every_version(tmp_path: Path, version: int) -> None:
    async def scenario(server: Server) -> None:
        member_id, generation = await member(server.session(), "g", version)
        assert generation == 1 and member_id.startswith("test-client-")
        beat = await call(server.session(), HEARTBEAT, min(version, 4), group_id="g",
                          generation_id=generation, member_id=member_id)  # fmt: skip
        assert beat.error_code is ErrorCode.none

    run(scenario, tmp_path)


def test_a_refused_join_encodes_at_old_and_new_versions(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        for version in (0, 6, 7, 9):
            answer = await join(server.session(), "", version)
            assert answer.error_code is ErrorCode.invalid_group_id
            assert answer.protocol_name == ("" if version < 7 else None)

    run(scenario, tmp_path)


def test_a_member_belongs_to_the_principal_that_joined(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        member_id, generation = await member(server.session("alice"), "g")
        for who, expected in (("bob", ErrorCode.unknown_member_id), ("alice", ErrorCode.none)):
            beat = await call(server.session(who), HEARTBEAT, 4, group_id="g",
                              generation_id=generation, member_id=member_id)  # fmt: skip
            assert beat.error_code is expected
        codes = await commit(server.session("bob"), "g", {0: 5}, member_id=member_id, generation=1)
        assert codes == {0: ErrorCode.unknown_member_id}
        left = await call(server.session("bob"), LEAVE, 0, group_id="g", member_id=member_id)
        assert left.error_code is ErrorCode.unknown_member_id

    run(scenario, tmp_path)


def test_a_tidelog_groups_id_is_not_joined_through_kafka(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        await server.control.join_group("native", "c1", ["t"], principal="alice")
        answer = await join(server.session(), "native")
        assert answer.error_code is ErrorCode.inconsistent_group_protocol
        assert (await join(server.session(), "other")).error_code is ErrorCode.member_id_required

    run(scenario, tmp_path)


def test_leave_group_v3_answers_each_member(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        session = server.session()
        member_id, _ = await member(session, "g")
        answer = await call(
            session, LEAVE, 5, group_id="g",
            members=(
                part(LEAVE, 5, "MemberIdentity", member_id=member_id, group_instance_id=None,
                     reason="bye"),
                part(LEAVE, 5, "MemberIdentity", member_id="nobody", group_instance_id=None,
                     reason=None),
            ),
        )  # fmt: skip
        assert answer.error_code is ErrorCode.none
        assert [(m.member_id, m.error_code) for m in answer.members] == [
            (member_id, ErrorCode.none), ("nobody", ErrorCode.unknown_member_id),
        ]  # fmt: skip
        old = await call(session, LEAVE, 1, group_id="g", member_id=member_id)
        assert old.error_code is ErrorCode.unknown_member_id

    run(scenario, tmp_path)


def test_list_and_describe_show_only_what_the_caller_may_see(tmp_path: Path) -> None:
    guard = Guard(
        Grants(
            ("alice", Operation.GROUP, Kind.GROUP, ANY),
            ("bob", Operation.GROUP, Kind.GROUP, "open"),
        )
    )

    async def scenario(server: Server) -> None:
        member_id, _ = await member(server.session("alice"), "open")
        await member(server.session("alice"), "closed")
        seen = await call(server.session("bob"), LIST, 4, states_filter=())
        assert [(g.group_id, g.group_state, g.protocol_type) for g in seen.groups] == [
            ("open", "Stable", "consumer")
        ]
        everything = await call(server.session("alice"), LIST, 0)
        assert [g.group_id for g in everything.groups] == ["closed", "open"]
        empty = await call(server.session("alice"), LIST, 4, states_filter=("empty",))
        assert empty.groups == ()
        described = await call(
            server.session("bob"), DESCRIBE, 5,
            groups=("open", "closed", "never"), include_authorized_operations=False,
        )  # fmt: skip
        by_id = {g.group_id: g for g in described.groups}
        assert by_id["closed"].error_code is ErrorCode.group_authorization_failed
        assert by_id["never"].error_code is ErrorCode.group_authorization_failed
        group = by_id["open"]
        assert (group.group_state, group.protocol_type, group.protocol_data) == (
            "Stable",
            "consumer",
            "range",
        )
        [only] = group.members
        assert (only.member_id, only.client_id, only.client_host) == (
            member_id,
            "test-client",
            "/127.0.0.1",
        )
        assert (only.member_metadata, only.member_assignment) == (b"meta", b"A")
        unknown = await call(server.session("alice"), DESCRIBE, 0, groups=("never",))
        assert unknown.groups[0].group_state == "Dead"

    run(scenario, tmp_path, guard=guard)


# -- offsets --------------------------------------------------------------------------------------


def test_committed_offsets_are_cursors_holding_the_last_offset_processed(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        session = server.session()
        member_id, generation = await member(session, "g")
        codes = await commit(session, "g", {0: 7, 1: 0}, member_id=member_id, generation=generation)
        assert codes == {0: ErrorCode.none, 1: ErrorCode.none}
        store = await server.control.cursors()
        # tidelog's reading of them: the last offset processed; -1 for "none yet"
        assert await store.fetch("__group:g", "t", 0) == 6
        assert await store.stored("__group:g", "t", 1) == -1
        assert await store.stored("__group:g", "t", 2) is None
        answer = await fetched(session, "g", (0, 1, 2))
        assert answer.error_code is ErrorCode.none
        assert [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
                for p in answer.topics[0].partitions] == [
            (0, 7, "", ErrorCode.none), (1, 0, "", ErrorCode.none), (2, -1, "", ErrorCode.none),
        ]  # fmt: skip
        every = await fetched(session, "g", None)
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in every.topics] == [("t", [(0, 7), (1, 0)])]  # fmt: skip

    run(scenario, tmp_path)


def test_commits_are_checked_against_the_group(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        session = server.session()
        assert await commit(session, "solo", {0: 3}) == {0: ErrorCode.none}  # no members: allowed
        assert await commit(session, "nobody", {0: 3}, generation=2) == {
            0: ErrorCode.illegal_generation
        }
        member_id, generation = await member(session, "g")
        assert await commit(session, "g", {0: 3}) == {0: ErrorCode.unknown_member_id}
        stale = await commit(session, "g", {0: 3}, member_id=member_id, generation=generation + 1)
        assert stale == {0: ErrorCode.illegal_generation}
        ok = await commit(session, "g", {0: 3, 9: 1, 1: -5}, member_id=member_id, generation=1)
        assert ok == {
            0: ErrorCode.none,
            9: ErrorCode.unknown_topic_or_partition,
            1: ErrorCode.invalid_request,
        }
        missing = await commit(session, "solo", {0: 1}, topic="nope")
        assert missing == {0: ErrorCode.unknown_topic_or_partition}
        for version in (2, 5, 7):
            assert await commit(session, "solo", {2: 9}, version=version) == {2: ErrorCode.none}

    run(scenario, tmp_path)


def test_offset_access_needs_the_group_and_each_topic(tmp_path: Path) -> None:
    guard = Guard(
        Grants(
            ("alice", Operation.GROUP, Kind.GROUP, "g"),
            ("alice", Operation.SUBSCRIBE, Kind.STREAM, "t"),
            ("carol", Operation.GROUP, Kind.GROUP, "g"),  # the group, no topic
        )
    )

    async def scenario(server: Server) -> None:
        await server.control.create_stream("u", StreamConfig(partitions=1), 1, 1)
        assert await commit(server.session("alice"), "g", {0: 4}) == {0: ErrorCode.none}
        assert await commit(server.session("alice"), "g", {0: 1}, topic="u") == {
            0: ErrorCode.topic_authorization_failed
        }
        assert await commit(server.session("bob"), "g", {0: 1}) == {
            0: ErrorCode.group_authorization_failed
        }
        refused = await fetched(server.session("bob"), "g", (0,))
        assert refused.error_code is ErrorCode.group_authorization_failed and refused.topics == ()
        old = await fetched(server.session("bob"), "g", (0,), version=1)
        assert old.topics[0].partitions[0].error_code is ErrorCode.group_authorization_failed
        blind = await fetched(server.session("carol"), "g", (0,))
        assert blind.topics[0].partitions[0].error_code is ErrorCode.topic_authorization_failed
        assert (await fetched(server.session("carol"), "g", None)).topics == ()
        seen = await fetched(server.session("alice"), "g", (0,))
        assert seen.topics[0].partitions[0].committed_offset == 4

    run(scenario, tmp_path, guard=guard)


def test_offset_fetch_v8_answers_several_groups(tmp_path: Path) -> None:
    async def scenario(server: Server) -> None:
        session = server.session()
        await commit(session, "a", {0: 1})
        await commit(session, "b", {1: 2})
        group = "OffsetFetchRequestGroup"
        topics = "OffsetFetchRequestTopics"
        answer = await call(
            session, FETCH, 8, require_stable=False,
            groups=(
                part(FETCH, 8, group, group_id="a",
                     topics=(part(FETCH, 8, topics, name="t", partition_indexes=(0,)),)),
                part(FETCH, 8, group, group_id="b", topics=None),
                part(FETCH, 8, group, group_id="", topics=None),
            ),
        )  # fmt: skip
        got = {
            g.group_id: (g.error_code, [(t.name, [(p.partition_index, p.committed_offset)
                                                   for p in t.partitions]) for t in g.topics])
            for g in answer.groups
        }  # fmt: skip
        assert got == {
            "a": (ErrorCode.none, [("t", [(0, 1)])]),
            "b": (ErrorCode.none, [("t", [(1, 2)])]),
            "": (ErrorCode.invalid_group_id, []),
        }

    run(scenario, tmp_path)
