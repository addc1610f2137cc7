"""The Kafka front: a listener that speaks the Kafka wire protocol over tidelog's streams.

A Kafka topic is a tidelog stream, a partition a partition, an offset an offset; committed group
offsets are tidelog cursors. The front translates only: every request passes the same guard as
the gRPC services (identity from the connection, the ACL by operation and resource) and is served
through the control seam, so it never asks whether the server is one broker or a cluster
(``docs/kafka.md``).
"""

from tidelog.kafka.sasl import MECHANISMS as KAFKA_SASL_MECHANISMS
from tidelog.kafka.serving import KafkaListener
from tidelog.kafka.session import (
    DEFAULT_FETCH_MAX_BYTES,
    DEFAULT_KAFKA_MESSAGE_MAX_BYTES,
    DEFAULT_REQUEST_MAX_BYTES,
    Gate,
    KafkaConfig,
)

__all__ = [
    "DEFAULT_FETCH_MAX_BYTES",
    "DEFAULT_KAFKA_MESSAGE_MAX_BYTES",
    "DEFAULT_REQUEST_MAX_BYTES",
    "KAFKA_SASL_MECHANISMS",
    "Gate",
    "KafkaConfig",
    "KafkaListener",
]
