"""The server's security put together (``tidelog.api.credentials``): a reload applies each file
that can be used and keeps, with one log line, what it had for each that cannot; a bind beyond
loopback says what it exposes, at start."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tidelog.access import Kind, Operation, on
from tidelog.api.credentials import ServerSecurity
from tidelog.api.server import Server
from tidelog.api.settings import ServerSettings
from tidelog.errors import Unauthenticated
from tidelog.security.testca import issue, make_ca
from tidelog.security.tokens import add_token

ALLOW_ALICE = """
[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["publish"]
resources = ["stream:orders"]
"""
PUBLISH = on(Operation.PUBLISH, Kind.STREAM, "orders")
TLS_CONTEXT = {"transport_security_type": [b"ssl"]}


def settings(tmp_path: Path, **given: object) -> ServerSettings:
    return ServerSettings(data_dir=tmp_path / "data", port=0, metrics_port=0, **given)  # type: ignore[arg-type]


def test_a_bad_acl_on_reload_keeps_the_policy_and_says_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(ALLOW_ALICE, encoding="utf-8")
    security = ServerSecurity(settings(tmp_path, acl_file=acl))
    assert security.door.guard.policy.allows("alice", PUBLISH)
    acl.write_text(ALLOW_ALICE.replace('"publish"', '"publsh"'), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="tidelog.security"):
        assert security.reload() == []
    assert security.door.guard.policy.allows("alice", PUBLISH), "the old policy was dropped"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "the ACL kept as it was" in line
    assert f"{acl}: rule 1: unknown operation 'publsh'" in line
    assert "\n" not in line
    # Fixed, the next reload applies it.
    acl.write_text(ALLOW_ALICE.replace("orders", "payments"), encoding="utf-8")
    assert security.reload() == ["ACL"]
    assert not security.door.guard.policy.allows("alice", PUBLISH)


def test_each_part_of_a_reload_stands_alone(tmp_path: Path) -> None:
    """A bad tokens file keeps the old tokens while a good ACL and certificate are applied."""
    ca = make_ca(tmp_path / "pki")
    server = issue(ca, tmp_path / "pki", "server")
    acl = tmp_path / "acl.toml"
    acl.write_text(ALLOW_ALICE, encoding="utf-8")
    tokens = tmp_path / "tokens.toml"
    token = add_token(tokens, "alice")
    security = ServerSecurity(
        settings(
            tmp_path, tls_cert=server.cert, tls_key=server.key, acl_file=acl, tokens_file=tokens
        )
    )
    metadata = [("authorization", f"Bearer {token}")]
    assert security.door.authenticator.identify(TLS_CONTEXT, metadata) == "alice"
    tokens.write_text("[tokens]\nalice = 'plain-secret'\n", encoding="utf-8")
    acl.write_text(ALLOW_ALICE.replace("orders", "payments"), encoding="utf-8")
    issue(ca, tmp_path / "pki", "server")
    assert security.reload() == ["certificates", "ACL"]
    assert security.door.authenticator.identify(TLS_CONTEXT, metadata) == "alice"
    assert not security.door.guard.policy.allows("alice", PUBLISH)
    tokens.unlink()
    add_token(tokens, "bob")
    assert security.reload() == ["certificates", "tokens", "ACL"]
    with pytest.raises(Unauthenticated, match="unknown token"):
        security.door.authenticator.identify(TLS_CONTEXT, metadata)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.7", "localhost", "::1", "[::1]"])
def test_loopback_exposes_nothing(tmp_path: Path, host: str) -> None:
    assert ServerSecurity(settings(tmp_path)).exposure_warnings(host) == []


def test_what_a_bind_beyond_loopback_exposes(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "pki")
    server = issue(ca, tmp_path / "pki", "server")
    tls = {"tls_cert": server.cert, "tls_key": server.key}
    acl = tmp_path / "acl.toml"
    acl.write_text(ALLOW_ALICE, encoding="utf-8")
    tokens = tmp_path / "tokens.toml"
    add_token(tokens, "alice")

    def warnings(**given: object) -> str:
        return "\n".join(ServerSecurity(settings(tmp_path, **given)).exposure_warnings("0.0.0.0"))

    bare = warnings()
    assert "listening on 0.0.0.0 without TLS" in bare
    assert "without an ACL: anyone who reaches the port may read" in bare
    assert warnings(**tls, acl_file=acl) == ""
    assert warnings(**tls, acl_file=acl, tls_client_ca=ca.cert) == ""
    assert warnings(**tls, acl_file=acl, allow_anonymous=True).count("admitting anonymous") == 1
    mutual = warnings(**tls, tls_client_ca=ca.cert)
    assert "without TLS" not in mutual
    assert "every client with a certificate from tls_client_ca may read" in mutual
    assert "every holder of a token may read" in warnings(**tls, tokens_file=tokens)
    anonymous = warnings(**tls, tokens_file=tokens, allow_anonymous=True)
    assert "anyone who reaches the port may read" in anonymous
    assert warnings(acl_file=acl).count("without TLS") == 1
    for host in ("::", "", "192.0.2.10", "example.com"):
        assert ServerSecurity(settings(tmp_path)).exposure_warnings(host), host


def test_a_server_bound_to_every_interface_logs_what_it_exposes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The one test that binds beyond loopback, as the warning is about that bind: port 0, no
    # metrics port, stopped at once.
    async def scenario() -> None:
        server = Server(settings(tmp_path, host="0.0.0.0"))
        with caplog.at_level(logging.WARNING, logger="tidelog.server"):
            await server.start()
            await server.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    logged = [r.getMessage() for r in caplog.records if r.name == "tidelog.server"]
    assert any(m.startswith("listening on 0.0.0.0 without TLS: every message") for m in logged)
    assert any("without an ACL: anyone who reaches the port" in m for m in logged), logged
