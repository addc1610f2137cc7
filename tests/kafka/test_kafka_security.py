"""Security on the Kafka listener with real clients: mutual TLS naming the principal, SASL PLAIN
and SCRAM-SHA-256 over TLS (confluent-kafka, kafka-python, aiokafka) with tidelog tokens as
passwords, the ACL refusing with TOPIC_AUTHORIZATION_FAILED, refusals that close the connection
(a wrong password, SASL without TLS, no credentials), and reloads reaching open connections."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import KafkaError, Producer
from kafka import KafkaProducer
from kafka.errors import KafkaError as KpError
from tests.kafka.kafka_secured import (
    ACL,
    LOGIN_FAILED,
    MECHANISMS,
    REFUSED,
    MtlsServer,
    SaslServer,
    consume_one,
    frame,
    kp_options,
    kp_round_trip,
    log_in,
    mtls_config,
    mtls_server,
    produce,
    raw_connection,
    read_frame,
    running,
    sasl_config,
    sasl_refusal,
    sasl_server,
    wait_for,
)
from tests.security.pki import served_certificate

from tidelog.api.settings import InvalidSettings, load_settings
from tidelog.kafka import KafkaConfig, KafkaListener
from tidelog.kafka import sasl as kafka_sasl
from tidelog.process import free_port
from tidelog.security.testca import Issued, issue
from tidelog.security.tokens import digest, load_tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslServer]:
    """TLS (no client certificates), tokens with SCRAM keys, :data:`ACL`, SASL on Kafka."""
    with sasl_server(tmp_path_factory.mktemp("sasl")) as served:
        yield served


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsServer]:
    """Mutual TLS (certificates name alice, mallory, admin) with tokens, the ACL and SASL."""
    with mtls_server(tmp_path_factory.mktemp("mtls")) as served:
        yield served


# -- mutual TLS ----------------------------------------------------------------------------------


def test_a_client_certificate_names_the_principal_the_acl_decides_for(mtls: MtlsServer) -> None:
    alice = mtls_config(mtls, "alice")
    assert produce(alice, "alice.mtls", b"hers").code() == KafkaError.NO_ERROR
    refused = produce(mtls_config(mtls, "mallory"), "alice.mtls", b"not hers")
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # alice's grant covers alice.* only: another topic is refused her too.
    assert produce(alice, "other.mtls", b"x").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    message = consume_one(alice, "alice.mtls")
    assert message.error() is None and message.value() == b"hers"


def test_with_a_certificate_and_a_sasl_login_the_login_names_the_principal(
    mtls: MtlsServer,
) -> None:
    # alice's certificate, bob's token: bob may publish on alice.shared, not on alice.other
    alice = mtls_config(mtls, "alice")
    for topic in ("alice.shared", "alice.other"):
        assert produce(alice, topic, b"from alice").code() == KafkaError.NO_ERROR
    config = {
        **mtls_config(mtls, "alice"),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "bob",
        "sasl.password": mtls.tokens["bob"],
    }
    assert produce(config, "alice.shared", b"from bob").code() == KafkaError.NO_ERROR
    denied = produce(config, "alice.other", b"from bob")
    assert denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


# -- SASL ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_logs_in_with_a_token(sasl: SaslServer, mechanism: str) -> None:
    config = sasl_config(sasl, mechanism, "alice", sasl.tokens["alice"])
    topic = f"alice.ck-{mechanism.lower()}"
    assert produce(config, topic, b"v").code() == KafkaError.NO_ERROR
    message = consume_one(config, topic)
    assert message.error() is None and message.value() == b"v"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_logs_in_with_a_token(sasl: SaslServer, mechanism: str) -> None:
    topic = f"alice.kp-{mechanism.lower()}"
    assert kp_round_trip(sasl, mechanism, topic) == [b"one", b"two"]


def test_aiokafka_logs_in_with_scram(sasl: SaslServer) -> None:
    async def round_trip() -> bytes:
        options: dict[str, Any] = {
            "bootstrap_servers": sasl.running.bootstrap,
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=str(sasl.ca)),
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "alice",
            "sasl_plain_password": sasl.tokens["alice"],
        }
        producer = AIOKafkaProducer(**options, enable_idempotence=False)
        await producer.start()
        try:
            await producer.send_and_wait("alice.aio", b"async")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**options, enable_auto_commit=False)
        await consumer.start()
        try:
            partition = AioTopicPartition("alice.aio", 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            record = await asyncio.wait_for(consumer.getone(), 10)
            return bytes(record.value or b"")
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == b"async"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_is_refused_with_the_reason(
    sasl: SaslServer, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = sasl.tokens["alice"][:-4] + "AAAA"
    with caplog.at_level(logging.WARNING, "tidelog.kafka"):
        error = sasl_refusal(sasl_config(sasl, mechanism, "alice", wrong))
    assert error.code() in LOGIN_FAILED
    assert "Authentication failed" in error.str()
    # and the server closed the connection (logged once its answer is written)
    wait_for(lambda: "closed: Authentication failed" in caplog.text)


def test_plain_with_another_principals_name_is_refused(sasl: SaslServer) -> None:
    error = sasl_refusal(sasl_config(sasl, "PLAIN", "alice", sasl.tokens["bob"]))
    assert "'alice' is not the principal of this token" in error.str()


def test_scram_for_a_token_made_without_scram_keys_is_refused(sasl: SaslServer) -> None:
    config = sasl_config(sasl, "SCRAM-SHA-256", "plain-only", sasl.tokens["plain-only"])
    assert "Authentication failed" in sasl_refusal(config).str()


def test_kafka_python_is_refused_a_wrong_password(
    sasl: SaslServer, caplog: pytest.LogCaptureFixture
) -> None:
    options = kp_options(sasl, "SCRAM-SHA-256", "alice", "tdl_wrong")
    # kafka-python retries a refused login until its bootstrap times out
    with caplog.at_level(logging.WARNING, "tidelog.kafka"), pytest.raises(KpError):
        KafkaProducer(**options, bootstrap_timeout_ms=1500, enable_idempotence=False)
    assert "Authentication failed (SCRAM-SHA-256): wrong user name or password" in caplog.text


def test_without_credentials_the_connection_is_closed(
    sasl: SaslServer, caplog: pytest.LogCaptureFixture
) -> None:
    # TLS without a certificate or a login: the server requires credentials (acl_file, tokens).
    config = {
        "bootstrap.servers": sasl.running.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(sasl.ca),
    }
    with caplog.at_level(logging.WARNING, "tidelog.kafka"):
        error = sasl_refusal(config)
        wait_for(lambda: "before logging in: this server requires credentials" in caplog.text)
    assert error.code() in REFUSED


def test_a_consumer_without_the_subscribe_grant_cannot_fetch(sasl: SaslServer) -> None:
    alice = sasl_config(sasl, "PLAIN", "alice", sasl.tokens["alice"])
    bob = sasl_config(sasl, "PLAIN", "bob", sasl.tokens["bob"])
    assert produce(alice, "alice.shared", b"secret").code() == KafkaError.NO_ERROR
    assert produce(bob, "alice.shared", b"bob's").code() == KafkaError.NO_ERROR
    message = consume_one(bob, "alice.shared")
    assert message.error() is not None
    assert message.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_sasl_is_refused_on_a_plaintext_listener(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The settings refuse it, naming why ...
    with pytest.raises(InvalidSettings, match="kafka_sasl_mechanisms needs tokens_file"):
        load_settings(data_dir=tmp_path, kafka_port=free_port(), kafka_sasl_mechanisms=["PLAIN"])
    with pytest.raises(ValueError, match="SASL needs TLS"):
        KafkaListener(None, KafkaConfig(sasl_mechanisms=("PLAIN",)))  # type: ignore[arg-type]
    # ... and a client asking a plaintext listener for SASL is refused before its password
    # is sent: the handshake fails, the server logs why and closes.
    settings = load_settings(
        data_dir=tmp_path / "data", port=0, metrics_port=0, kafka_port=free_port()
    )
    with running(settings) as server, caplog.at_level(logging.WARNING, "tidelog.kafka"):
        config = {
            "bootstrap.servers": server.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "tdl_secret",
        }
        error = sasl_refusal(config)
        wait_for(lambda: "SASL needs TLS" in caplog.text)
    assert error.code() in REFUSED
    assert "tdl_secret" not in caplog.text


# -- the wire itself -------------------------------------------------------------------------------


def test_a_handshake_v0_exchanges_bare_sasl_frames(sasl: SaslServer) -> None:
    # Kafka before 1.0: after SaslHandshake v0 the PLAIN message is a bare size-prefixed frame,
    # answered by an empty one; then the connection is logged in.
    with raw_connection(sasl) as tls:
        tls.sendall(frame(17, 0, 1, struct.pack(">h", 5) + b"PLAIN"))
        answer = read_frame(tls)
        assert answer[:6] == struct.pack(">ih", 1, 0)  # correlation 1, no error
        message = b"\0alice\0" + sasl.tokens["alice"].encode()
        tls.sendall(struct.pack(">i", len(message)) + message)
        assert read_frame(tls) == b""
        tls.sendall(frame(18, 0, 2, b""))  # ApiVersions, then Metadata v1 for no topic
        assert read_frame(tls)[:6] == struct.pack(">ih", 2, 0)
        tls.sendall(frame(3, 1, 3, struct.pack(">i", 0)))
        assert read_frame(tls)[:4] == struct.pack(">i", 3)


def test_a_failed_v0_exchange_closes_the_connection(sasl: SaslServer) -> None:
    with raw_connection(sasl) as tls:
        tls.sendall(frame(17, 0, 1, struct.pack(">h", 5) + b"PLAIN"))
        read_frame(tls)
        message = b"\0alice\0tdl_wrong"
        tls.sendall(struct.pack(">i", len(message)) + message)
        with pytest.raises((ConnectionError, ssl.SSLError)):
            read_frame(tls)


def test_before_its_login_a_connection_may_not_send_a_large_frame(sasl: SaslServer) -> None:
    with raw_connection(sasl) as tls:
        tls.sendall(struct.pack(">i", 1 << 20) + b"\0" * 64)
        with pytest.raises((ConnectionError, ssl.SSLError)):
            read_frame(tls)


def test_a_connection_that_does_not_log_in_in_time_is_closed(
    sasl: SaslServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_sasl, "LOGIN_TIMEOUT_S", 0.3)
    with raw_connection(sasl) as tls:
        tls.sendall(frame(18, 0, 1, b""))  # ApiVersions is served before a login ...
        assert read_frame(tls)[:6] == struct.pack(">ih", 1, 0)
        started = time.monotonic()
        with pytest.raises((ConnectionError, ssl.SSLError)):  # ... but not for ever
            read_frame(tls)
        assert time.monotonic() - started < 5


# -- reloads ---------------------------------------------------------------------------------------


REVOKED_ACL = ACL.replace('operations = ["*"]', 'operations = ["describe"]')


def test_a_reload_applies_the_new_acl_to_the_next_request_of_an_open_connection(
    tmp_path: Path,
) -> None:
    with sasl_server(tmp_path) as served:
        config = sasl_config(served, "PLAIN", "alice", served.tokens["alice"])
        producer = Producer({**config, "acks": "all", "retries": 0, "message.timeout.ms": 5000})
        reports: list[KafkaError | None] = []

        def send(value: bytes) -> KafkaError | None:
            reports.clear()
            producer.produce("alice.r", value, on_delivery=lambda e, _m: reports.append(e))
            producer.flush(10)
            assert reports, "no delivery report"
            return reports[0]

        assert send(b"granted") is None
        served.acl.write_text(REVOKED_ACL, encoding="utf-8")
        assert "ACL" in served.running.call(served.running.server.reload)
        refused = send(b"revoked")
        assert refused is not None
        assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        producer.flush(1)


def test_a_reload_that_revokes_a_token_closes_the_connections_logged_in_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        sasl_server(tmp_path) as served,
        raw_connection(served) as alice_plain,
        raw_connection(served) as alice_scram,
        raw_connection(served) as bobs,
    ):
        log_in(alice_plain, "PLAIN", "alice", served.tokens["alice"])
        log_in(alice_scram, "SCRAM-SHA-256", "alice", served.tokens["alice"])
        log_in(bobs, "SCRAM-SHA-256", "bob", served.tokens["bob"])
        # alice's hash leaves [tokens]: her SCRAM keys, still in the file, no longer count
        kept = served.tokens_file.read_text(encoding="utf-8")
        assert kept.count(digest(served.tokens["alice"])) == 2
        served.tokens_file.write_text(
            "\n".join(
                '"alice" = []' if line.startswith('"alice" = ') else line
                for line in kept.splitlines()
            ),
            encoding="utf-8",
        )
        assert load_tokens(served.tokens_file).principal_of(served.tokens["alice"]) is None
        with caplog.at_level(logging.WARNING, "tidelog.kafka"):
            assert "tokens" in served.running.call(served.running.server.reload)
            for revoked in (alice_plain, alice_scram):
                with pytest.raises((ConnectionError, ssl.SSLError)):
                    read_frame(revoked)
        assert "the token alice logged in with (SASL PLAIN) was revoked" in caplog.text
        assert "the token alice logged in with (SASL SCRAM-SHA-256) was revoked" in caplog.text
        bobs.sendall(frame(18, 0, 4, b""))  # bob's connection goes on
        assert read_frame(bobs)[:6] == struct.pack(">ih", 4, 0)


def test_a_reload_serves_the_new_certificate_to_new_kafka_connections(tmp_path: Path) -> None:
    with sasl_server(tmp_path) as served:
        address = served.running.bootstrap
        before = served_certificate(address, served.ca)
        ca = Issued(tmp_path / "pki" / "ca.pem", tmp_path / "pki" / "ca.key")
        (tmp_path / "renewed").mkdir()
        renewed = issue(ca, tmp_path / "renewed", "server")
        settings = served.running.server.settings
        assert settings.tls_cert is not None and settings.tls_key is not None
        settings.tls_cert.write_bytes(renewed.cert.read_bytes())
        settings.tls_key.write_bytes(renewed.key.read_bytes())
        assert "certificates" in served.running.call(served.running.server.reload)
        after = served_certificate(address, served.ca)
        assert after.serial_number != before.serial_number
        config = sasl_config(served, "PLAIN", "alice", served.tokens["alice"])
        assert produce(config, "alice.renewed", b"v").code() == KafkaError.NO_ERROR
