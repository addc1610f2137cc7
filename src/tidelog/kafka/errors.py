"""Kafka's error codes, and the errors the Kafka front raises, each carrying its code.

:class:`ErrorCode` is kio's table of the numbers the Kafka protocol answers with (generated from
Kafka's ``Errors.java``, named in lower case: ``ErrorCode.corrupt_message``). It is the one table
of codes in ``tidelog.kafka``, re-exported here beside the errors that carry them. A
:class:`KafkaError` is a failure a handler answers with its ``code`` for the entry of the request
concerned (a partition, a topic); its message says what was wrong with the request and what the
client can change. :class:`Refused` is the one a handler raises with the code of its case (a
missing grant, a partition named twice), caught where it answers that entry. The record layer's
errors are about one partition's records (a Produce request's ``records``): the other partitions
of the request are unaffected.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tidelog.errors import TidelogError


class KafkaError(TidelogError):
    """A failure the Kafka front answers with :attr:`code`; the message is for a person."""

    code: ErrorCode = ErrorCode.unknown_server_error

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(KafkaError):
    """A handler's refusal of one entry of a request (a partition, a topic, a config resource)
    with the code it names: for checks whose code depends on the case, where the record layer's
    errors each have one."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class CorruptBatch(KafkaError):
    """A record batch whose framing or CRC-32C does not hold: the bytes are not what the client
    built (or the client built them wrongly)."""

    code = ErrorCode.corrupt_message


class InvalidRecord(KafkaError):
    """A batch whose CRC holds but whose records do not add up: a record count, a varint or a
    length that disagrees with the bytes, or records that decompress beyond the limit."""

    code = ErrorCode.invalid_record


class UnsupportedCompression(KafkaError):
    """A compression codec outside Kafka's gzip (1), snappy (2), lz4 (3) and zstd (4)."""

    code = ErrorCode.unsupported_compression_type


class UnsupportedMessageFormat(KafkaError):
    """A message set of format 0 or 1 (before Kafka 0.11): only record batches (magic 2) are
    served; the client must produce with a newer protocol version."""

    code = ErrorCode.unsupported_for_message_format


__all__ = [
    "CorruptBatch",
    "ErrorCode",
    "InvalidRecord",
    "KafkaError",
    "Refused",
    "UnsupportedCompression",
    "UnsupportedMessageFormat",
]
