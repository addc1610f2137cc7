"""A cluster broker's settings and the cluster's fixed defaults, in one place.

Invariant: read-only. :class:`ClusterSettings` is frozen and made once, when the server starts;
every piece of the node reads it and none changes it. ``ack_timeout_s`` is meant to be above
``replica_lag_max_s`` (the node warns at start when it is not), and the fetch wait is derived
from the lag, never set apart from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tidelog.security import PLAINTEXT, ClientTls

CURSOR_REPLICAS = 3
"""Replicas of ``__cursors`` in a cluster (fewer when the cluster has fewer live brokers when
the first cursor is set)."""
INTERNAL_REPLICAS = 3
"""Replicas of the other internal streams the cluster creates (``ClusterNode.internal_stream``;
fewer when fewer brokers are live then)."""

CHECKPOINT_INTERVAL_S = 1.0
"""How often the high watermarks are written (a restart may restart from one this old)."""


DEFAULT_LEASE_TTL_S: Final = 3
"""A broker that stops refreshing its etcd lease for this long leaves the cluster."""
DEFAULT_REPLICA_LAG_MAX_S: Final = 5.0
"""A follower behind its leader for this long leaves the ISR."""
DEFAULT_ACK_TIMEOUT_S: Final = 10.0
"""How long an ack ALL publish waits for the ISR (above the lag bound: module docstring)."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    etcd: str
    """The etcd endpoint, http://HOST:PORT, or https://HOST:PORT for TLS (``etcd_tls``)."""
    broker_id: str
    advertise: str
    """HOST:PORT other brokers and clients reach this broker at."""
    kafka_advertise: str = ""
    """HOST:PORT Kafka clients reach this broker's Kafka listener at, registered beside
    ``advertise`` so every broker's Kafka Metadata can name it (empty: no Kafka listener)."""
    cluster: str = "default"
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    poll_s: float = 0.1
    replica_lag_max_s: float = DEFAULT_REPLICA_LAG_MAX_S
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    """Above ``replica_lag_max_s``: an ack ALL publish that waits for a follower that stopped
    gets through once the ISR has dropped it, rather than failing at that very moment."""
    peer_tls: ClientTls = PLAINTEXT
    """How this broker calls the others (follower fetches, forwarded calls, group and status
    calls): with the server's TLS on, TLS with this broker's own certificate as the client's, so
    the broker called knows who calls (``docs/security.md``, "Brokers trust brokers")."""
    etcd_tls: ClientTls = PLAINTEXT
    """How this broker reaches etcd: the CA etcd's certificate is checked against and this
    broker's client certificate (etcd names its user after the certificate's common name)."""

    @property
    def fetch_wait_ms(self) -> int:
        """How long a follower's fetch waits at the leader for records: half the lag a follower
        may have before it leaves the ISR (a waiting follower counts caught up anyway:
        ``LeaderReplica.hold``). A record, or a higher high watermark, answers at once, so the
        wait costs no latency; what it sets is how often an idle partition's followers ask."""
        return max(round(self.replica_lag_max_s * 500), 50)
