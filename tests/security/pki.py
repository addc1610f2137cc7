"""Certificates, settings files and channels for the security tests: one throwaway CA (and a
stranger's), the principals the tests' ACL names, and ``tidelog serve`` config files."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from tidelog.api.settings import ServerSettings, load_settings
from tidelog.security import channel_credentials
from tidelog.security.testca import Issued, issue, make_ca
from tidelog.security.tokens import add_token

ACL_TEXT = """\
super_users = ["admin"]

[groups]
writers = ["alice"]

[[rule]]
effect = "allow"
principals = ["group:writers"]
operations = ["*"]
resources = ["stream:alice.*", "subject:alice.*", "group:alice.*", "cursor:alice.*", "site:*",
             "cluster"]

[[rule]]
effect = "allow"
principals = ["east"]
operations = ["replicate"]
resources = ["site:*"]
"""
"""alice may do everything on her resources (every site, the cluster); mallory nothing; admin
everything (a super-user)."""


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    alice: Issued
    mallory: Issued
    admin: Issued
    stranger: Issued
    """A certificate for "alice" signed by another CA."""
    expired: Issued
    """A certificate for "alice" from the right CA, valid only in the past."""
    east: Issued
    """The remote site "east": only its own certificate may replicate as it."""


def make_pki(directory: Path) -> Pki:
    ca = make_ca(directory / "ca")
    other = make_ca(directory / "other", common_name="another CA")
    return Pki(
        ca=ca,
        server=issue(ca, directory / "ca", "server"),
        alice=issue(ca, directory / "ca", "alice"),
        mallory=issue(ca, directory / "ca", "mallory"),
        admin=issue(ca, directory / "ca", "admin"),
        stranger=issue(other, directory / "other", "alice"),
        expired=issue(ca, directory / "ca", "old-alice", sans=("alice",), expired=True),
        east=issue(ca, directory / "ca", "east"),
    )


def write_config(path: Path, **settings: object) -> Path:
    """A TOML settings file for ``tidelog serve --config`` (strings, numbers, booleans, lists of
    strings, tables of strings)."""
    lines, tables = [], []
    for name, value in settings.items():
        if isinstance(value, dict):
            tables.append(f"[{name}]")
            tables += [f"{json.dumps(k)} = {json.dumps(str(v))}" for k, v in value.items()]
        elif isinstance(value, bool):
            lines.append(f"{name} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{name} = {value}")
        elif isinstance(value, list):
            lines.append(f"{name} = {json.dumps([str(v) for v in value])}")
        else:
            lines.append(f"{name} = {json.dumps(str(value))}")
    path.write_text("\n".join([*lines, *tables]) + "\n", encoding="utf-8")
    return path


def secure_channel(
    address: str,
    ca: Path,
    client: Issued | None = None,
    token: str | None = None,
) -> grpc.Channel:
    """A synchronous TLS channel: the server checked against ``ca``, ``client``'s certificate
    presented (mutual TLS) when given, ``token`` sent as a bearer token when given."""
    credentials = channel_credentials(
        ca, client.cert if client else None, client.key if client else None, token
    )
    return grpc.secure_channel(address, credentials)


def served_certificate(address: str, ca: Path, client: Issued | None = None) -> x509.Certificate:
    """The certificate a TLS server at ``address`` presents to a new connection (offering HTTP/2,
    as a grpc client does: grpc's server refuses a handshake without it)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


@dataclass(frozen=True)
class TokenServer:
    """Settings of an in-process server with TLS, bearer tokens and an ACL, and what its
    clients need: the CA to check it against and each principal's token."""

    settings: ServerSettings
    ca: Path
    acl: Path
    tokens_file: Path
    tokens: dict[str, str]
    """principal -> its token"""


def token_server(
    directory: Path, acl_text: str, principals: Iterable[str], **settings: Any
) -> TokenServer:
    """A test CA and server certificate, a token per principal, ``acl_text`` as the ACL, and
    settings on free loopback ports (``settings`` added or overriding; metrics off)."""
    ca = make_ca(directory / "pki")
    server = issue(ca, directory / "pki", "server")
    acl = directory / "acl.toml"
    acl.write_text(acl_text, encoding="utf-8")
    tokens_file = directory / "tokens.toml"
    tokens = {who: add_token(tokens_file, who) for who in principals}
    served = load_settings(
        **{
            "data_dir": directory / "data",
            "port": 0,
            "metrics_port": 0,
            "tls_cert": server.cert,
            "tls_key": server.key,
            "tokens_file": tokens_file,
            "acl_file": acl,
            **settings,
        }
    )
    return TokenServer(served, ca.cert, acl, tokens_file, tokens)
