"""The JVM reader (``tidelog.spark.jvm.read``, format ``tidelog-jvm``) against secured servers:
mutual TLS (``tlsCa``, ``tlsCert``, ``tlsKey``, with the client key as PKCS#8 or as the
"traditional" SEC1 PEM that ``openssl ecparam -genkey`` writes), a bearer token over server TLS,
and the refusals a user must be able to act on: a wrong token, no token, a principal whose ACL
grants no ``subscribe``. Each connector task opens its own channel with these options."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tests.support.server import ServerProcess, served

from tidelog.client import Client, ClientSettings, ClientTls, Message
from tidelog.security.testca import Issued, issue, make_ca
from tidelog.security.tokens import add_token
from tidelog.spark import jvm

pytestmark = pytest.mark.spark

STREAM = "jvm-secure"
PARTITIONS = 2
PER_PARTITION = 40
ACL = """\
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["spark-job"]
operations = ["subscribe"]
resources = ["stream:jvm-*"]

[[rule]]
effect = "allow"
principals = ["peeker"]
operations = ["describe"]
resources = ["stream:jvm-*"]
"""
"""spark-job may read the jvm streams; peeker may only see them (plan a read, not run it)."""


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    job: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    return Pki(ca, issue(ca, directory, "server"), issue(ca, directory, "spark-job"))


def _fill(client: Client) -> None:
    client.create_stream(STREAM, partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        client.publish_batch(
            STREAM,
            [Message(b"p%d-%d" % (partition, i)) for i in range(PER_PARTITION)],
            partition=partition,
        )


EXPECTED = sorted(
    (p, i, b"p%d-%d" % (p, i)) for p in range(PARTITIONS) for i in range(PER_PARTITION)
)


def _rows(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    """A server every client must show a certificate of the test CA to, holding STREAM."""
    with served(
        tmp_path_factory.mktemp("mtls") / "data",
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tls-client-ca", str(pki.ca.cert)),
    ) as process:
        tls = ClientTls(ca=pki.ca.cert, cert=pki.job.cert, key=pki.job.key)
        with Client(process.address, settings=ClientSettings(tls=tls)) as client:
            _fill(client)
        yield process


@dataclass(frozen=True)
class Tokens:
    process: ServerProcess
    tokens: dict[str, str]
    """principal -> its bearer token (admin, spark-job, peeker)."""


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Tokens]:
    """Server TLS (no client certificates), bearer tokens and an ACL: every caller needs a
    token, and may do what ACL lets its principal do."""
    directory = tmp_path_factory.mktemp("tokens")
    (directory / "acl.toml").write_text(ACL)
    made = {p: add_token(directory / "tokens.toml", p) for p in ("admin", "spark-job", "peeker")}
    with served(
        directory / "data",
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tokens-file", str(directory / "tokens.toml")),
        *("--acl-file", str(directory / "acl.toml")),
    ) as process:
        tls = ClientTls(ca=pki.ca.cert, token=made["admin"])
        with Client(process.address, settings=ClientSettings(tls=tls)) as client:
            _fill(client)
        yield Tokens(process, made)


def test_mutual_tls(spark: Any, mtls: ServerProcess, pki: Pki) -> None:
    options = {
        "servers": mtls.address,
        "stream": STREAM,
        "tlsCa": str(pki.ca.cert),
        "tlsCert": str(pki.job.cert),
        "tlsKey": str(pki.job.key),
        "maxOffsetsPerPartition": "15",  # several tasks, each its own channel
    }
    df = jvm.read(spark, options)
    assert df.rdd.getNumPartitions() > PARTITIONS
    assert _rows(df) == EXPECTED


def test_mutual_tls_with_a_sec1_key(
    spark: Any, mtls: ServerProcess, pki: Pki, tmp_path: Path
) -> None:
    """An EC key as "BEGIN EC PRIVATE KEY" (openssl's traditional format), which netty does not
    read: the reader hands the connector a PKCS#8 copy, and the read just works."""
    key = serialization.load_pem_private_key(pki.job.key.read_bytes(), password=None)
    sec1 = tmp_path / "job-sec1.key"
    sec1.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    assert sec1.read_text().startswith("-----BEGIN EC PRIVATE KEY-----")
    options = {
        "servers": mtls.address,
        "stream": STREAM,
        "tlsCa": str(pki.ca.cert),
        "tlsCert": str(pki.job.cert),
        "tlsKey": str(sec1),
    }
    assert _rows(jvm.read(spark, options)) == EXPECTED


def _rsa_client(pki: Pki, directory: Path) -> tuple[Path, Path]:
    """A client certificate of the test CA for an RSA key, the key as PKCS#1 ("BEGIN RSA
    PRIVATE KEY", what ``openssl genrsa`` of OpenSSL 1.x writes)."""
    ca_key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa-job")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("rsa-job")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "rsa-job.pem", directory / "rsa-job.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_mutual_tls_with_an_rsa_pkcs1_key(
    spark: Any, mtls: ServerProcess, pki: Pki, tmp_path: Path
) -> None:
    cert, key = _rsa_client(pki, tmp_path)
    assert key.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    options = {
        "servers": mtls.address,
        "stream": STREAM,
        "tlsCa": str(pki.ca.cert),
        "tlsCert": str(cert),
        "tlsKey": str(key),
    }
    assert _rows(jvm.read(spark, options)) == EXPECTED


def test_an_encrypted_key_is_refused_naming_the_fix(
    spark: Any, mtls: ServerProcess, pki: Pki, tmp_path: Path
) -> None:
    """The connector given an encrypted key (the planner in Python fails on it before): the
    error says so and how to write it unencrypted. No task can ask for a passphrase."""
    key = serialization.load_pem_private_key(pki.job.key.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    options = {
        "servers": mtls.address,
        "stream": STREAM,
        "tasks": "0:0:1",
        "tlsCa": str(pki.ca.cert),
        "tlsCert": str(pki.job.cert),
        "tlsKey": str(locked),
    }
    with pytest.raises(Exception, match=r"'tlsKey' .*locked\.key is encrypted.*openssl pkey"):
        spark.read.format(jvm.FORMAT).options(**options).load().collect()


def test_no_client_certificate_is_refused_by_mutual_tls(
    spark: Any, mtls: ServerProcess, pki: Pki
) -> None:
    with pytest.raises(Exception, match=r"(?i)unavailable|handshake|certificate"):
        jvm.read(spark, servers=mtls.address, stream=STREAM, tlsCa=str(pki.ca.cert)).collect()


def test_a_token_over_tls(spark: Any, tokens: Tokens, pki: Pki) -> None:
    options = {
        "servers": tokens.process.address,
        "stream": STREAM,
        "tlsCa": str(pki.ca.cert),
        "token": tokens.tokens["spark-job"],
        "maxOffsetsPerPartition": "15",
    }
    assert _rows(jvm.read(spark, options)) == EXPECTED


def _connector(spark: Any, tokens: Tokens, pki: Pki, token: str) -> Any:
    """The connector given a plan directly, as if the token had been revoked (or the ACL
    changed) after ``jvm.read`` planned with a good one: the tasks meet the refusal."""
    options = {
        "servers": tokens.process.address,
        "stream": STREAM,
        "tasks": f"0:0:{PER_PARTITION};1:0:{PER_PARTITION}",
        "tlsCa": str(pki.ca.cert),
        "token": token,
    }
    return spark.read.format(jvm.FORMAT).options(**options).load()


def test_a_wrong_token_or_none_is_refused(spark: Any, tokens: Tokens, pki: Pki) -> None:
    right = tokens.tokens["spark-job"]
    wrong = right[:-4] + "AAAA"
    base = {"servers": tokens.process.address, "stream": STREAM, "tlsCa": str(pki.ca.cert)}
    with pytest.raises(Exception, match="unknown token"):  # the planner, in Python
        jvm.read(spark, {**base, "token": wrong})
    with pytest.raises(Exception, match=r"requires credentials.*token"):
        jvm.read(spark, base)
    with pytest.raises(Exception, match=rf"'{STREAM}' partition \d.*UNAUTHENTICATED") as raised:
        _connector(spark, tokens, pki, wrong).collect()
    assert right not in str(raised.value) and wrong not in str(raised.value)


def test_a_read_the_acl_denies(spark: Any, tokens: Tokens, pki: Pki) -> None:
    """peeker may see the stream but not read it: the planner's first subscribe is refused in
    Python, and a task given the plan anyway fails naming PERMISSION_DENIED and the stream."""
    options = {
        "servers": tokens.process.address,
        "stream": STREAM,
        "tlsCa": str(pki.ca.cert),
        "token": tokens.tokens["peeker"],
    }
    with pytest.raises(Exception, match=f"peeker may not subscribe on stream '{STREAM}'"):
        jvm.read(spark, options)
    with pytest.raises(Exception, match=rf"'{STREAM}' partition \d.*PERMISSION_DENIED"):
        _connector(spark, tokens, pki, tokens.tokens["peeker"]).collect()
