"""What the server owns on a principal's behalf, attacked through a real server with TLS, mutual
TLS and an ACL (docs/security.md, "Identities the server owns"): alice and mallory are both
allowed to publish to ``s`` and to use group ``g``; mallory tries to use what alice owns there.
Each attack is refused with PERMISSION_DENIED and leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.server import Server
from tidelog.api.settings import load_settings
from tidelog.security import ClientTls
from tidelog.security.testca import issue, make_ca
from tidelog.security.tls import aio_channel

HUGE = 1 << 62

ACL = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["alice", "mallory"]
operations = ["publish", "subscribe", "group"]
resources = ["stream:s", "group:g"]

[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["*"]
resources = ["stream:a", "group:private", "cursor:*"]

[[rule]]
effect = "allow"
principals = ["mallory"]
operations = ["*"]
resources = ["stream:m", "cursor:*"]
"""


@dataclass
class Caller:
    api: pb_grpc.APIStub
    v1: v1_grpc.TidelogStub


@dataclass
class Secured:
    server: Server
    admin: Caller
    alice: Caller
    mallory: Caller


Scenario = Callable[[Secured], Awaitable[None]]


@contextlib.asynccontextmanager
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    pki = tmp_path / "pki"
    ca = make_ca(pki)
    server_cert = issue(ca, pki, "server")
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    settings = load_settings(
        data_dir=tmp_path / "data",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_client_ca=ca.cert,
        acl_file=acl,
    )
    server = Server(settings)
    await server.start()
    channels: list[grpc.aio.Channel] = []

    def caller(name: str) -> Caller:
        issued = issue(ca, pki, name)
        tls = ClientTls(ca=ca.cert, cert=issued.cert, key=issued.key)
        channel = aio_channel(f"127.0.0.1:{server.port}", tls, [])
        channels.append(channel)
        return Caller(pb_grpc.APIStub(channel), v1_grpc.TidelogStub(channel))

    try:
        yield Secured(server, caller("admin"), caller("alice"), caller("mallory"))
    finally:
        for channel in channels:
            await channel.close()
        await server.stop()


def run(tmp_path: Path, scenario: Scenario) -> None:
    async def main() -> None:
        async with secured(tmp_path) as served:
            for name in ("s", "a", "m"):
                await served.admin.api.CreateStream(
                    pb.CreateStreamRequest(name=name, subject=name, partitions=2)
                )
            await scenario(served)

    asyncio.run(main())


async def denied(call: Awaitable[Any], says: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    assert says in (refused.value.details() or "")


def batch(value: bytes, producer: str, sequence: int) -> v1.PublishBatchRequest:
    return v1.PublishBatchRequest(
        stream="s",
        messages=v1.Messages(values=value, value_sizes=len(value).to_bytes(4, "little")),
        producer_id=producer,
        producer_sequence=sequence,
        ack_policy=v1.ACK_POLICY_LEADER,
    )


def test_a_producer_id_cannot_be_hijacked_by_another_principal(tmp_path: Path) -> None:
    """Without owners, mallory's batch with sequence 2^62 under alice's id was stored and
    every later batch of alice's came back ``duplicate``, nothing stored."""

    async def scenario(s: Secured) -> None:
        first = await s.alice.v1.PublishBatch(batch(b"a0", "alice-producer", 0))
        assert (first.count, first.duplicate) == (1, False)
        await denied(
            s.mallory.v1.PublishBatch(batch(b"evil", "alice-producer", HUGE)),
            "belongs to another principal",
        )
        second = await s.alice.v1.PublishBatch(batch(b"a1", "alice-producer", 1))
        assert (second.first_offset, second.count, second.duplicate) == (1, 1, False)
        partition = s.server.broker.stream("s").partitions[0]
        assert partition.newest_offset == 1, "mallory's batch was stored"

    run(tmp_path, scenario)


async def join(who: Caller, consumer: str, group: str = "g") -> pb.JoinConsumerGroupResponse:
    response: pb.JoinConsumerGroupResponse = await who.api.JoinConsumerGroup(
        pb.JoinConsumerGroupRequest(groupId=group, consumerId=consumer, streams=["s"])
    )
    return response


def test_a_group_member_cannot_be_kicked_joined_as_or_polled_by_another(tmp_path: Path) -> None:
    async def scenario(s: Secured) -> None:
        epoch = (await join(s.alice, "alice-1")).epoch
        says = "belongs to another principal"
        await denied(
            s.mallory.api.LeaveConsumerGroup(
                pb.LeaveConsumerGroupRequest(groupId="g", consumerId="alice-1")
            ),
            says,
        )
        await denied(join(s.mallory, "alice-1"), says)
        await denied(
            s.mallory.api.FetchConsumerGroupAssignments(
                pb.FetchConsumerGroupAssignmentsRequest(
                    groupId="g", consumerId="alice-1", epoch=epoch
                )
            ),
            says,
        )
        await denied(
            s.mallory.api.ReportConsumerGroupCoordinator(
                pb.ReportConsumerGroupCoordinatorRequest(
                    groupId="g", consumerId="alice-1", coordinator="", epoch=epoch
                )
            ),
            says,
        )
        group = s.server.broker.groups.groups["g"]
        assert (group.epoch, set(group.members)) == (epoch, {"alice-1"})
        mine = await s.alice.api.FetchConsumerGroupAssignments(
            pb.FetchConsumerGroupAssignmentsRequest(groupId="g", consumerId="alice-1", epoch=epoch)
        )
        assert [(a.stream, list(a.partitions)) for a in mine.assignments] == [("s", [0, 1])]

    run(tmp_path, scenario)


def test_a_group_members_partition_cannot_be_taken_over(tmp_path: Path) -> None:
    """A group subscription as alice's member with epoch 2^62 fenced alice's subscriber, and
    every later one of hers (an older epoch) was refused."""

    def subscribe(who: Caller, consumer: str, epoch: int) -> Any:
        return who.api.Subscribe(
            pb.SubscribeRequest(
                stream="s",
                partition=0,
                startPosition=pb.EARLIEST,
                consumer=pb.Consumer(groupId="g", consumerId=consumer, groupEpoch=epoch),
            )
        )

    async def scenario(s: Secured) -> None:
        epoch = (await join(s.alice, "alice-1")).epoch
        alices = subscribe(s.alice, "alice-1", epoch)
        await alices.read()  # the handshake: subscribed
        await denied(subscribe(s.mallory, "alice-1", HUGE).read(), "belongs to another")
        await s.admin.v1.PublishBatch(
            v1.PublishBatchRequest(
                stream="s",
                messages=v1.Messages(values=b"x", value_sizes=(1).to_bytes(4, "little")),
            )
        )
        message = await asyncio.wait_for(alices.read(), 10)
        assert message.value == b"x", "alice's subscriber was fenced"
        alices.cancel()

    run(tmp_path, scenario)


def test_a_groups_positions_are_written_only_by_a_principal_allowed_on_the_group(
    tmp_path: Path,
) -> None:
    """mallory may use every cursor (``cursor:*``), but the positions of alice's group
    (``__group:private``) are the group's: without ``group`` on it she may not move them."""

    async def scenario(s: Secured) -> None:
        position = "__group:private"
        await s.alice.api.SetCursor(
            pb.SetCursorRequest(stream="s", partition=0, cursorId=position, offset=7)
        )
        await denied(
            s.mallory.api.SetCursor(
                pb.SetCursorRequest(stream="s", partition=0, cursorId=position, offset=HUGE)
            ),
            "group on group 'private'",
        )
        await denied(
            s.mallory.api.FetchCursor(
                pb.FetchCursorRequest(stream="s", partition=0, cursorId=position)
            ),
            "group on group 'private'",
        )
        kept = await s.alice.api.FetchCursor(
            pb.FetchCursorRequest(stream="s", partition=0, cursorId=position)
        )
        assert kept.offset == 7

    run(tmp_path, scenario)


def test_listings_show_only_what_the_caller_may_see(tmp_path: Path) -> None:
    async def scenario(s: Secured) -> None:
        await join(s.alice, "alice-1", group="private")
        await join(s.alice, "alice-2")
        await s.alice.api.SetCursor(  # creates __cursors
            pb.SetCursorRequest(stream="a", partition=0, cursorId="c", offset=1)
        )
        seen = await s.mallory.api.FetchMetadata(pb.FetchMetadataRequest())
        assert sorted(m.name for m in seen.streamMetadata) == ["m", "s"]
        groups = await s.mallory.v1.ListGroups(v1.ListGroupsRequest())
        assert [g.group_id for g in groups.groups] == ["g"]
        everything = await s.admin.api.FetchMetadata(pb.FetchMetadataRequest())
        assert {"__cursors", "a", "m", "s"} <= {m.name for m in everything.streamMetadata}
        all_groups = await s.admin.v1.ListGroups(v1.ListGroupsRequest())
        assert [g.group_id for g in all_groups.groups] == ["g", "private"]

    run(tmp_path, scenario)
