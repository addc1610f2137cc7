"""The guard's tables name every call of every front, and the guard sits in front of each.

The RPCs are read from the services' descriptors (a new RPC in a .proto fails here until
``RPC_ACCESS`` says what it touches); the console's pages from its routes, its actions from its
action table. A policy that refuses is answered PERMISSION_DENIED by a real server, and a
not-leader refusal carries the leader in machine-readable trailing metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2
from starlette.routing import Route
from tests.broker.brokertools import broker_config

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import cluster_pb2, tidelog_pb2
from tidelog.access import Access, Guard, Kind, Operation, on
from tidelog.api.decoding import GuardedRegistry
from tidelog.api.guard import RPC_ACCESS, Door
from tidelog.api.liftbridge import LiftbridgeService
from tidelog.broker import Broker
from tidelog.console.app import ACTION_ACCESS, ACTIONS, PAGE_ACCESS, ConsoleConfig, create_app
from tidelog.control import Advertised, SingleBroker, forwarded
from tidelog.errors import NotLeader
from tidelog.wire import NOT_LEADER_KEY


def every_rpc() -> Iterator[tuple[str, Any]]:
    """(full method name, input message class) of every RPC the server registers."""
    for module in (pb, tidelog_pb2, cluster_pb2, health_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                cls = getattr(module, method.input_type.name, None)
                if cls is None:  # defined in another file: built from the descriptor
                    cls = message_factory.GetMessageClass(method.input_type)
                yield f"/{service.full_name}/{method.name}", cls


def test_every_rpc_of_every_service_is_in_the_access_table() -> None:
    methods = dict(every_rpc())
    assert len(methods) > 40, "the walk found too few RPCs"
    missing = sorted(set(methods) - set(RPC_ACCESS))
    assert not missing, f"RPCs the guard's table does not name: {missing}"
    stale = sorted(set(RPC_ACCESS) - set(methods))
    assert not stale, f"table entries for RPCs that no longer exist: {stale}"


@pytest.mark.parametrize("method", sorted(dict(every_rpc())))
def test_each_rule_reads_its_request(method: str) -> None:
    request = dict(every_rpc())[method]()
    found = RPC_ACCESS[method](request)
    assert isinstance(found, tuple)
    assert all(isinstance(a, Access) for a in found)


def test_the_rules_name_the_resource_the_request_names() -> None:
    assert RPC_ACCESS["/proto.API/DeleteStream"](pb.DeleteStreamRequest(name="orders")) == (
        on(Operation.DELETE, Kind.STREAM, "orders"),
    )
    assert RPC_ACCESS["/tidelog.v1.Tidelog/PublishBatch"](
        tidelog_pb2.PublishBatchRequest(stream="s")
    ) == (on(Operation.PUBLISH, Kind.STREAM, "s"),)
    assert RPC_ACCESS["/tidelog.v1.Replication/ReplicaFetch"](
        cluster_pb2.ReplicaFetchRequest(stream="s")
    ) == (on(Operation.CLUSTER, Kind.CLUSTER),)
    assert RPC_ACCESS["/tidelog.v1.Tidelog/Replicate"](tidelog_pb2.ReplicationRequest()) == (
        on(Operation.REPLICATE, Kind.SITE),
    )
    joined = RPC_ACCESS["/proto.API/JoinConsumerGroup"](
        pb.JoinConsumerGroupRequest(groupId="g", streams=["a", "b"])
    )
    assert on(Operation.SUBSCRIBE, Kind.STREAM, "b") in joined


def test_every_console_page_and_action_is_in_its_table() -> None:
    app = create_app(ConsoleConfig(server="127.0.0.1:1"))
    pages = {r.path for r in app.routes if isinstance(r, Route) and r.path != "/actions/{action}"}
    assert pages == set(PAGE_ACCESS), "console pages and PAGE_ACCESS differ"
    assert set(ACTIONS) == set(ACTION_ACCESS), "console actions and ACTION_ACCESS differ"
    form = {"stream": "s", "cursor": "c", "partition": "0", "offset": "1"}
    for name, rule in ACTION_ACCESS.items():
        assert rule(form), f"action {name} names nothing it touches"


class DenyDeletes:
    def allows(self, identity: str, access: Access) -> bool:
        return access.operation is not Operation.DELETE


def test_a_refusing_policy_is_answered_permission_denied_before_the_servicer_runs(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        broker = Broker(broker_config(tmp_path))
        await broker.start()
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        control = SingleBroker(broker, Advertised(broker.broker_id, "127.0.0.1", port))
        pb_grpc.add_APIServicer_to_server(
            LiftbridgeService(control), GuardedRegistry(server, door=Door(Guard(DenyDeletes())))
        )
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.APIStub(channel)
                await stub.CreateStream(pb.CreateStreamRequest(name="s", subject="s"))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.DeleteStream(pb.DeleteStreamRequest(name="s"))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "delete on stream 's'" in (refused.value.details() or "")
                assert broker.find_stream("s") is not None, "the servicer ran anyway"
        finally:
            await server.stop(None)
            await broker.close()

    asyncio.run(scenario())


class NotLeading(LiftbridgeService):
    async def FetchCursor(self, request: Any, context: Any) -> Any:
        raise NotLeader("s", 0, "127.0.0.1:9", leader_id="b2", leader_epoch=7)


def test_a_not_leader_refusal_names_the_leader_in_trailing_metadata(tmp_path: Path) -> None:
    """A forwarding broker learns that the broker it asked moved from the metadata, not from the
    status text (which is Liftbridge's, for its clients)."""

    async def scenario() -> None:
        broker = Broker(broker_config(tmp_path))
        await broker.start()
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        control = SingleBroker(broker, Advertised(broker.broker_id, "127.0.0.1", port))
        pb_grpc.add_APIServicer_to_server(NotLeading(control), GuardedRegistry(server))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.APIStub(channel).FetchCursor(pb.FetchCursorRequest())
                error = refused.value
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert dict(error.trailing_metadata() or ())[NOT_LEADER_KEY] == "b2"
                failure = forwarded(error)
                assert failure.moved and failure.code == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await server.stop(None)
            await broker.close()

    asyncio.run(scenario())
