"""Sites trust sites by certificate (docs/security.md, "Sites trust sites"), against real servers:
each test is an attack that worked before, and what stops it now."""

from __future__ import annotations

import http.server
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import ClientError, ClientSettings
from tidelog.process import free_port
from tidelog.security import ClientTls, channel_credentials
from tidelog.security.testca import Issued, issue, make_ca
from tidelog.wire import SNAPSHOT_REQUESTS

FAR: int = 10**12
"""A forged position far ahead of anything the source gave."""

ACL = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["a", "b", "c", "evil"]
operations = ["replicate"]
resources = ["site:*"]
"""


class Pki:
    """A test CA and a certificate per name (its first SAN is the name)."""

    def __init__(self, directory: Path, names: tuple[str, ...]) -> None:
        self.directory = directory
        self.ca = make_ca(directory)
        self.certs: dict[str, Issued] = {name: issue(self.ca, directory, name) for name in names}
        self.acl = directory / "acl.toml"
        self.acl.write_text(ACL)

    def config(self, name: str, site_id: str, sites: dict[str, str], *, cert: str = "") -> Path:
        """A server's settings: mutual TLS with ``cert``'s certificate (default: ``name``'s)."""
        issued = self.certs[cert or name]
        lines = [
            f'site_id = "{site_id}"',
            f'tls_cert = "{issued.cert}"',
            f'tls_key = "{issued.key}"',
            f'tls_client_ca = "{self.ca.cert}"',
            f'tls_ca = "{self.ca.cert}"',
            f'acl_file = "{self.acl}"',
            "[sites]",
            *(f'{k} = "{v}"' for k, v in sites.items()),
        ]
        path = self.directory / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def tls(self, name: str) -> ClientTls:
        issued = self.certs[name]
        return ClientTls(ca=self.ca.cert, cert=issued.cert, key=issued.key)

    def client(self, address: str, name: str = "admin") -> tidelog.Client:
        return tidelog.Client(address, settings=ClientSettings(tls=self.tls(name)))

    def stub(self, address: str, name: str) -> tuple[grpc.Channel, v1_grpc.TidelogStub]:
        issued = self.certs[name]
        credentials = channel_credentials(self.ca.cert, issued.cert, issued.key)
        channel = grpc.secure_channel(address, credentials)
        return channel, v1_grpc.TidelogStub(channel)


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.1)


def received(client: tidelog.Client, client_name: str, source: str) -> list[tidelog.Message]:
    stream = f"__lrq_recv.{client_name}.{source}"
    if stream not in {s.name for s in client.list_streams()}:
        return []
    return list(client.subscribe(stream, start="earliest", stop="latest"))


def replicate(stub: v1_grpc.TidelogStub, *frames: v1.ReplicationRequest) -> list[object]:
    """A Replicate call sending ``frames``; the replies (raises the call's failure)."""
    return list(stub.Replicate(iter(frames), timeout=10))


def hello(source: str, sink: str) -> v1.ReplicationRequest:
    return v1.ReplicationRequest(hello=v1.ReplicationHello(source_site=source, sink_site=sink))


def deltas(prev: int, position: int, payload: bytes) -> v1.ReplicationRequest:
    entry = v1.RoutedEntry(position=position, client_name="orders", payload=payload)
    return v1.ReplicationRequest(deltas=v1.DeltaBatch(prev=prev, current=position, entries=[entry]))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki", ("a", "b", "c", "evil", "admin"))


@pytest.fixture
def two_sites(pki: Pki, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Sites a and b over mutual TLS, each declared on the other (b first)."""
    with served(tmp_path / "b", "--config", str(pki.config("b", "b", {}))) as b:
        config_a = pki.config("a", "a", {"b": b.address})
        with served(tmp_path / "a", "--config", str(config_a)) as a:
            with pki.client(b.address) as client:
                client.add_site("a", a.address)
            yield a, b


def test_replicate_is_accepted_only_from_the_declared_site_its_certificate_names(
    pki: Pki, two_sites: tuple[ServerProcess, ServerProcess]
) -> None:
    """Site c's certificate (granted replicate, as every site is) claims to be a: before, b
    applied its entries and its empty snapshot as a's, and handed them to b's application."""
    a, b = two_sites
    channel, forger = pki.stub(b.address, "c")
    details = []
    with channel:
        for frames in (
            (hello("a", "b"), deltas(-1, 5, b"forged")),
            (  # an empty snapshot: "drop everything a sent you"
                hello("a", "b"),
                v1.ReplicationRequest(snapshot=v1.SnapshotBatch(snapshot=1 << 40, start=True)),
                v1.ReplicationRequest(snapshot=v1.SnapshotBatch(snapshot=1 << 40, end=True)),
            ),
            (hello("c", "b"), deltas(-1, 5, b"undeclared")),  # its own name, not declared on b
        ):
            with pytest.raises(grpc.RpcError) as refused:
                replicate(forger, *frames)
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            details.append(refused.value.details() or "")
    assert "'c' may not replicate as site 'a'" in details[0]
    assert "site 'c' is not declared on site 'b'" in details[2]
    # The real a, over mutual TLS with its own certificate, gets through.
    with pki.client(a.address) as client:
        client.transmit("orders", b"real", ["b"])
    with pki.client(b.address) as client:
        wait_for(lambda: bool(received(client, "orders", "a")), what="a's entry at b")
        values = [m.value for m in received(client, "orders", "a")]
        kinds = [m.headers.get("__kind") for m in received(client, "orders", "a")]
    assert values == [b"real"]
    assert b"snapshot_start" not in kinds, "a forged snapshot told b's application to drop a's"


def test_a_site_removed_while_its_stream_is_open_sends_no_more(
    pki: Pki, two_sites: tuple[ServerProcess, ServerProcess]
) -> None:
    _a, b = two_sites
    frames: queue.Queue[v1.ReplicationRequest | None] = queue.Queue()
    frames.put(hello("a", "b"))
    channel, stub = pki.stub(b.address, "a")
    with channel:
        replies = stub.Replicate(iter(frames.get, None), timeout=20)
        progress = next(replies)
        assert progress.HasField("progress")
        with pki.client(b.address) as client:
            client.remove_site("a")
        frames.put(deltas(progress.progress.last_processed, (1 << 30) + 5, b"after removal"))
        with pytest.raises(grpc.RpcError) as refused:
            next(replies)
        frames.put(None)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pki.client(b.address) as client:
        assert b"after removal" not in [m.value for m in received(client, "orders", "a")]


def test_a_site_redirected_to_an_address_whose_certificate_is_not_that_site_gets_nothing(
    pki: Pki, two_sites: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    """RemoveSite b, AddSite b at an address that serves site id b with another certificate,
    ResyncSite b: before, the source's state went to whoever listened there. The sender checks
    that the server's certificate names site b."""
    a, b = two_sites
    with pki.client(a.address) as client:
        client.transmit("orders", b"before", ["b"])
    with pki.client(b.address) as client:  # over mutual TLS, to the certificate named b
        wait_for(lambda: bool(received(client, "orders", "a")), what="a's entry at b")
    config = pki.config("evil", "b", {"a": a.address})
    with served(tmp_path / "evil", "--config", str(config)) as evil:
        with pki.client(a.address) as client:
            client.remove_site("b")
            client.add_site("b", evil.address)
            assert client.resync_site("b") is True
            client.transmit("orders", b"secret", ["b"])
            time.sleep(2.0)
            (status,) = client.site_status()
        with pki.client(evil.address) as client:
            assert received(client, "orders", "a") == []
        assert status.reason.startswith("unreachable"), status.reason
        assert not status.caught_up


def test_site_management_needs_the_site_permission(
    pki: Pki, two_sites: tuple[ServerProcess, ServerProcess]
) -> None:
    """A site's own certificate may replicate, not declare, remove or resync sites, nor answer a
    snapshot request; and a snapshot is accepted only while one is asked for."""
    a, _b = two_sites
    with pki.client(a.address, "c") as client:
        for call in (
            lambda: client.add_site("x", "127.0.0.1:1"),
            lambda: client.remove_site("b"),
            lambda: client.resync_site("b"),
            lambda: client.transmit_snapshot("b", 1, [("orders", b"forged")], begin=True),
        ):
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    with pki.client(a.address) as client, pytest.raises(ClientError) as refused:
        client.transmit_snapshot("b", 12345, [("orders", b"forged")], begin=True)
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION


def test_a_forged_position_far_ahead_is_refused_and_the_source_goes_on(tmp_path: Path) -> None:
    """Without TLS nothing says who calls (unprotected, documented), but one entry forged at
    position 10^12 no longer makes b drop every entry a sends after it."""
    with (
        served(tmp_path / "b", "--site-id", "b") as b,
        served(tmp_path / "a", "--site-id", "a") as a,
        tidelog.Client(a.address) as client_a,
        tidelog.Client(b.address) as client_b,
    ):
        client_b.add_site("a", a.address)
        client_a.add_site("b", b.address)
        client_a.transmit("orders", b"first", ["b"])
        wait_for(lambda: len(received(client_b, "orders", "a")) == 1, what="first")
        last = int.from_bytes(received(client_b, "orders", "a")[-1].headers["__position"])
        with grpc.insecure_channel(b.address) as channel:
            forger = v1_grpc.TidelogStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                replicate(forger, hello("a", "b"), deltas(last, FAR, b"forged"))
        assert refused.value.code() is grpc.StatusCode.OUT_OF_RANGE
        assert "nothing applied" in (refused.value.details() or "")
        client_a.transmit("orders", b"second", ["b"])
        wait_for(
            lambda: b"second" in [m.value for m in received(client_b, "orders", "a")],
            timeout_s=20,
            what="a's entry after the forged one",
        )
        assert [m.value for m in received(client_b, "orders", "a")] == [
            b"first",
            b"second",
        ]
        (status,) = client_a.site_status()
        assert status.acked < FAR
    assert any("replicates without TLS" in line for line in b.stderr_lines), "warned at start"


def test_resyncs_asked_while_one_is_under_way_start_none(tmp_path: Path) -> None:
    """30 ResyncSite calls asked the application for its whole state 30 times; now the first
    starts a snapshot sync and the others say one is under way."""
    with (
        served(tmp_path / "b", "--site-id", "b") as b,
        served(tmp_path / "a", "--site-id", "a") as a,
        tidelog.Client(a.address) as client,
    ):
        client.add_site("b", b.address)
        wait_for(lambda: client.site_status()[0].state == "log_entry_sync", what="sync")
        started = [client.resync_site("b") for _ in range(30)]
        time.sleep(1.0)
        requests = list(client.subscribe(SNAPSHOT_REQUESTS, start="earliest", stop="latest"))
    assert started == [True] + [False] * 29
    assert len(requests) == 1


def test_add_site_is_capped_and_checks_its_address(tmp_path: Path) -> None:
    config = tmp_path / "a.toml"
    config.write_text('site_id = "a"\nsites_max_declared = 3\n')
    with served(tmp_path / "a", "--config", str(config)) as a, tidelog.Client(a.address) as client:
        for bad in ("evil/x:80", "h..x:1", "host:0", "[::1:80"):
            with pytest.raises(ClientError) as refused:
                client.add_site("x", bad)
            assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        for n in range(3):
            client.add_site(f"s{n}", f"127.0.0.1:{9400 + n}")
        with pytest.raises(ClientError) as refused:
            client.add_site("s3", "127.0.0.1:9403")
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "sites_max_declared" in str(refused.value)
        assert len(client.list_sites()[1]) == 3


class _Http(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_site_status_does_not_tell_what_listens_at_an_address(tmp_path: Path) -> None:
    """Declared at a closed port, a raw TCP listener, an HTTP/1 server and a gRPC server that is
    no site: before, each status said which it was (a port scanner). Now one 'unreachable'."""
    raw = socket.socket()
    raw.bind(("127.0.0.1", 0))
    raw.listen()
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    serving = threading.Thread(target=web.serve_forever, daemon=True)
    serving.start()
    try:
        config = tmp_path / "a.toml"
        config.write_text('site_id = "a"\nsites_ack_timeout_s = 1.0\n')
        with (
            served(tmp_path / "plain") as plain,
            served(tmp_path / "a", "--config", str(config)) as a,
        ):
            targets = {
                "closed": f"127.0.0.1:{free_port()}",
                "tcp": f"127.0.0.1:{raw.getsockname()[1]}",
                "http": f"127.0.0.1:{web.server_address[1]}",
                "grpc": plain.address,
            }
            with tidelog.Client(a.address) as client:
                for site, address in targets.items():
                    client.add_site(site, address)
                wait_for(
                    lambda: all(s.reason.startswith("unreachable") for s in client.site_status()),
                    timeout_s=15,
                    what="every site's status to say why it is not syncing",
                )
                states = {s.site_id: s for s in client.site_status()}
    finally:
        web.shutdown()
        web.server_close()
        raw.close()
    assert set(states) == set(targets), "only declared sites are answered for"
    reasons = {s.reason.replace(targets[site], "ADDRESS") for site, s in states.items()}
    assert len(reasons) == 1, reasons
    assert next(iter(reasons)).startswith("unreachable")
