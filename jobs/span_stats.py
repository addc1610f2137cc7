"""The span-statistics pipeline: trace spans from tidelog, per service and minute, back to tidelog.

Reads the stream ``spans`` (values: JSON trace spans, see ``SPAN_SCHEMA``) with Spark Structured
Streaming, aggregates per service and event-time minute — count, error count, p50 and p99 of the
duration — and writes each (service, minute) to the stream ``spans.stats`` once that minute is
complete: append mode, a minute being complete when the event-time watermark (the newest span
seen, less ``WATERMARK``) has passed its end. Spans later than the watermark are dropped, as
Spark does. The tidelog sink deduplicates replayed micro-batches, so every minute is written
exactly once. Keys of ``spans.stats`` are ``<service>|<minute start, ISO 8601 UTC>``.

(Append, not update mode: Spark's Python data source sinks support append only, so a minute's
figures are published when final rather than revised as spans arrive.)

Run it on one machine through ``make demo``, or on a Spark cluster unchanged::

    spark-submit --master spark://HOST:7077 jobs/span_stats.py \\
        --servers BROKER:9292 --checkpoint hdfs:///checkpoints/span-stats

(every node needs ``pip install 'tidelog[spark]'``: executors import ``tidelog.spark``, and
reach the broker over gRPC only).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

SPANS = "spans"
STATS = "spans.stats"
SPAN_SCHEMA = (
    "service STRING, trace_id STRING, span_id STRING, duration_ms DOUBLE, status STRING, "
    "ts_ms BIGINT"
)
"""Each value of ``spans``: ``ts_ms`` is the span's start, ms since the Unix epoch."""
WATERMARK = "2 minutes"
"""How late a span may arrive (against the newest span seen) and still be counted."""


def span_stats(spans: DataFrame, watermark: str = WATERMARK) -> DataFrame:
    """Per (service, minute): count, errors, p50 and p99 duration, as ``key``/``value`` rows
    for the tidelog sink (value: JSON)."""
    from pyspark.sql import functions as F

    span = F.from_json(F.col("value").cast("string"), SPAN_SCHEMA).alias("span")
    parsed = (
        spans.select(span)
        .select("span.*")
        .withColumn("event_time", F.timestamp_millis("ts_ms"))
        .withWatermark("event_time", watermark)
    )
    stats = parsed.groupBy("service", F.window("event_time", "1 minute").alias("minute")).agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(F.when(F.col("status") == "error", 1).otherwise(0)).alias("errors"),
        F.percentile_approx("duration_ms", 0.5).alias("p50_ms"),
        F.percentile_approx("duration_ms", 0.99).alias("p99_ms"),
    )
    minute = F.date_format(F.col("minute.start"), "yyyy-MM-dd'T'HH:mm'Z'")
    return stats.select(
        F.concat_ws("|", "service", minute).cast("binary").alias("key"),
        F.to_json(
            F.struct(
                "service",
                minute.alias("minute"),
                "count",
                "errors",
                "p50_ms",
                "p99_ms",
            )
        )
        .cast("binary")
        .alias("value"),
    )


def start(
    spark: SparkSession,
    servers: str,
    checkpoint: str,
    *,
    available_now: bool = True,
    max_offsets_per_trigger: int = 100_000,
) -> StreamingQuery:
    """Start the streaming query (``available_now``: process what is there, then stop)."""
    from tidelog.spark import TidelogDataSource

    spark.dataSource.register(TidelogDataSource)
    spans = (
        spark.readStream.format("tidelog")
        .option("servers", servers)
        .option("stream", SPANS)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        .load()
    )
    writer = (
        span_stats(spans)
        .writeStream.format("tidelog")
        .option("servers", servers)
        .option("stream", STATS)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .queryName("span-stats")
    )
    writer = writer.trigger(availableNow=True) if available_now else writer
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="127.0.0.1:9292", help="tidelog host:port list")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="keep running (micro-batches as spans arrive) instead of stopping when caught up",
    )
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("tidelog-span-stats").getOrCreate()
    query = start(
        spark,
        args.servers,
        args.checkpoint,
        available_now=not args.continuous,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
