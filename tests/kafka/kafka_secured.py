"""Servers with TLS, tokens, an ACL and SASL on the Kafka port, run in-process on a loop of
their own thread, and the Kafka clients' side of the security tests (``test_kafka_security.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from tests.security.pki import Pki, make_pki, token_server
from tests.security.scram_client import client_final

from tidelog.api.server import Server
from tidelog.api.settings import ServerSettings, load_settings
from tidelog.process import free_port
from tidelog.security.tokens import add_token

T = TypeVar("T")

ACL = """
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["*"]
resources = ["stream:alice.*", "group:alice.*", "cursor:alice.*"]

[[rule]]
effect = "allow"
principals = ["bob"]
operations = ["publish"]
resources = ["stream:alice.shared"]
"""
"""alice owns alice.*; bob may publish on alice.shared (and so see it) but not read it."""

MECHANISMS = ["PLAIN", "SCRAM-SHA-256"]


class Running:
    """A :class:`Server` serving from a loop of its own thread, so that blocking Kafka clients
    can be used from the test as they are in applications."""

    def __init__(self, settings: ServerSettings) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = Server(settings)
        self.run(self.server.start())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def call(self, function: Callable[[], T]) -> T:
        async def called() -> T:
            return function()

        return self.run(called())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.kafka_port}"

    def close(self) -> None:
        try:
            self.run(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


@contextlib.contextmanager
def running(settings: ServerSettings) -> Iterator[Running]:
    served = Running(settings)
    try:
        yield served
    finally:
        served.close()


@dataclass
class SaslServer:
    running: Running
    ca: Path
    tokens_file: Path
    acl: Path
    tokens: dict[str, str]
    """principal -> its token (alice, bob and admin with SCRAM keys; plain-only without)"""


@contextlib.contextmanager
def sasl_server(directory: Path, **settings: Any) -> Iterator[SaslServer]:
    served = token_server(
        directory,
        ACL,
        ["plain-only"],
        kafka_port=free_port(),
        kafka_sasl_mechanisms=MECHANISMS,
        **settings,
    )
    tokens = dict(served.tokens)
    for who in ("alice", "bob", "admin"):
        tokens[who] = add_token(served.tokens_file, who, scram=True)
    with running(served.settings) as server:
        yield SaslServer(server, served.ca, served.tokens_file, served.acl, tokens)


@dataclass
class MtlsServer:
    running: Running
    pki: Pki
    tokens: dict[str, str]


@contextlib.contextmanager
def mtls_server(directory: Path) -> Iterator[MtlsServer]:
    """Mutual TLS (certificates name alice, mallory, admin) with tokens, the ACL and SASL."""
    pki = make_pki(directory / "pki")
    acl = directory / "acl.toml"
    acl.write_text(ACL, encoding="utf-8")
    tokens_file = directory / "tokens.toml"
    tokens = {"bob": add_token(tokens_file, "bob", scram=True)}
    settings = load_settings(
        data_dir=directory / "data",
        port=0,
        metrics_port=0,
        kafka_port=free_port(),
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        tokens_file=tokens_file,
        acl_file=acl,
        kafka_sasl_mechanisms=MECHANISMS,
    )
    with running(settings) as server:
        yield MtlsServer(server, pki, tokens)


# -- clients ------------------------------------------------------------------------------------


def sasl_config(served: SaslServer, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": served.running.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(served.ca),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def produce(config: dict[str, Any], topic: str, value: bytes, timeout_s: float = 10) -> KafkaError:
    """Produce one record with confluent-kafka; its delivery error (a NO_ERROR one when it was
    stored). Connection-level errors the client reports are raised."""
    delivered: list[KafkaError] = []
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        delivered.append(error or KafkaError(KafkaError.NO_ERROR))

    producer = Producer(
        {
            **config,
            "acks": "all",
            "enable.idempotence": False,
            "message.timeout.ms": int(timeout_s * 1000),
            "retries": 0,
            "error_cb": errors.append,
        }
    )
    producer.produce(topic, value, on_delivery=on_delivery)
    deadline = time.monotonic() + timeout_s + 5
    while not delivered and time.monotonic() < deadline:
        producer.poll(0.1)
        refusals = [e for e in errors if e.code() in REFUSED]
        if refusals:
            # the login's own error says why; a transport error says only that it closed
            refusals.sort(key=lambda e: e.code() not in LOGIN_FAILED)
            raise KafkaException(refusals[0])
    assert delivered, f"no delivery report (client errors: {errors})"
    return delivered[0]


LOGIN_FAILED = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
REFUSED = {*LOGIN_FAILED, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}


def consume_one(config: dict[str, Any], topic: str, timeout_s: float = 10) -> Any:
    """The first message (or error event) a confluent-kafka consumer gets reading partition 0
    of ``topic`` from offset 0. The consumer's group (librdkafka always looks its coordinator
    up) may be refused too: that error is passed over, this is about the topic."""
    consumer = Consumer({**config, "group.id": "alice.g", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                continue
            return message
        raise AssertionError(f"nothing read from {topic} in {timeout_s} s")
    finally:
        consumer.close()


def kp_options(served: SaslServer, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": served.running.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(served.ca),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
        "request_timeout_ms": 10_000,
    }


def kp_round_trip(served: SaslServer, mechanism: str, topic: str) -> list[bytes]:
    """Produce two records and read them back with kafka-python, logged in as alice."""
    options = kp_options(served, mechanism, "alice", served.tokens["alice"])
    producer = KafkaProducer(**options, acks="all", enable_idempotence=False)
    try:
        for value in (b"one", b"two"):
            producer.send(topic, value).get(timeout=10)
    finally:
        producer.close()
    consumer = KafkaConsumer(**options, consumer_timeout_ms=5000, enable_auto_commit=False)
    try:
        consumer.assign([KpTopicPartition(topic, 0)])
        consumer.seek(KpTopicPartition(topic, 0), 0)
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 2:
                break
        return values
    finally:
        consumer.close()


def mtls_config(served: MtlsServer, who: str) -> dict[str, Any]:
    issued = getattr(served.pki, who)
    return {
        "bootstrap.servers": served.running.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(served.pki.ca.cert),
        "ssl.certificate.location": str(issued.cert),
        "ssl.key.location": str(issued.key),
    }


def wait_for(condition: Callable[[], bool], timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def sasl_refusal(config: dict[str, Any]) -> KafkaError:
    """The error confluent-kafka reports for a connection the server refuses."""
    with pytest.raises(KafkaException) as refused:
        produce(config, "alice.refused", b"x", timeout_s=5)
    error: KafkaError = refused.value.args[0]
    return error


# -- the wire itself -------------------------------------------------------------------------------


def frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def read_frame(tls: ssl.SSLSocket) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = tls.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    (size,) = struct.unpack(">i", head)
    data = b""
    while len(data) < size:
        chunk = tls.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@contextlib.contextmanager
def raw_connection(served: SaslServer) -> Iterator[ssl.SSLSocket]:
    context = ssl.create_default_context(cafile=str(served.ca))
    with (
        socket.create_connection(("127.0.0.1", served.running.server.kafka_port), 10) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as tls,
    ):
        tls.settimeout(10)
        yield tls


def authenticate(tls: ssl.SSLSocket, correlation: int, message: bytes) -> tuple[int, bytes]:
    """SaslAuthenticate v0 on ``tls``: the answer's error code and auth bytes."""
    tls.sendall(frame(36, 0, correlation, struct.pack(">i", len(message)) + message))
    answer = read_frame(tls)
    (error, text_size) = struct.unpack_from(">hh", answer, 4)
    at = 8 + max(text_size, 0)
    (size,) = struct.unpack_from(">i", answer, at)
    return error, answer[at + 4 : at + 4 + size]


def log_in(tls: ssl.SSLSocket, mechanism: str, user: str, token: str) -> None:
    """A SASL login by hand (SaslHandshake v1, then SaslAuthenticate v0)."""
    tls.sendall(frame(17, 1, 1, struct.pack(">h", len(mechanism)) + mechanism.encode()))
    assert read_frame(tls)[:6] == struct.pack(">ih", 1, 0)
    if mechanism == "PLAIN":
        assert authenticate(tls, 2, f"\0{user}\0{token}".encode()) == (0, b"")
        return
    first_bare = f"n={user},r=fyko+d2lbbFgONRv9qkxdawL"
    error, server_first = authenticate(tls, 2, f"n,,{first_bare}".encode())
    assert error == 0
    error, server_final = authenticate(tls, 3, client_final(token, server_first, first_bare))
    assert error == 0 and server_final.startswith(b"v=")
