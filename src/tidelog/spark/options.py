"""The read options of the ``tidelog`` Spark data source: parsed and checked without a JVM.

Spark hands a data source its options as a case-insensitive dict of strings. ``parse`` turns
them into one frozen :class:`ReadOptions`, raising :class:`InvalidOption` for anything missing,
malformed or contradictory, so that a bad option fails at ``load()``, before any task runs.
Option names follow Spark's Kafka source where the meaning is the same (``startingOffsets``,
``endingOffsets``, ``startingTimestamp``, ``endingTimestamp``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``, ``minPartitions``); ``docs/spark.md`` lists them all.

Connection options, shared with the sink: ``tlsCa``, ``tlsCert``, ``tlsKey``, ``token`` and
``tls`` (TLS with the system's CAs) become one :class:`~tidelog.client.ClientTls` (``tls``), which
every planner and executor connection uses. A token without TLS is refused here, at ``load()``;
the token never appears in ``repr`` (``ClientTls`` leaves it out), and Spark redacts an option
named ``token`` wherever it shows options (``spark.redaction.regex``).

Offsets in JSON use Kafka's sentinels: -2 is the earliest retained offset, -1 the latest (the
high watermark + 1, i.e. nothing yet). Ending offsets and timestamps are exclusive.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tidelog.client import DEFAULT_SERVER, ClientTls
from tidelog.errors import InvalidOption, UnknownColumn
from tidelog.wire.arrow import COLUMNS

EARLIEST: Final = -2
"""In offset JSON and :class:`OffsetSpec`: the oldest retained offset of the partition."""
LATEST: Final = -1
"""In offset JSON and :class:`OffsetSpec`: the high watermark + 1 (the next offset)."""

DEFAULT_MAX_OFFSETS_PER_PARTITION: Final = 500_000
"""A partition's range is split into Spark tasks of at most this many offsets (and a batch
read packs small ranges into tasks of up to this many)."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end in each partition: ``default`` (``EARLIEST`` or ``LATEST``) for
    every partition, except those in ``offsets`` (an offset >= 0, or a sentinel)."""

    default: int
    offsets: Mapping[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int:
        return self.offsets.get(partition, self.default)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Everything the reader needs, checked. ``None`` means "not given" where the batch and the
    streaming reader default differently (``starting_offsets``: earliest vs latest)."""

    servers: tuple[str, ...] = (DEFAULT_SERVER,)
    tls: ClientTls = field(default_factory=ClientTls)
    """How every connection is secured (options ``tlsCa``, ``tlsCert``, ``tlsKey``, ``token``,
    ``tls``); plaintext by default."""
    stream: str | None = None
    partitions: tuple[int, ...] | None = None
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    reverse: bool = False
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    max_offsets_per_partition: int = DEFAULT_MAX_OFFSETS_PER_PARTITION
    min_partitions: int | None = None
    columns: tuple[str, ...] | None = None
    """Option ``columns``: the only columns the source has, in this order (None: all of
    them); a user-specified schema narrows them the same way."""

    def require_stream(self) -> str:
        if not self.stream:
            raise InvalidOption("option 'stream' is required: .option('stream', '<name>')")
        return self.stream

    def check_streaming(self) -> None:
        """Options that only make sense for a batch read are errors on a streaming read."""
        for given, name in (
            (self.ending_offsets is not None, "endingOffsets"),
            (self.ending_timestamp_ms is not None, "endingTimestamp"),
            (self.reverse, "reverse"),
        ):
            if given:
                raise InvalidOption(
                    f"option {name!r} applies to batch reads only (spark.read), not to "
                    f"spark.readStream; remove it"
                )


def parse(options: Mapping[str, str]) -> ReadOptions:
    """Checked read options from Spark's option dict (keys in any case)."""
    given = {k.lower(): v for k, v in options.items()}
    starting = _offset_spec(given, "startingOffsets", EARLIEST)
    ending = _offset_spec(given, "endingOffsets", LATEST)
    if ending is not None and (ending.default == EARLIEST or EARLIEST in ending.offsets.values()):
        raise InvalidOption(
            "endingOffsets cannot be 'earliest' (-2): it would read nothing; use 'latest', "
            "an offset, or leave it out"
        )
    parsed = ReadOptions(
        servers=_servers(given.get("servers")),
        tls=_tls(given),
        stream=given.get("stream") or None,
        partitions=_partitions(given.get("partitions")),
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp_ms=integer_option(given, "startingTimestamp", minimum=0),
        ending_timestamp_ms=integer_option(given, "endingTimestamp", minimum=0),
        reverse=_boolean(given, "reverse", False),
        max_offsets_per_trigger=integer_option(given, "maxOffsetsPerTrigger", minimum=1),
        fail_on_data_loss=_boolean(given, "failOnDataLoss", True),
        max_offsets_per_partition=integer_option(given, "maxOffsetsPerPartition", minimum=1)
        or DEFAULT_MAX_OFFSETS_PER_PARTITION,
        min_partitions=integer_option(given, "minPartitions", minimum=1),
        columns=column_list(given.get("columns")),
    )
    _check_order(parsed)
    return parsed


def _check_order(options: ReadOptions) -> None:
    """Ending before starting, where the options alone show it (offsets at planning)."""
    start_ts, end_ts = options.starting_timestamp_ms, options.ending_timestamp_ms
    if start_ts is not None and end_ts is not None and end_ts < start_ts:
        raise InvalidOption(
            f"endingTimestamp {end_ts} is before startingTimestamp {start_ts} "
            f"(both ms since the epoch; the ending one is exclusive)"
        )
    starting, ending = options.starting_offsets, options.ending_offsets
    if starting is None or ending is None:
        return
    for partition in sorted(set(starting.offsets) | set(ending.offsets)):
        first, end = starting.for_partition(partition), ending.for_partition(partition)
        if first >= 0 and end >= 0 and end < first:
            raise InvalidOption(
                f"endingOffsets {end} is before startingOffsets {first} for partition "
                f"{partition} (the ending offset is exclusive)"
            )


def column_list(text: str | None) -> tuple[str, ...] | None:
    """Option ``columns``: names of the source's columns, separated by commas, each once."""
    if text is None or not text.strip():
        return None
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if name not in COLUMNS:
            raise UnknownColumn(
                f"columns: no column {name!r}; the source's columns are {', '.join(COLUMNS)} "
                f"(got {text!r})"
            )
    if len(set(names)) != len(names):
        raise InvalidOption(f"columns: a column is named twice in {text!r}")
    return names


def _servers(text: str | None) -> tuple[str, ...]:
    if text is None:
        return (DEFAULT_SERVER,)
    servers = tuple(s.strip() for s in text.split(",") if s.strip())
    for server in servers:
        host, colon, port = server.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidOption(
                f"servers: expected host:port entries separated by commas, got {text!r}"
            )
    if not servers:
        raise InvalidOption(
            f"servers: expected host:port entries separated by commas, got {text!r}"
        )
    return servers


def _tls(given: Mapping[str, str]) -> ClientTls:
    """The connection options as one ClientTls. Paths are opened by each connection, on the
    driver and on every executor: the files must be readable at the same paths on each."""

    def path(name: str) -> Path | None:
        text = given.get(name.lower(), "").strip()
        return Path(text) if text else None

    ca, cert, key = path("tlsCa"), path("tlsCert"), path("tlsKey")
    enabled = _boolean(given, "tls", False)
    token = given.get("token") or None
    if (cert is None) != (key is None):
        raise InvalidOption("options 'tlsCert' and 'tlsKey' go together: give both, or neither")
    if token and not (enabled or ca or cert):
        raise InvalidOption(
            "option 'token' is sent only over TLS: give option 'tlsCa' (the CA of the server's "
            "certificate), or tls=true to check the server against the system's CAs"
        )
    return ClientTls(ca=ca, cert=cert, key=key, token=token, enabled=enabled)


def _partitions(text: str | None) -> tuple[int, ...] | None:
    if text is None or not text.strip():
        return None
    try:
        numbers = [int(p) for p in text.split(",")]
    except ValueError:
        numbers = [-1]
    if any(n < 0 for n in numbers):
        raise InvalidOption(f"partitions: expected partition numbers like '0,2,3', got {text!r}")
    return tuple(sorted(set(numbers)))


def _offset_spec(given: Mapping[str, str], name: str, default: int) -> OffsetSpec | None:
    text = given.get(name.lower())
    if text is None:
        return None
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    shape = f'expected "earliest", "latest" or JSON like {{"0": 42, "1": -2}}, got {text!r}'
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidOption(f"{name}: {shape} ({error})") from None
    if not isinstance(decoded, dict):
        raise InvalidOption(f"{name}: {shape}")
    offsets: dict[int, int] = {}
    for key, value in decoded.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise InvalidOption(f"{name}: partition {key!r} is not a partition number; {shape}")
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise InvalidOption(
                f"{name}: offset {value!r} for partition {key} must be an offset >= 0, "
                f"-2 (earliest) or -1 (latest)"
            )
        offsets[int(key)] = value
    return OffsetSpec(default, offsets)


def integer_option(
    given: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    """The integer option ``name`` (None when not given) in [minimum, maximum]."""
    text = given.get(name.lower())
    if text is None:
        return None
    try:
        number: int | None = int(text.strip())
    except ValueError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        wanted = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise InvalidOption(f"{name}: expected an integer {wanted}, got {text!r}")
    return number


def _boolean(given: Mapping[str, str], name: str, default: bool) -> bool:
    text = given.get(name.lower())
    if text is None:
        return default
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise InvalidOption(f"{name}: expected 'true' or 'false', got {text!r}")
    return word == "true"
