"""The CLI's connection options against real servers: mutual TLS (certificates from
``tidelog.security.testca``), a bearer token over server TLS (made by ``tidelog token create``),
and a token toward a plaintext server, refused by the client before it sends it and by the
server if a client sends it anyway. A token is never printed back.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from tests.cli.clitools import Cli, Serve, clean_env, error_text, one_error_line, words
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.security.testca import Issued, issue, make_ca


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    alice: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    return Pki(ca, issue(ca, directory, "server"), issue(ca, directory, "alice"))


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    """``tidelog serve`` with the TLS flags: every client must present a certificate."""
    with served(
        tmp_path_factory.mktemp("mtls") / "data",
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tls-client-ca", str(pki.ca.cert)),
    ) as process:
        yield process


@dataclass(frozen=True)
class TokenServer:
    process: ServerProcess
    token: str
    created: subprocess.CompletedProcess[str]
    """``tidelog token create``, done: what it printed."""


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TokenServer]:
    """Server TLS (no client certificates) with a tokens file that ``tidelog token create``
    wrote: every caller needs the token."""
    directory = tmp_path_factory.mktemp("tokens")
    tokens = directory / "tokens.toml"
    created = Cli("")("token", "create", "bob", "--file", str(tokens), server=False)
    assert created.returncode == 0, created.stderr
    with served(
        directory / "data",
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tokens-file", str(tokens)),
    ) as process:
        yield TokenServer(process, created.stdout.strip(), created)


def _tls_args(pki: Pki, *, client_cert: bool = True) -> tuple[str, ...]:
    args = ("--tls-ca", str(pki.ca.cert))
    if client_cert:
        args += ("--tls-cert", str(pki.alice.cert), "--tls-key", str(pki.alice.key))
    return args


def test_the_cli_creates_publishes_and_reads_back_over_mutual_tls(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    cli = Cli(mtls_server.address)
    created = cli("stream", "create", "tls-flags", *_tls_args(pki))
    assert created.returncode == 0, created.stderr
    published = cli("publish", "tls-flags", "over tls", "--json", *_tls_args(pki))
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["offset"] == 0
    # The same credentials from the environment, as ClientSettings.from_env reads them.
    env = clean_env(
        TIDELOG_TLS_CA=str(pki.ca.cert),
        TIDELOG_TLS_CERT=str(pki.alice.cert),
        TIDELOG_TLS_KEY=str(pki.alice.key),
    )
    again = cli("publish", "tls-flags", "from the environment", env=env)
    assert again.returncode == 0, again.stderr
    read = cli("tail", "tls-flags", "--json", *_tls_args(pki))
    assert read.returncode == 0, read.stderr
    values = [json.loads(line)["value"] for line in read.stdout.splitlines()]
    assert values == ["over tls", "from the environment"]


def test_a_mutual_tls_server_refuses_a_client_without_a_certificate(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    cli = Cli(mtls_server.address)
    refused = cli("stream", "list", *_tls_args(pki, client_cert=False))
    assert refused.returncode == 1
    assert "cannot reach the tidelog server" in one_error_line(refused)
    plaintext = cli("stream", "list")
    assert plaintext.returncode == 1


def test_the_cli_with_a_token_over_tls(token_server: TokenServer, pki: Pki) -> None:
    token = token_server.token
    assert token.startswith("tdl_") and "\n" not in token
    assert token not in token_server.created.stderr
    cli = Cli(token_server.process.address)
    tls = _tls_args(pki, client_cert=False)
    created = cli("stream", "create", "by-token", *tls, "--token", token)
    assert created.returncode == 0, created.stderr
    env = clean_env(TIDELOG_TOKEN=token, TIDELOG_TLS_CA=str(pki.ca.cert))
    published = cli("publish", "by-token", "v", env=env)
    assert published.returncode == 0, published.stderr
    read = cli("tail", "by-token", "--json", env=env)
    assert [json.loads(line)["value"] for line in read.stdout.splitlines()] == ["v"]

    anonymous = cli("stream", "list", *tls)
    assert anonymous.returncode == 1
    assert "this server requires credentials" in error_text(anonymous)
    wrong = token[:-4] + "AAAA"
    unknown = cli("stream", "list", *tls, "--token", wrong)
    assert unknown.returncode == 1
    assert "unknown token" in error_text(unknown)
    for done in (created, published, read, anonymous, unknown):
        assert token not in done.stdout + done.stderr
        assert wrong not in done.stdout + done.stderr


def test_token_create_prints_the_token_once_and_keeps_its_hash(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    first = Cli("")("token", "create", "carol", "--file", str(tokens), server=False)
    second = Cli("")("token", "create", "carol", "--file", str(tokens), server=False)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    token = first.stdout.strip()
    assert first.stdout == token + "\n"  # the token alone on stdout: $(tidelog token create ...)
    assert "TIDELOG_TOKEN" in first.stderr and token not in first.stderr
    text = tokens.read_text()
    assert token not in text and second.stdout.strip() not in text
    assert text.count("sha256:") == 2  # both tokens of carol, the first one still valid
    assert stat.S_IMODE(os.stat(tokens).st_mode) == 0o600
    bad = Cli("")("token", "create", "not a name", "--file", str(tokens), server=False)
    assert bad.returncode == 1
    assert "is not a principal name" in one_error_line(bad)


def test_a_token_without_tls_is_refused_before_it_is_sent(cli: Cli, pki: Pki) -> None:
    """The client refuses (exit 2: usage), whether the token comes from the flag or the
    environment, and never prints it."""
    token = "tdl_never-sent-in-the-clear"
    for done in (
        cli("stream", "list", "--token", token),
        cli("stream", "list", env=clean_env(TIDELOG_TOKEN=token)),
    ):
        assert done.returncode == 2
        assert "a token is sent only over TLS" in one_error_line(done)
        assert token not in done.stdout + done.stderr


def test_a_token_sent_on_a_plaintext_connection_is_refused_by_the_server(
    server: ServerProcess,
) -> None:
    """A client that sends a token in the clear anyway (raw metadata): UNAUTHENTICATED, with
    the message that says why and what to do."""
    with grpc.insecure_channel(server.address) as channel:
        api = pb_grpc.APIStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            api.FetchMetadata(
                pb.FetchMetadataRequest(),
                metadata=(("authorization", "Bearer tdl_sent-in-the-clear"),),
                timeout=10,
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    details = refused.value.details() or ""
    assert "a bearer token is refused on a plaintext connection" in details
    assert "tdl_sent-in-the-clear" not in details


def test_the_help_never_shows_a_token_from_the_environment(cli: Cli) -> None:
    done = cli("stream", "list", "--help", env=clean_env(TIDELOG_TOKEN="tdl_in-the-env"))
    assert done.returncode == 0
    assert "--token" in done.stdout and "TIDELOG_TOKEN" in done.stdout
    assert "tdl_in-the-env" not in done.stdout


def test_serve_maps_the_security_flags_to_settings(tmp_path: Path, pki: Pki) -> None:
    """--allow-anonymous admits callers without credentials next to a tokens file; a tokens
    file without TLS is refused at start, naming the settings (exit 2)."""
    tokens = tmp_path / "tokens.toml"
    assert Cli("")("token", "create", "dan", "--file", str(tokens), server=False).returncode == 0
    with served(
        tmp_path / "data",
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tokens-file", str(tokens), "--allow-anonymous"),
    ) as process:
        listed = Cli(process.address)("stream", "list", *_tls_args(pki, client_cert=False))
        assert listed.returncode == 0, listed.stderr
    refused = Serve(
        *("--tokens-file", str(tokens), "--data-dir", str(tmp_path / "never")),
        *("--port", "0", "--metrics-port", "0"),
    )
    assert refused.wait() == 2
    assert "tokens_file need TLS" in words(refused.stderr())
