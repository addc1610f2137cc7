"""A reload reaches the calls already open: a subscription or a publish stream whose caller the
new ACL or tokens no longer allow ends at once with the refusal (``open_calls.py``), while the
calls still allowed go on."""

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

GRANTED = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["alice", "bob"]
operations = ["publish", "subscribe"]
resources = ["stream:s"]
"""

REVOKED = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["bob"]
operations = ["publish", "subscribe"]
resources = ["stream:s"]
"""


def test_a_reload_ends_the_open_calls_it_revokes_and_keeps_the_others(tmp_path: Path) -> None:
    served = token_server(tmp_path, GRANTED, ("alice", "bob", "admin"))
    settings, acl, tokens = served.settings, served.acl, served.tokens_file
    alice, bob, admin = (served.tokens[who] for who in ("alice", "bob", "admin"))

    def channel(address: str, token: str) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, channel_credentials(served.ca, token=token))

    async def scenario() -> None:
        server = Server(settings)
        await server.start()
        address = f"127.0.0.1:{server.port}"
        try:
            async with channel(address, admin) as root:
                await pb_grpc.APIStub(root).CreateStream(
                    pb.CreateStreamRequest(name="s", subject="s")
                )
            async with channel(address, alice) as as_alice, channel(address, bob) as as_bob:
                alices = pb_grpc.APIStub(as_alice).Subscribe(
                    pb.SubscribeRequest(stream="s", startPosition=pb.StartPosition.LATEST)
                )
                bobs = pb_grpc.APIStub(as_bob).Subscribe(
                    pb.SubscribeRequest(stream="s", startPosition=pb.StartPosition.LATEST)
                )
                # Liftbridge's first (empty) message says the subscription is set up.
                await alices.read()
                await bobs.read()
                outgoing: asyncio.Queue[pb.PublishRequest | None] = asyncio.Queue()

                async def frames():  # type: ignore[no-untyped-def]
                    while (frame := await outgoing.get()) is not None:
                        yield frame

                publishing = pb_grpc.APIStub(as_alice).PublishAsync(frames())
                await outgoing.put(
                    pb.PublishRequest(stream="s", value=b"before", correlationId="1")
                )
                assert (await publishing.read()).correlationId == "1"

                acl.write_text(REVOKED)
                assert "ACL" in server.reload()

                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    while True:  # "before" may come first; then the end
                        await asyncio.wait_for(alices.read(), 10)
                assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "alice may not subscribe on stream 's'" in (ended.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as stopped:
                    await outgoing.put(
                        pb.PublishRequest(stream="s", value=b"after", correlationId="2")
                    )
                    await asyncio.wait_for(publishing.read(), 10)
                assert stopped.value.code() == grpc.StatusCode.PERMISSION_DENIED

                # Bob's subscription, still allowed, goes on and gets what is published now.
                async with channel(address, admin) as root:
                    await pb_grpc.APIStub(root).Publish(pb.PublishRequest(stream="s", value=b"x"))
                got = [(await asyncio.wait_for(bobs.read(), 10)).value for _ in range(2)]
                assert got == [b"before", b"x"]

                # A revoked token ends bob's open call too: UNAUTHENTICATED.
                tokens.write_text(
                    "\n".join(
                        line for line in tokens.read_text().splitlines() if '"bob"' not in line
                    )
                    + "\n"
                )
                assert "tokens" in server.reload()
                with pytest.raises(grpc.aio.AioRpcError) as unknown:
                    while True:
                        await asyncio.wait_for(bobs.read(), 10)
                assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
                await outgoing.put(None)
        finally:
            await server.stop()

    asyncio.run(scenario())
