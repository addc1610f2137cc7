"""A client certificate names the same principal on the HTTP ports (the console, /metrics) as on
the gRPC port: gRPC's auth context writes out only the DNS, email, URI and IP subject alternative
names, in order, IPs as ``inet_ntop`` writes them, and lists any other kind as "other types of
SAN"; a directory name or an otherName listed first must not name the visitor by its content on
the HTTP ports (``getpeercert()`` spells it out).

Each certificate is presented for real to both: to a gRPC server in this process (mutual TLS on a
free loopback port; the name is what its auth context gives), and in a TLS handshake in memory
(``ssl.SSLObject``) whose ``getpeercert()`` is what the HTTP port hands :class:`ServerGate`."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from tidelog.api.credentials import ServerSecurity
from tidelog.api.http import ServerGate
from tidelog.api.settings import load_settings
from tidelog.security.identity import certificate_name
from tidelog.security.testca import Issued, issue, make_ca

UPN = ObjectIdentifier("1.3.6.1.4.1.311.20.2.3")  # an otherName Windows puts in certificates


def utf8_der(text: str) -> bytes:
    data = text.encode()
    return bytes([0x0C, len(data)]) + data


def directory_name(common_name: str) -> x509.DirectoryName:
    return x509.DirectoryName(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))


CASES = {
    "a directory name first": [directory_name("mallory"), x509.DNSName("carol")],
    "an otherName first": [x509.OtherName(UPN, utf8_der("mallory")), x509.RFC822Name("c@x.org")],
    "both, then an IPv6 address": [
        directory_name("mallory"),
        x509.OtherName(UPN, utf8_der("mallory")),
        x509.IPAddress(ipaddress.ip_address("2001:db8::7")),
        x509.DNSName("carol"),
    ],
    "an IPv4-mapped address": [x509.IPAddress(ipaddress.ip_address("::ffff:10.1.2.3"))],
    "a URI": [x509.UniformResourceIdentifier("spiffe://example.org/carol")],
}


def client_certificate(ca: Issued, directory: Path, names: list[x509.GeneralName]) -> Issued:
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "the-cn")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    issued = Issued(directory / "client.pem", directory / "client.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    issued.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return issued


async def grpc_auth_context(ca: Issued, server: Issued, client: Issued) -> dict[str, list[bytes]]:
    """The auth context a gRPC server with mutual TLS has for a call made with ``client``."""
    seen: list[dict[str, list[bytes]]] = []

    async def probe(_request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.append({k: list(v) for k, v in context.auth_context().items()})
        return b""

    handler = grpc.method_handlers_generic_handler(
        "probe.Probe", {"Name": grpc.unary_unary_rpc_method_handler(probe)}
    )
    grpc_server = grpc.aio.server()
    grpc_server.add_generic_rpc_handlers((handler,))
    credentials = grpc.ssl_server_credentials(
        [(server.key.read_bytes(), server.cert.read_bytes())],
        root_certificates=ca.cert.read_bytes(),
        require_client_auth=True,
    )
    port = grpc_server.add_secure_port("127.0.0.1:0", credentials)
    await grpc_server.start()
    try:
        channel_credentials = grpc.ssl_channel_credentials(
            ca.cert.read_bytes(), client.key.read_bytes(), client.cert.read_bytes()
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", channel_credentials) as channel:
            await channel.unary_unary("/probe.Probe/Name")(b"", timeout=10)
    finally:
        await grpc_server.stop(None)
    return seen[0]


def http_peer_certificate(ca: Issued, server: Issued, client: Issued) -> dict[str, object]:
    """``getpeercert()`` of a TLS server requiring a client certificate, as the HTTP ports'."""
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(server.cert, server.key)
    served.load_verify_locations(ca.cert)
    served.verify_mode = ssl.CERT_REQUIRED
    dialing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    dialing.load_verify_locations(ca.cert)
    dialing.load_cert_chain(client.cert, client.key)
    wires = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]  # (in, out) of each side
    ends = [
        served.wrap_bio(*wires[0], server_side=True),
        dialing.wrap_bio(*wires[1], server_hostname="localhost"),
    ]
    done = [False, False]
    for _ in range(20):  # a TLS 1.3 handshake takes a few flights
        for side, end in enumerate(ends):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
            wires[1 - side][0].write(wires[side][1].read())
        if all(done):
            break
    assert all(done), "the handshake did not complete"
    certificate = ends[0].getpeercert()
    assert certificate
    return dict(certificate)


@pytest.mark.parametrize("names", list(CASES.values()), ids=list(CASES))
def test_the_http_ports_name_a_certificate_as_the_grpc_port_does(
    tmp_path: Path, names: list[x509.GeneralName]
) -> None:
    ca = make_ca(tmp_path / "pki")
    server = issue(ca, tmp_path / "pki", "server")
    client = client_certificate(ca, tmp_path, names)
    security = ServerSecurity(
        load_settings(
            data_dir=tmp_path / "data",
            tls_cert=server.cert,
            tls_key=server.key,
            tls_client_ca=ca.cert,
        )
    )
    auth_context = asyncio.run(grpc_auth_context(ca, server, client))
    by_grpc = security.door.authenticator.identify(auth_context, ())
    assert by_grpc == certificate_name(auth_context) and by_grpc not in ("", "the-cn")
    assert "mallory" not in by_grpc
    gate = ServerGate(security, 0)
    assert gate.principal_of_peer(http_peer_certificate(ca, server, client)) == by_grpc
    # a server with this certificate names itself so too (the console's client calls as it)
    own = load_settings(data_dir=tmp_path / "data", tls_cert=client.cert, tls_key=client.key)
    assert ServerGate(ServerSecurity(own), 0).own_principal() == by_grpc
