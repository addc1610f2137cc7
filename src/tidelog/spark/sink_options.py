"""The write options and the input schema of the ``tidelog`` sink, checked without a JVM.

``parse_write_options`` turns Spark's option dict into one frozen :class:`WriteOptions`;
``check_schema`` decides which input columns the sink uses (:class:`InputColumns`) or raises
:class:`InvalidSchema`. Both run in ``writer()``/``streamWriter()``, so a bad option or a
DataFrame without ``value`` fails before any task runs. ``docs/spark.md`` ("Writing") lists them.

Columns: ``value`` (binary or string, strings as UTF-8) is required; ``key`` (binary or string,
null: no key), ``partition`` (an integer type, null: the sink chooses) and ``headers``
(``array<struct<key: string, value: binary|string>>``) are optional. Every other column is
ignored, so the rows of ``spark.read.format("tidelog")`` (``stream``, ``offset``,
``timestamp``, ...) can be written as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from tidelog.client import ClientTls
from tidelog.errors import InvalidOption, SparkSourceError
from tidelog.spark.options import integer_option, parse

DEFAULT_MAX_CHUNK_BYTES: Final = 16 << 20
"""A chunk (one idempotent publish request) holds at most this many bytes of keys, values and
headers, unless a single record is larger."""
MAX_CHUNK_BYTES_LIMIT: Final = 48 << 20
"""The largest ``maxChunkBytes``: a request is refused over 64 MiB encoded (api.md), and the
encoding adds sizes and header framing to the raw bytes."""
DEFAULT_MAX_CHUNK_RECORDS: Final = 100_000
DEFAULT_RETRY_TIMEOUT_S: Final = 60.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 30.0


class InvalidSchema(SparkSourceError, ValueError):
    """The DataFrame to write has no ``value`` column, or a column the sink uses has a type it
    cannot write."""


class OverwriteRefused(SparkSourceError, ValueError):
    """``mode("overwrite")`` (or a streaming ``complete`` output mode): a log is append-only."""


@dataclass(frozen=True, slots=True)
class WriteOptions:
    servers: tuple[str, ...]
    stream: str
    tls: ClientTls = field(default_factory=ClientTls)
    """The connection options, as for reading (``tidelog.spark.options``)."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    max_chunk_records: int = DEFAULT_MAX_CHUNK_RECORDS
    retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S
    """How long one chunk is retried while the broker is unreachable (0: never)."""
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    """How long one publish request may take before it counts as failed and is retried
    (0: no limit); a broker that hangs without refusing connections is detected this way."""


@dataclass(frozen=True, slots=True)
class InputColumns:
    """The names of the input columns the sink reads, as spelled in the DataFrame (Spark
    resolves names case-insensitively, and so does the sink); ``None``: no such column."""

    value: str
    key: str | None = None
    partition: str | None = None
    headers: str | None = None


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Checked write options from Spark's option dict (keys in any case)."""
    read = parse(options)  # the options both directions share: servers, TLS, stream
    if not read.stream:
        raise InvalidOption(
            "option 'stream' is required: .option('stream', '<output stream>') "
            "(the stream must exist; create it first)"
        )
    given = {k.lower(): v for k, v in options.items()}
    return WriteOptions(
        servers=read.servers,
        stream=read.stream,
        tls=read.tls,
        max_chunk_bytes=integer_option(
            given, "maxChunkBytes", minimum=1, maximum=MAX_CHUNK_BYTES_LIMIT
        )
        or DEFAULT_MAX_CHUNK_BYTES,
        max_chunk_records=integer_option(given, "maxChunkRecords", minimum=1, maximum=10_000_000)
        or DEFAULT_MAX_CHUNK_RECORDS,
        retry_timeout_s=_seconds(given, "writeRetryTimeoutSeconds", DEFAULT_RETRY_TIMEOUT_S),
        request_timeout_s=_seconds(given, "writeRequestTimeoutSeconds", DEFAULT_REQUEST_TIMEOUT_S),
    )


def refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OverwriteRefused(
            "the tidelog sink only appends: a stream is a log and cannot be overwritten; use "
            "mode('append') (batch) or outputMode('append') (streaming)"
        )


def check_schema(schema: StructType) -> InputColumns:
    """Which columns to write, or :class:`InvalidSchema` naming the column and the fix."""
    by_name = {f.name.lower(): f for f in schema.fields}
    value = by_name.get("value")
    if value is None:
        raise InvalidSchema(
            f"the tidelog sink needs a 'value' column (binary or string); the DataFrame has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}. Add one, e.g. "
            f"df.selectExpr('CAST(x AS BINARY) AS value') or to_json(struct(*)) AS value"
        )
    _expect(value.name, value.dataType, _is_bytes(value.dataType), "binary or string")
    key = by_name.get("key")
    if key is not None:
        _expect(key.name, key.dataType, _is_bytes(key.dataType), "binary or string")
    partition = by_name.get("partition")
    if partition is not None:
        _expect(
            partition.name,
            partition.dataType,
            isinstance(partition.dataType, (ByteType, ShortType, IntegerType, LongType)),
            "an integer type (int, bigint, ...)",
        )
    headers = by_name.get("headers")
    if headers is not None:
        _expect(
            headers.name,
            headers.dataType,
            _is_headers(headers.dataType),
            "array<struct<key: string, value: binary>> (value may be a string)",
        )
    return InputColumns(
        value=value.name,
        key=None if key is None else key.name,
        partition=None if partition is None else partition.name,
        headers=None if headers is None else headers.name,
    )


def _is_bytes(kind: DataType) -> bool:
    return isinstance(kind, (BinaryType, StringType))


def _is_headers(kind: DataType) -> bool:
    if not isinstance(kind, ArrayType) or not isinstance(kind.elementType, StructType):
        return False
    fields = {f.name.lower(): f.dataType for f in kind.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and _is_bytes(fields["value"])
    )


def _expect(name: str, kind: DataType, ok: bool, wanted: str) -> None:
    if not ok:
        raise InvalidSchema(
            f"column {name!r} is {kind.simpleString()}, but the tidelog sink writes it as "
            f"{wanted}; cast it, or rename it if it is not meant for the sink"
        )


def _seconds(given: Mapping[str, str], name: str, default: float) -> float:
    text = given.get(name.lower())
    if text is None:
        return default
    try:
        seconds = float(text.strip())
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InvalidOption(f"{name}: expected a number of seconds >= 0, got {text!r}")
    return seconds
