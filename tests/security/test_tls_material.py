"""The server's TLS material: files that cannot be used are refused naming them (never a prompt
for a passphrase), and a reload changes what new connections see, or, from a bad file, nothing."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from tests.security.pki import served_certificate

from tidelog.security import ServerTls, TlsError, TlsFiles
from tidelog.security.testca import Issued, issue, make_ca


@pytest.fixture
def ca(tmp_path: Path) -> Issued:
    return make_ca(tmp_path / "pki")


def test_a_key_of_another_certificate_is_refused_naming_both_files(
    tmp_path: Path, ca: Issued
) -> None:
    one = issue(ca, tmp_path / "pki", "one")
    two = issue(ca, tmp_path / "pki", "two")
    with pytest.raises(TlsError) as refused:
        ServerTls(TlsFiles(one.cert, two.key))
    message = str(refused.value)
    assert f"the certificate {one.cert} and the key {two.key} do not go together" in message


def test_unreadable_or_not_pem_files_are_named(tmp_path: Path, ca: Issued) -> None:
    server = issue(ca, tmp_path / "pki", "server")
    with pytest.raises(TlsError, match=f"cannot read the private key {tmp_path / 'nope'}"):
        ServerTls(TlsFiles(server.cert, tmp_path / "nope"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate", encoding="utf-8")
    with pytest.raises(TlsError, match=f"the certificate {junk} is not PEM"):
        ServerTls(TlsFiles(junk, server.key))
    with pytest.raises(TlsError, match=f"the client CA {junk} is not PEM"):
        ServerTls(TlsFiles(server.cert, server.key, junk))


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    tmp_path: Path, ca: Issued
) -> None:
    """Without a password callback OpenSSL prompts on the terminal (blocking a server started
    from one, at start or on SIGHUP) and then fails with an OSError naming nothing."""
    server = issue(ca, tmp_path / "pki", "server")
    key = serialization.load_pem_private_key(server.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsError, match=f"the private key {encrypted} is encrypted"):
        ServerTls(TlsFiles(server.cert, encrypted))


@pytest.fixture
def served(tmp_path: Path, ca: Issued) -> Iterator[tuple[ServerTls, str, Issued]]:
    """A grpc server on ``ServerTls``' credentials (no services: the handshake is what is
    looked at), its address, and its certificate's files."""
    server_files = issue(ca, tmp_path / "pki", "server")
    tls = ServerTls(TlsFiles(server_files.cert, server_files.key))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    server.start()
    try:
        yield tls, f"127.0.0.1:{port}", server_files
    finally:
        server.stop(None)


def test_a_reload_changes_what_new_connections_see(
    tmp_path: Path, ca: Issued, served: tuple[ServerTls, str, Issued]
) -> None:
    tls, address, _files = served
    first = served_certificate(address, ca.cert)
    issue(ca, tmp_path / "pki", "server")  # a new certificate and key over the same files
    assert served_certificate(address, ca.cert).serial_number == first.serial_number
    tls.reload()
    assert served_certificate(address, ca.cert).serial_number != first.serial_number


def test_a_reload_from_bad_files_keeps_what_was_loaded(
    tmp_path: Path, ca: Issued, served: tuple[ServerTls, str, Issued]
) -> None:
    tls, address, files = served
    http = tls.ssl_context()
    first = served_certificate(address, ca.cert)
    other = issue(ca, tmp_path / "pki", "other")
    files.key.write_bytes(other.key.read_bytes())  # a key that does not go with the certificate
    with pytest.raises(TlsError, match="do not go together"):
        tls.reload()
    files.cert.write_text("half a file", encoding="utf-8")
    with pytest.raises(TlsError, match="is not PEM"):
        tls.reload()
    assert served_certificate(address, ca.cert).serial_number == first.serial_number
    assert http_certificate(http, ca.cert).serial_number == first.serial_number


def test_a_reload_changes_the_http_port_certificate_in_place(
    tmp_path: Path, ca: Issued, served: tuple[ServerTls, str, Issued]
) -> None:
    tls, _address, _files = served
    http = tls.ssl_context()
    first = http_certificate(http, ca.cert)
    issue(ca, tmp_path / "pki", "server")
    tls.reload()
    assert http_certificate(http, ca.cert).serial_number != first.serial_number


def http_certificate(server: ssl.SSLContext, ca: Path) -> x509.Certificate:
    """The certificate ``server`` presents, from a handshake in memory."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context(cafile=str(ca)).wrap_bio(
        to_client, to_server, server_hostname="localhost"
    )
    peer = server.wrap_bio(to_server, to_client, server_side=True)
    pending = [client, peer]
    for _ in range(10):  # a TLS 1.3 handshake needs two flights each way
        for side in list(pending):
            try:
                side.do_handshake()
                pending.remove(side)
            except ssl.SSLWantReadError:
                pass
        if not pending:
            break
    der = client.getpeercert(binary_form=True)
    assert der is not None, "no handshake"
    return x509.load_der_x509_certificate(der)
