"""Batch reads inside Spark's JVM: ``tidelog.spark.jvm.read(spark, ...)`` plans a read in Python
exactly as the ``tidelog`` source does (the same options, checked the same way, the same offset
ranges and tasks) and hands the plan to the ``tidelog-jvm`` DataSource V2 connector
(``jvm/spark``, built by ``make spark-jvm`` into ``build/spark-jvm/tidelog-spark.jar``), whose
tasks read the broker's ``SubscribeBatches`` frames over gRPC into Spark's columnar batches. No
Python worker takes part and Spark prunes the columns itself: ``count()`` reads none, and a
query that does not use ``value`` asks the broker for no value bytes.

The plan is fixed when ``read`` returns: the DataFrame reads the offsets that were committed
then (the ``tidelog`` source plans again for every query). Batch reads only; filters are not
pushed down (use ``startingTimestamp``/``endingTimestamp``). docs/spark.md, "Reading inside the
JVM".
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from py4j.protocol import Py4JError, Py4JJavaError  # type: ignore[import-untyped]  # no types
from pyspark.errors import AnalysisException

from tidelog.errors import InvalidOption
from tidelog.spark import remote
from tidelog.spark.columns import columns_of, ddl
from tidelog.spark.options import ReadOptions, parse
from tidelog.spark.planning import OffsetRange
from tidelog.spark.source import group_tasks, plan_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT: Final = "tidelog-jvm"
JAR_ENV: Final = "TIDELOG_SPARK_JAR"
"""Where the connector's jar is, when not at the checkout's ``build/spark-jvm``."""
CONNECTION_OPTIONS: Final = ("tls", "tlsCa", "tlsCert", "tlsKey", "token")
"""Passed to the connector as given: every executor connection uses them (docs/spark.md)."""
STREAMING_ONLY: Final = ("maxOffsetsPerTrigger",)


class MissingJar(RuntimeError):
    """Spark cannot load the ``tidelog-jvm`` connector: the session lacks its jar."""


def jar_path() -> Path:
    """The connector's jar: ``$TIDELOG_SPARK_JAR``, else ``build/spark-jvm/tidelog-spark.jar``
    of this checkout (``make spark-jvm``). Give it to the session: ``spark.jars``."""
    given = os.environ.get(JAR_ENV)
    if given:
        return Path(given)
    return Path(__file__).resolve().parents[3] / "build" / "spark-jvm" / "tidelog-spark.jar"


def read(
    spark: SparkSession,
    options: Mapping[str, str] | None = None,
    *,
    schema: str | StructType | None = None,
    **more: str,
) -> DataFrame:
    """A DataFrame of the stream's records, read by the JVM connector. ``options`` (and
    keyword options) are the ``tidelog`` source's batch options; ``schema`` narrows the columns
    as a user-specified schema does (rarely needed here: Spark prunes the columns a query does
    not use). Raises ``InvalidOption`` for a bad option, before any task runs."""
    given = {**(options or {}), **more}
    parsed = parse(given)
    for name in STREAMING_ONLY:
        if any(k.lower() == name.lower() for k in given):
            raise InvalidOption(f"option {name!r} is for streaming reads; this read is a batch")
    columns = _columns(spark, schema, parsed)
    connection = remote.connect(parsed.servers, parsed.tls)
    try:
        ranges = plan_batch(connection, parsed, None)
        leaders = connection.partition_leaders(parsed.require_stream())
    finally:
        connection.close()
    reader = spark.read.format(FORMAT).options(**connector_options(given, parsed, ranges, leaders))
    if columns is not None:
        reader = reader.schema(ddl(columns))
    try:
        return reader.load()
    except (AnalysisException, Py4JJavaError) as error:
        if _condition(error) != "DATA_SOURCE_NOT_FOUND":
            raise
        raise MissingJar(
            f"Spark has no {FORMAT!r} connector: start the session with "
            f".config('spark.jars', '{jar_path()}') (built by `make spark-jvm`)"
        ) from None


def _condition(error: AnalysisException | Py4JJavaError) -> str | None:
    """Spark's error condition (``DATA_SOURCE_NOT_FOUND``), as PySpark converted it or on the
    JVM's exception (Spark 4.3 leaves ``SparkClassNotFoundException`` unconverted)."""
    if isinstance(error, AnalysisException):
        return error.getCondition()
    try:
        condition = error.java_exception.getCondition()
    except Py4JError:  # not one of Spark's own errors
        return None
    return str(condition) if condition is not None else None


def connector_options(
    given: Mapping[str, str],
    parsed: ReadOptions,
    ranges: Sequence[OffsetRange],
    leaders: Mapping[int, str],
) -> dict[str, str]:
    """The connector's options for a planned read (the names ``Settings.java`` reads)."""
    tasks = group_tasks(list(ranges), parsed)
    wanted = {p.partition for p in ranges}
    out = {
        "stream": parsed.require_stream(),
        "servers": ",".join(parsed.servers),
        "leaders": ",".join(f"{p}={a}" for p, a in sorted(leaders.items()) if p in wanted),
        "tasks": encode_tasks(tasks),
        "reverse": str(parsed.reverse).lower(),
        "failOnDataLoss": str(parsed.fail_on_data_loss).lower(),
    }
    lowered = {k.lower(): v for k, v in given.items()}
    for name in CONNECTION_OPTIONS:
        if name.lower() in lowered:
            out[name] = lowered[name.lower()]
    return out


def encode_tasks(tasks: Sequence[Sequence[OffsetRange]]) -> str:
    """``partition:start:stop`` per range, ``,`` between a task's ranges, ``;`` between tasks;
    empty ranges are left out, and so is a task left with none; no task at all is ``;`` (Spark
    drops an option whose value is empty)."""
    out = []
    for task in tasks:
        pieces = [f"{r.partition}:{r.start}:{r.stop}" for r in task if r.stop > r.start]
        if pieces:
            out.append(",".join(pieces))
    return ";".join(out) or ";"


def _columns(
    spark: SparkSession, schema: str | StructType | None, parsed: ReadOptions
) -> tuple[str, ...] | None:
    if schema is None:
        return parsed.columns
    from pyspark.sql.types import StructType

    struct: Any = schema
    if not isinstance(schema, StructType):
        struct = spark.createDataFrame([], schema).schema  # Spark's own DDL parser
    return columns_of(struct)


__all__ = [
    "FORMAT",
    "JAR_ENV",
    "MissingJar",
    "connector_options",
    "encode_tasks",
    "jar_path",
    "read",
]
