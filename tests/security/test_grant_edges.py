"""Grants a request implies beyond its stream: a stream joining a subject others listen on reads
their traffic (``subscribe`` on the subject), resuming a paused partition undoes an ``alter``,
and reading as a group's member acts in the group (``group``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tests.security.pki import token_server

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.api.server import Server
from tidelog.security import channel_credentials

ACL = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["mallory"]
operations = ["create", "subscribe", "publish"]
resources = ["stream:*"]
"""


def test_what_a_stream_group_or_resume_implies_is_asked(tmp_path: Path) -> None:
    served = token_server(tmp_path, ACL, ("admin", "mallory"))
    settings, ca = served.settings, served.ca
    admin, mallory = served.tokens["admin"], served.tokens["mallory"]

    async def refused(call: object) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call  # type: ignore[misc]
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        return caught.value

    async def scenario() -> None:
        server = Server(settings)
        await server.start()
        address = f"127.0.0.1:{server.port}"
        as_admin = grpc.aio.secure_channel(address, channel_credentials(ca, token=admin))
        as_mallory = grpc.aio.secure_channel(address, channel_credentials(ca, token=mallory))
        try:
            root, api = pb_grpc.APIStub(as_admin), pb_grpc.APIStub(as_mallory)
            await root.CreateStream(
                pb.CreateStreamRequest(name="payroll-archive", subject="payroll")
            )
            # A stream named like the subject, or on its numbered form, would take its traffic.
            for name in ("payroll", "payroll.1"):
                error = await refused(api.CreateStream(pb.CreateStreamRequest(name=name)))
                assert f"subscribe on subject {name!r}" in (error.details() or "")
            # A subject nobody listens on needs nothing more than create.
            await api.CreateStream(pb.CreateStreamRequest(name="mine"))
            await root.PublishToSubject(pb.PublishToSubjectRequest(subject="payroll", value=b"$"))
            metadata = await root.FetchMetadata(pb.FetchMetadataRequest())
            names = {s.name for s in metadata.streamMetadata}
            assert names - {"__cursors"} == {"payroll-archive", "mine"}

            # Resuming a paused partition is an alter.
            await root.PauseStream(pb.PauseStreamRequest(name="mine"))
            subscribe = api.Subscribe(pb.SubscribeRequest(stream="mine", resume=True))
            error = await refused(subscribe.read())
            assert "alter on stream 'mine'" in (error.details() or "")

            # Reading as a group's member is acting in the group.
            await root.CreateStream(pb.CreateStreamRequest(name="jobs"))
            join = await root.JoinConsumerGroup(
                pb.JoinConsumerGroupRequest(groupId="workers", consumerId="w1", streams=["jobs"])
            )
            member = pb.Consumer(groupId="workers", groupEpoch=join.epoch, consumerId="w1")
            subscribe = api.Subscribe(pb.SubscribeRequest(stream="jobs", consumer=member))
            error = await refused(subscribe.read())
            assert "group on group 'workers'" in (error.details() or "")
        finally:
            await as_admin.close()
            await as_mallory.close()
            await server.stop()

    asyncio.run(scenario())
