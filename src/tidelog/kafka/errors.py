"""Kafka's error codes, and the errors the record layer raises, each carrying its code.

:class:`ErrorCode` holds the numbers the Kafka protocol answers with (from Kafka's
``Errors.java``; ``tests/kafka/test_kafka_records.py`` checks each against kio's generated
table). A :class:`KafkaError` is a failure a handler answers with its ``code`` for the partition
concerned; its message says what was wrong with the request and what the client can change. The
record layer's errors are about one partition's records (a Produce request's ``records``): the
other partitions of the request are unaffected.
"""

from __future__ import annotations

from enum import IntEnum

from tidelog.errors import TidelogError


class ErrorCode(IntEnum):
    """Kafka protocol error codes (the subset tidelog's Kafka front answers with)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    SECURITY_DISABLED = 54
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    INVALID_RECORD = 87
    THROTTLING_QUOTA_EXCEEDED = 89
    UNKNOWN_TOPIC_ID = 100


class KafkaError(TidelogError):
    """A failure the Kafka front answers with :attr:`code`; the message is for a person."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CorruptBatch(KafkaError):
    """A record batch whose framing or CRC-32C does not hold: the bytes are not what the client
    built (or the client built them wrongly)."""

    code = ErrorCode.CORRUPT_MESSAGE


class InvalidRecord(KafkaError):
    """A batch whose CRC holds but whose records do not add up: a record count, a varint or a
    length that disagrees with the bytes, or records that decompress beyond the limit."""

    code = ErrorCode.INVALID_RECORD


class UnsupportedCompression(KafkaError):
    """A compression codec outside Kafka's gzip (1), snappy (2), lz4 (3) and zstd (4)."""

    code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class UnsupportedMessageFormat(KafkaError):
    """A message set of format 0 or 1 (before Kafka 0.11): only record batches (magic 2) are
    served; the client must produce with a newer protocol version."""

    code = ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


__all__ = [
    "CorruptBatch",
    "ErrorCode",
    "InvalidRecord",
    "KafkaError",
    "UnsupportedCompression",
    "UnsupportedMessageFormat",
]
