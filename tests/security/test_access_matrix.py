"""Every RPC of every service, for every kind of caller, against real ``tidelog serve`` processes.

The RPCs are read from the services' descriptors (as ``tests/api/test_guard.py`` does), so a new
RPC without a request here fails :func:`test_every_rpc_has_a_request`. The callers, and what a
client really sees (a refused TLS handshake is grpc's ``UNAVAILABLE``, "failed to connect to all
addresses", before any call reaches the server):

=================================  ====================  =====================================
caller                             server                what it sees
=================================  ====================  =====================================
no credentials                     mutual TLS            the handshake refused (UNAVAILABLE)
no credentials                     TLS, tokens, ACL      UNAUTHENTICATED "requires credentials"
no credentials                     plaintext, ACL        UNAUTHENTICATED "requires credentials"
certificate from another CA        mutual TLS            the handshake refused (UNAVAILABLE)
expired certificate (right CA)     mutual TLS            the handshake refused (UNAVAILABLE)
valid, granted nothing (mallory)   mutual TLS            PERMISSION_DENIED naming the operation
                                                         and the resource, never the policy
valid and granted (alice)          mutual TLS            neither of those: the servicer ran
=================================  ====================  =====================================

A denial changes nothing: before and after each denied call, the data directory's files and
what a super-user sees (streams, offsets, pause and read-only flags, the cursor, groups, sites,
views) are the same. Health answers every caller that reaches the server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.security.pki import ACL_TEXT, Pki, make_pki, secure_channel, write_config
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import cluster_pb2, tidelog_pb2
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.api.guard import RPC_ACCESS
from tidelog.security.tokens import add_token
from tidelog.wire.columns import pack

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Rpc:
    name: str
    request_class: Any
    streamed_in: bool
    streamed_out: bool


def every_rpc() -> dict[str, Rpc]:
    """Every RPC of proto.API, tidelog.v1.Tidelog, Replication and ClusterAdmin."""
    found = {}
    for module in (pb, tidelog_pb2, cluster_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                name = f"/{service.full_name}/{method.name}"
                cls = message_factory.GetMessageClass(method.input_type)
                found[name] = Rpc(name, cls, method.client_streaming, method.server_streaming)
    return found


RPCS = every_rpc()


@dataclass(frozen=True)
class Target:
    """The resources the requests name: ``stream`` (and its cursor, view, group) exists before
    the calls; ``new_*`` do not."""

    stream: str = "alice.s"
    new_stream: str = "alice.new"
    group: str = "alice.g"
    cursor: str = "alice.c"
    view: str = "v"
    new_view: str = "w"
    site: str = "east"
    new_site: str = "west"
    follower: str = "b2"
    """The broker a ReplicaFetch (or ReplicaStream) claims to be: served only in the caller's own
    name."""


LOCAL_SITE = "home"


def requests(t: Target) -> dict[str, Any]:
    """A minimal valid request (a streaming call's one frame) per RPC, naming ``t``'s resources:
    each would change something if it were served."""
    one = pack([b"x"])
    return {
        "/proto.API/CreateStream": pb.CreateStreamRequest(name=t.new_stream, subject=t.new_stream),
        "/proto.API/DeleteStream": pb.DeleteStreamRequest(name=t.stream),
        "/proto.API/PauseStream": pb.PauseStreamRequest(name=t.stream, partitions=[0]),
        "/proto.API/SetStreamReadonly": pb.SetStreamReadonlyRequest(
            name=t.stream, partitions=[0], readonly=True
        ),
        "/proto.API/Subscribe": pb.SubscribeRequest(stream=t.stream),
        "/proto.API/FetchMetadata": pb.FetchMetadataRequest(streams=[t.stream]),
        "/proto.API/FetchPartitionMetadata": pb.FetchPartitionMetadataRequest(stream=t.stream),
        "/proto.API/Publish": pb.PublishRequest(stream=t.stream, value=b"x"),
        "/proto.API/PublishAsync": pb.PublishRequest(stream=t.stream, value=b"x"),
        "/proto.API/PublishToSubject": pb.PublishToSubjectRequest(subject=t.stream, value=b"x"),
        "/proto.API/SetCursor": pb.SetCursorRequest(stream=t.stream, cursorId=t.cursor, offset=2),
        "/proto.API/FetchCursor": pb.FetchCursorRequest(stream=t.stream, cursorId=t.cursor),
        "/proto.API/JoinConsumerGroup": pb.JoinConsumerGroupRequest(
            groupId=t.group, consumerId="c1", streams=[t.stream]
        ),
        "/proto.API/LeaveConsumerGroup": pb.LeaveConsumerGroupRequest(
            groupId=t.group, consumerId="c1"
        ),
        "/proto.API/FetchConsumerGroupAssignments": pb.FetchConsumerGroupAssignmentsRequest(
            groupId=t.group, consumerId="c1"
        ),
        "/proto.API/ReportConsumerGroupCoordinator": pb.ReportConsumerGroupCoordinatorRequest(
            groupId=t.group, consumerId="c1", coordinator="b1"
        ),
        "/tidelog.v1.Tidelog/PublishBatch": v1.PublishBatchRequest(stream=t.stream, messages=one),
        "/tidelog.v1.Tidelog/PublishStream": v1.PublishBatchRequest(stream=t.stream, messages=one),
        "/tidelog.v1.Tidelog/SubscribeBatches": v1.SubscribeBatchesRequest(stream=t.stream),
        "/tidelog.v1.Tidelog/Consume": v1.ConsumeRequest(start=v1.ConsumeStart(stream=t.stream)),
        "/tidelog.v1.Tidelog/Browse": v1.BrowseRequest(stream=t.stream, limit=1),
        "/tidelog.v1.Tidelog/DeclareView": v1.DeclareViewRequest(
            stream=t.stream, view=v1.ViewSpec(name=t.new_view)
        ),
        "/tidelog.v1.Tidelog/DropView": v1.DropViewRequest(stream=t.stream, name=t.view),
        "/tidelog.v1.Tidelog/ListViews": v1.ListViewsRequest(stream=t.stream),
        "/tidelog.v1.Tidelog/ViewGet": v1.ViewGetRequest(stream=t.stream, view=t.view, key=b"k"),
        "/tidelog.v1.Tidelog/ViewRange": v1.ViewRangeRequest(stream=t.stream, view=t.view),
        "/tidelog.v1.Tidelog/WindowFetch": v1.WindowFetchRequest(
            stream=t.stream, view=t.view, key=b"k"
        ),
        "/tidelog.v1.Tidelog/AddSite": v1.AddSiteRequest(site_id=t.new_site, address="127.0.0.1:1"),
        "/tidelog.v1.Tidelog/RemoveSite": v1.RemoveSiteRequest(site_id=t.site),
        "/tidelog.v1.Tidelog/ListSites": v1.ListSitesRequest(),
        "/tidelog.v1.Tidelog/Transmit": v1.TransmitRequest(
            client_name="c", entries=[v1.TransmitEntry(payload=b"x", destinations=[t.site])]
        ),
        "/tidelog.v1.Tidelog/SiteStatus": v1.SiteStatusRequest(),
        "/tidelog.v1.Tidelog/Replicate": v1.ReplicationRequest(
            hello=v1.ReplicationHello(source_site=t.site, sink_site=LOCAL_SITE)
        ),
        "/tidelog.v1.Tidelog/TransmitSnapshot": v1.TransmitSnapshotRequest(
            site_id=t.site, snapshot=1, begin=True
        ),
        "/tidelog.v1.Tidelog/ResyncSite": v1.ResyncSiteRequest(site_id=t.site),
        "/tidelog.v1.Tidelog/DescribeStream": v1.DescribeStreamRequest(stream=t.stream),
        "/tidelog.v1.Tidelog/ListGroups": v1.ListGroupsRequest(),
        "/tidelog.v1.Replication/ReplicaFetch": cluster_pb2.ReplicaFetchRequest(
            stream=t.stream, follower=t.follower
        ),
        "/tidelog.v1.Replication/ReplicaStream": cluster_pb2.ReplicaFetchRequest(
            stream=t.stream, follower=t.follower
        ),
        "/tidelog.v1.Replication/OffsetForLeaderEpoch": cluster_pb2.OffsetForLeaderEpochRequest(
            stream=t.stream
        ),
        "/tidelog.v1.ClusterAdmin/ClusterStatus": cluster_pb2.ClusterStatusRequest(),
        "/tidelog.v1.ClusterAdmin/Reassign": cluster_pb2.ReassignRequest(
            stream=t.stream, replicas=["b1"]
        ),
    }


LISTINGS = frozenset({"/tidelog.v1.Tidelog/ListGroups"})
"""Open to every identified caller, the answer filtered (tidelog.access): never refused."""


def refusal(channel: grpc.Channel, rpc: Rpc, request: Any) -> grpc.RpcError | None:
    """Make the call (a streaming call: its one frame, then its first answer, if any, before
    it is cancelled); the error it ended with, None when it was answered."""
    serialize = type(request).SerializeToString
    try:
        if rpc.streamed_in or rpc.streamed_out:
            responses = (
                channel.stream_stream(rpc.name, serialize, None)(
                    iter([request]), timeout=CALL_TIMEOUT_S
                )
                if rpc.streamed_in
                else channel.unary_stream(rpc.name, serialize, None)(
                    request, timeout=CALL_TIMEOUT_S
                )
            )
            try:
                next(responses, None)
            finally:
                responses.cancel()
        else:
            channel.unary_unary(rpc.name, serialize, None)(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        return error
    return None


# -- the servers -----------------------------------------------------------------------------------


@dataclass
class Servers:
    pki: Pki
    mtls: ServerProcess
    """mutual TLS, the ACL, site "home" with a remote site "east"."""
    tokens: ServerProcess
    """TLS without client certificates, tokens and the ACL."""
    plaintext: ServerProcess
    """no TLS, the ACL."""
    alice_token: str
    admin_token: str

    def admin(self) -> grpc.Channel:
        return secure_channel(self.mtls.address, self.pki.ca.cert, self.pki.admin)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("matrix")
    pki = make_pki(root / "pki")
    acl = root / "acl.toml"
    acl.write_text(ACL_TEXT, encoding="utf-8")
    tokens_file = root / "tokens.toml"
    alice_token = add_token(tokens_file, "alice")
    admin_token = add_token(tokens_file, "admin")
    tls = {"tls_cert": pki.server.cert, "tls_key": pki.server.key, "acl_file": acl}
    configs = {
        "mtls": write_config(
            root / "mtls.toml",
            **tls,
            tls_client_ca=pki.ca.cert,
            site_id=LOCAL_SITE,
            sites={"east": "127.0.0.1:1"},
        ),
        "tokens": write_config(root / "tokens-server.toml", **tls, tokens_file=tokens_file),
        "plaintext": write_config(root / "plain.toml", acl_file=acl),
    }
    started: dict[str, ServerProcess] = {}
    try:
        for name, config in configs.items():
            started[name] = ServerProcess(root / f"data-{name}", "--config", str(config)).start()
        found = Servers(
            pki,
            started["mtls"],
            started["tokens"],
            started["plaintext"],
            alice_token,
            admin_token,
        )
        prepare(found)
        yield found
    finally:
        for process in started.values():
            process.kill()


def prepare(servers: Servers) -> None:
    """As the super-user: alice's stream with three messages, her cursor at 1 and a view."""
    t = Target()
    with servers.admin() as channel:
        api = pb_grpc.APIStub(channel)
        api.CreateStream(pb.CreateStreamRequest(name=t.stream, subject=t.stream))
        for _ in range(3):
            api.Publish(pb.PublishRequest(stream=t.stream, value=b"m"))
        api.SetCursor(pb.SetCursorRequest(stream=t.stream, cursorId=t.cursor, offset=1))
        v1_grpc.TidelogStub(channel).DeclareView(
            v1.DeclareViewRequest(stream=t.stream, view=v1.ViewSpec(name=t.view))
        )
    with secure_channel(
        servers.tokens.address, servers.pki.ca.cert, token=servers.admin_token
    ) as channel:
        pb_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(name=t.stream, subject="s"))


def state(servers: Servers) -> dict[str, object]:
    """What a denied call must not change: the data directory's files and what the super-user
    sees of streams, the cursor, groups, sites and views."""
    t = Target()
    files = {}
    for directory, _dirs, names in os.walk(servers.mtls.data_dir):
        for name in names:
            if name == "LOG" or name.startswith("LOG.old"):
                continue  # a view store's own diagnostics, written on its own schedule
            path = Path(directory, name)
            files[str(path.relative_to(servers.mtls.data_dir))] = path.stat().st_size
    with servers.admin() as channel:
        api, tide = pb_grpc.APIStub(channel), v1_grpc.TidelogStub(channel)
        metadata = api.FetchMetadata(pb.FetchMetadataRequest())
        streams = sorted(
            (s.name, p.id, p.newestOffset, p.paused, p.readonly)
            for s in metadata.streamMetadata
            for p in s.partitions.values()
        )
        cursor = api.FetchCursor(pb.FetchCursorRequest(stream=t.stream, cursorId=t.cursor)).offset
        groups = sorted(
            (g.group_id, tuple(sorted(m.consumer_id for m in g.members)))
            for g in tide.ListGroups(v1.ListGroupsRequest()).groups
        )
        sites = sorted(s.site_id for s in tide.ListSites(v1.ListSitesRequest()).sites)
        views = sorted(
            v.spec.name for v in tide.ListViews(v1.ListViewsRequest(stream=t.stream)).views
        )
    return {
        "files": files,
        "streams": streams,
        "cursor": cursor,
        "groups": groups,
        "sites": sites,
        "views": views,
    }


# -- the matrix ------------------------------------------------------------------------------------


def test_every_rpc_has_a_request() -> None:
    assert len(RPCS) > 40, "the walk found too few RPCs"
    assert set(requests(Target())) == set(RPCS)
    assert set(RPCS) <= set(RPC_ACCESS)


def assert_handshake_refused(error: grpc.RpcError | None) -> None:
    """What grpc reports when the server refuses the TLS handshake: the call never started."""
    assert error is not None, "the call was served"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert "failed to connect to all addresses" in (error.details() or ""), error.details()


Handshake = Callable[[Servers], grpc.Channel]

HANDSHAKE_REFUSED: dict[str, Handshake] = {
    "no certificate": lambda s: secure_channel(s.mtls.address, s.pki.ca.cert),
    "another CA": lambda s: secure_channel(s.mtls.address, s.pki.ca.cert, s.pki.stranger),
    "expired": lambda s: secure_channel(s.mtls.address, s.pki.ca.cert, s.pki.expired),
}


@pytest.mark.parametrize("caller", sorted(HANDSHAKE_REFUSED))
def test_a_refused_handshake_reaches_no_rpc(servers: Servers, caller: str) -> None:
    before = state(servers)
    with HANDSHAKE_REFUSED[caller](servers) as channel:
        for name, request in requests(Target()).items():
            assert_handshake_refused(refusal(channel, RPCS[name], request))
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        assert_handshake_refused(raised.value)
    assert state(servers) == before


@pytest.mark.parametrize("server", ["tokens", "plaintext"])
def test_no_credentials_is_unauthenticated_on_every_rpc(servers: Servers, server: str) -> None:
    if server == "tokens":
        channel = secure_channel(servers.tokens.address, servers.pki.ca.cert)
    else:
        channel = grpc.insecure_channel(servers.plaintext.address)
    with channel:
        for name, request in requests(Target()).items():
            error = refusal(channel, RPCS[name], request)
            assert error is not None, f"{name} served a caller without credentials"
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (name, error)
            assert "requires credentials" in (error.details() or ""), (name, error.details())
        # Health stays open: a load balancer's probe has no credentials.
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


POLICY_WORDS = ("rule", "acl", "writers", "super", "deny", "allow", "toml", "group:")


@pytest.mark.parametrize("method", sorted(RPCS))
def test_a_caller_granted_nothing_is_denied_and_nothing_changes(
    servers: Servers, method: str
) -> None:
    request = requests(Target())[method]
    before = state(servers)
    with secure_channel(servers.mtls.address, servers.pki.ca.cert, servers.pki.mallory) as channel:
        error = refusal(channel, RPCS[method], request)
    after = state(servers)
    assert after == before, f"{method} denied, yet something changed"
    if method in LISTINGS:
        assert error is None or error.code() not in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ), error
        return
    assert error is not None, f"{method} served mallory"
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
    details = error.details() or ""
    assert details.startswith("mallory may not "), details
    touched = RPC_ACCESS[method](request)
    assert any(str(access) in details for access in touched), (details, touched)
    for word in POLICY_WORDS:
        assert word not in details.lower(), f"the refusal tells about the policy: {details}"


ALLOWED = Target(
    stream="alice.s",
    new_stream="alice.made",
    group="alice.g",
    cursor="alice.c",
    view="v",
    new_view="w",
    site="east",
    new_site="west",
    follower="alice",
)

ORDERED = sorted(
    RPCS, key=lambda m: m.endswith(("DeleteStream", "SetStreamReadonly", "RemoveSite"))
)
"""The allowed calls, those that would stop the others' (deleting or freezing alice's stream,
removing the site "east" whose replication is tried) last."""


@pytest.mark.parametrize("method", ORDERED)
def test_a_granted_caller_is_served(servers: Servers, method: str) -> None:
    request = requests(ALLOWED)[method]
    # A site's entries are taken only from that site's own certificate (docs/security.md).
    who = servers.pki.east if method.endswith("/Replicate") else servers.pki.alice
    with secure_channel(servers.mtls.address, servers.pki.ca.cert, who) as channel:
        error = refusal(channel, RPCS[method], request)
    if error is not None:
        assert error.code() not in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.INTERNAL,
        ), (method, error.code(), error.details())


def test_health_answers_a_caller_granted_nothing(servers: Servers) -> None:
    with secure_channel(servers.mtls.address, servers.pki.ca.cert, servers.pki.mallory) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# -- tokens ----------------------------------------------------------------------------------------


def test_a_token_over_tls_is_its_principal(servers: Servers) -> None:
    t = Target()
    address, ca = servers.tokens.address, servers.pki.ca.cert
    with secure_channel(address, ca, token=servers.alice_token) as channel:
        api = pb_grpc.APIStub(channel)
        api.Publish(pb.PublishRequest(stream=t.stream, value=b"from alice"))
        with pytest.raises(grpc.RpcError) as refused:
            api.CreateStream(pb.CreateStreamRequest(name="bobs", subject="bobs"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "alice may not create on stream 'bobs'"


def test_an_unknown_token_is_unauthenticated(servers: Servers) -> None:
    address, ca = servers.tokens.address, servers.pki.ca.cert
    with (
        secure_channel(address, ca, token="tdl_nope") as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown token" in (refused.value.details() or "")


def test_a_token_on_plaintext_is_refused_with_the_reason(servers: Servers) -> None:
    # The client library refuses to send a token without TLS; a hand-made client can.
    with (
        grpc.insecure_channel(servers.plaintext.address) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.APIStub(channel).FetchMetadata(
            pb.FetchMetadataRequest(),
            metadata=[("authorization", f"Bearer {servers.admin_token}")],
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "refused on a plaintext connection" in (refused.value.details() or "")


# -- listings (last: it adds a group member) -------------------------------------------------------


def test_a_listing_shows_each_caller_only_what_it_may_see(servers: Servers) -> None:
    address, ca = servers.mtls.address, servers.pki.ca.cert
    with servers.admin() as channel:
        # alice.s may be gone (the granted caller's DeleteStream): a stream of this test's own
        api = pb_grpc.APIStub(channel)
        api.CreateStream(pb.CreateStreamRequest(name="alice.listed", subject="alice.listed"))
        api.JoinConsumerGroup(
            pb.JoinConsumerGroupRequest(
                groupId="alice.g", consumerId="c1", streams=["alice.listed"]
            )
        )
        every = {
            s.name
            for s in pb_grpc.APIStub(channel)
            .FetchMetadata(pb.FetchMetadataRequest())
            .streamMetadata
        }
    assert {"alice.listed", "__cursors"} <= every

    def listed(client: Any) -> tuple[set[str], set[str]]:
        with secure_channel(address, ca, client) as channel:
            metadata = pb_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest())
            groups = v1_grpc.TidelogStub(channel).ListGroups(v1.ListGroupsRequest()).groups
        return {s.name for s in metadata.streamMetadata}, {g.group_id for g in groups}

    assert listed(servers.pki.mallory) == (set(), set())
    streams, groups = listed(servers.pki.alice)
    assert streams == {s for s in every if s.startswith("alice.")}
    assert groups == {"alice.g"}
    assert listed(servers.pki.admin) == (every, {"alice.g"})
