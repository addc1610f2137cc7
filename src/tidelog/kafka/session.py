"""What a Kafka request is served with: the listener's settings and the connection's session.

A :class:`Session` lives as long as its connection. It holds who the caller is (named once, from
the connection's TLS certificate or its SASL exchange, never from a request field), and asks the
server's live policy (``Gate.guard``: replaced on a reload, so a revoked grant refuses the next
request) before each thing a request touches, as the gRPC guard does for each call.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidelog.access import ANONYMOUS, Guard, Kind, Operation, on
from tidelog.control import Control
from tidelog.errors import PermissionDenied
from tidelog.security import Authenticator

DEFAULT_KAFKA_MESSAGE_MAX_BYTES = 1 << 20
"""Kafka's own default for ``message.max.bytes`` (a record batch) is about 1 MiB."""
DEFAULT_REQUEST_MAX_BYTES = 100 << 20
"""``socket.request.max.bytes``: a frame above it closes the connection before it is read."""
DEFAULT_FETCH_MAX_BYTES = 50 << 20
"""A Fetch answer's records at most (Kafka's ``fetch.max.bytes`` is 55 MB): a client's larger
``max_bytes`` is lowered to it."""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The listener's settings (``tidelog serve --kafka-*``; ``docs/kafka.md``)."""

    host: str = "127.0.0.1"
    port: int = 0
    advertised_host: str = ""
    """The host clients are told to connect to (Metadata); empty: ``host`` (the server passes
    ``advertised_host``, or 127.0.0.1 for a wildcard ``host``)."""
    advertised_port: int = 0
    """The port clients are told (Metadata); 0: the bound port."""
    message_max_bytes: int = DEFAULT_KAFKA_MESSAGE_MAX_BYTES
    """The largest record batch a produce may carry, decompressed (``MESSAGE_TOO_LARGE``)."""
    request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    """The records one Fetch answer carries at most, and each of its partitions: the request's
    ``max_bytes`` and ``partition_max_bytes`` are lowered to it."""
    auto_create_topics: bool = True
    """Create a topic a producer's Metadata names (Kafka's ``auto.create.topics.enable``)."""
    default_partitions: int = 1
    """Partitions of an automatically created topic (Kafka's ``num.partitions``)."""
    cluster_id: str = "tidelog"
    fetch_max_wait_s: float = 30.0
    """A fetch's ``max_wait_ms`` is capped here, so a stuck client cannot hold a request for
    ever."""
    sasl_mechanisms: tuple[str, ...] = ()
    """SASL mechanisms offered (``PLAIN``, ``SCRAM-SHA-256``); empty: SASL is not served."""


class Gate(Protocol):
    """The server's door (``tidelog.api.guard.Door``): who a caller is, what it may do. Both
    are read at each use, as a reload replaces them."""

    @property
    def guard(self) -> Guard: ...

    @property
    def authenticator(self) -> Authenticator: ...


class OpenGate:
    """A gate that lets everyone in, as anonymous: a server without credentials or an ACL."""

    def __init__(self) -> None:
        self.guard = Guard()
        self.authenticator = Authenticator()


def node_id(broker_id: str) -> int:
    """The Kafka node id (an int32 >= 0) naming the tidelog broker ``broker_id``: the number
    itself when the id is one, else a stable hash of it."""
    if broker_id.isdigit() and int(broker_id) < 2**31:
        return int(broker_id)
    return zlib.crc32(broker_id.encode()) & 0x7FFFFFFF


class ClusterPeers(Mapping[str, tuple[str, int]]):
    """Every broker's Kafka address by broker id, as the control knows it at the moment of each
    read (:meth:`~tidelog.control.Control.kafka_addresses`: in a cluster, the membership records
    of the live brokers), so a Metadata names the brokers of now, never those of the
    connection's start. A single broker's is empty."""

    __slots__ = ("_control",)

    def __init__(self, control: Control) -> None:
        self._control = control

    def __getitem__(self, broker_id: str) -> tuple[str, int]:
        return self._control.kafka_addresses()[broker_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._control.kafka_addresses())

    def __len__(self) -> int:
        return len(self._control.kafka_addresses())


@dataclass(slots=True)
class Session:
    """One connection's state (module docstring)."""

    control: Control
    config: KafkaConfig
    gate: Gate
    peer: str
    advertised: tuple[str, int]
    """(host, port) this broker names itself with in Metadata."""
    identity: str = ANONYMOUS
    authenticated: bool = False
    """Whether the connection may send requests other than ApiVersions and SASL yet."""
    secure: bool = False
    """The connection is TLS (SASL is served on no other)."""
    settled: bool = False
    """A request other than ApiVersions and SASL was served: the principal is fixed (a SASL
    exchange is refused from then on)."""
    closing: str | None = None
    """Set by a handler: the connection is closed once its answer is sent, this logged."""
    client_id: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    """Per-connection state of the apis that keep some (fetch sessions, SASL exchanges)."""
    peers: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """Other brokers' Kafka addresses by broker id (a cluster's: the listener's
    :class:`ClusterPeers`, which follows membership)."""

    def broker_address(self, broker_id: str) -> tuple[str, int] | None:
        """Where Kafka clients reach broker ``broker_id``: this broker's advertised address,
        another's from ``peers`` (None: not live, or it runs no Kafka listener)."""
        if broker_id == self.control.broker_id:
            return self.advertised
        return self.peers.get(broker_id)

    def allowed(self, op: Operation, kind: Kind, name: str) -> bool:
        """Whether the caller may ``op`` the resource, under the policy of this moment."""
        try:
            self.gate.guard.check(self.identity, (on(op, kind, name),))
        except PermissionDenied:
            return False
        return True

    def may_see(self, kind: Kind, name: str) -> bool:
        return self.allowed(Operation.DESCRIBE, kind, name)
