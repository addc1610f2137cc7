"""SIGHUP on a real ``tidelog serve``: a new certificate and a new ACL apply without a restart,
a broken ACL is refused with one clear line and the policy stays, and clients connected
throughout keep working."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.security.pki import make_pki, secure_channel, served_certificate, write_config
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.security.testca import issue

pytestmark = pytest.mark.slow

ACL = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["alice"]
operations = [{operations}]
resources = ["stream:alice.*"]
"""


def acl(*operations: str) -> str:
    return ACL.format(operations=", ".join(f'"{o}"' for o in operations))


def wait_for_line(process: ServerProcess, text: str, after: int, timeout_s: float = 20) -> str:
    """The first stderr line from index ``after`` on that contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in process.stderr_lines[after:]:
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the server's log:\n" + "".join(process.stderr_lines))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "acl.toml").write_text(acl("publish", "subscribe"), encoding="utf-8")
    config = write_config(
        tmp_path / "serve.toml",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        acl_file=tmp_path / "acl.toml",
    )
    process = ServerProcess(tmp_path / "data", "--config", str(config))
    process.pki = pki  # type: ignore[attr-defined]
    try:
        yield process.start()
    finally:
        process.kill()


def test_sighup_reloads_the_certificate_and_the_acl(tmp_path: Path, server: ServerProcess) -> None:
    pki = server.pki  # type: ignore[attr-defined]
    address, ca = server.address, pki.ca.cert
    with (
        secure_channel(address, ca, pki.admin) as admin_channel,
        secure_channel(address, ca, pki.alice) as alice_channel,
    ):
        admin, alice = pb_grpc.APIStub(admin_channel), pb_grpc.APIStub(alice_channel)
        admin.CreateStream(pb.CreateStreamRequest(name="alice.s", subject="alice.s"))
        alice.Publish(pb.PublishRequest(stream="alice.s", value=b"before"))
        tail = alice.Subscribe(
            pb.SubscribeRequest(stream="alice.s", startPosition=pb.StartPosition.EARLIEST),
            timeout=60,
        )
        next(tail)  # Liftbridge's empty first message: the subscription is live
        assert next(tail).value == b"before"
        first = served_certificate(address, ca, pki.alice)

        # A new certificate from the same CA over the same files; alice may no longer publish.
        issue(pki.ca, pki.server.cert.parent, "server")
        (tmp_path / "acl.toml").write_text(acl("subscribe"), encoding="utf-8")
        seen = len(server.stderr_lines)
        os.kill(server.pid, signal.SIGHUP)
        wait_for_line(server, "reload: certificates, ACL", seen)

        renewed = served_certificate(address, ca, pki.alice)
        assert renewed.serial_number != first.serial_number
        with secure_channel(address, ca, pki.alice) as fresh:
            pb_grpc.APIStub(fresh).FetchMetadata(pb.FetchMetadataRequest(streams=["alice.s"]))
        with pytest.raises(grpc.RpcError) as refused:
            alice.Publish(pb.PublishRequest(stream="alice.s", value=b"after"))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == "alice may not publish on stream 'alice.s'"

        # Connections opened before the reload keep working: the subscription, the admin.
        admin.Publish(pb.PublishRequest(stream="alice.s", value=b"by admin"))
        assert next(tail).value == b"by admin"

        # A broken ACL: one line naming the file and the problem, the policy as it was.
        (tmp_path / "acl.toml").write_text(acl("subscribe", "publsh"), encoding="utf-8")
        seen = len(server.stderr_lines)
        os.kill(server.pid, signal.SIGHUP)
        line = wait_for_line(server, "the ACL kept as it was", seen)
        assert f"{tmp_path / 'acl.toml'}: rule 1: unknown operation 'publsh'" in line
        wait_for_line(server, "reload: certificates", seen)
        with pytest.raises(grpc.RpcError) as still:
            alice.Publish(pb.PublishRequest(stream="alice.s", value=b"again"))
        assert still.value.code() == grpc.StatusCode.PERMISSION_DENIED
        alice.FetchMetadata(pb.FetchMetadataRequest(streams=["alice.s"]))
        admin.Publish(pb.PublishRequest(stream="alice.s", value=b"still here"))
        assert next(tail).value == b"still here"
        tail.cancel()
    assert server.process is not None and server.process.poll() is None, "the server stopped"
