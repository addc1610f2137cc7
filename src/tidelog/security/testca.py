"""A throwaway certificate authority for tests and development setups (``make cluster``,
``make sites``, the test suite): a CA, server certificates for loopback, client certificates
named by their subject alternative name. Never for production: keys are written unencrypted.

``python -m tidelog.security.testca DIR NAME...`` writes ``ca.pem``/``ca.key`` (once) and, for
each NAME, ``NAME.pem``/``NAME.key``: a certificate valid both as a server's (for localhost and
127.0.0.1) and as a client's, whose first subject alternative name is NAME (so NAME is the
principal it authenticates as).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class Issued:
    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(directory: Path, name: str = "ca", common_name: str = "tidelog test CA") -> Issued:
    """A self-signed CA (``NAME.pem``, ``NAME.key``) valid for ten years."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    issued = Issued(directory / f"{name}.pem", directory / f"{name}.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(issued.key, key)
    return issued


def issue(
    ca: Issued,
    directory: Path,
    name: str,
    *,
    common_name: str | None = None,
    sans: tuple[str, ...] | None = None,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    expired: bool = False,
) -> Issued:
    """A certificate signed by ``ca``, usable as a server's and a client's. Its subject
    alternative names: ``sans`` (default: ``name``) first, then ``hosts`` (DNS names and IP
    addresses a client dials). ``expired``: valid only in the past."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (
        (now - datetime.timedelta(days=30), now - datetime.timedelta(days=1))
        if expired
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=825))
    )
    names: list[x509.GeneralName] = [x509.DNSName(s) for s in (name,) if sans is None]
    names += [x509.DNSName(s) for s in sans or ()]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name or name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    issued = Issued(directory / f"{name}.pem", directory / f"{name}.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(issued.key, key)
    return issued


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tidelog.security.testca DIR NAME...", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    ca = Issued(directory / "ca.pem", directory / "ca.key")
    if not ca.cert.exists():
        ca = make_ca(directory)
    for name in argv[1:]:
        issue(ca, directory, name)
    print(f"CA and certificates for {', '.join(argv[1:])} in {directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
