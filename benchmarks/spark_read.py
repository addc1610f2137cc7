#!/usr/bin/env python3
"""Spark reading tidelog (``tidelog.spark``) next to Spark reading the same rows from Parquet.

The benchmark starts its own ``tidelog serve`` on a free 127.0.0.1 port with a fresh temporary
data directory (stopped by PID and removed at the end, also on failure), creates a stream of
``--partitions`` partitions (default 4) and publishes ``--messages`` random values of ``--size``
bytes (default 5,000,000 x 100 B) spread evenly over them, each partition through one
``AsyncClient.publisher`` (``PublishStream``, batches of 5,000, up to 8 in flight).

A ``local[*]`` SparkSession (UI off, shuffle partitions = cores) then runs the same aggregation

    groupBy("partition").agg(count("*"), sum(length("value")))

over ``spark.read.format("tidelog")`` (every column of every record comes through the data
source; Python data sources have no column pruning) and over a Parquet copy of the same rows
(every column, written once by Spark from the tidelog read, snappy; Spark reads only the two
columns it needs). Each side runs once to warm up, then ``--runs`` times (default 3); the
median wall time gives ``tidelog_rows_per_s`` and ``parquet_rows_per_s``, and ``ratio`` is
tidelog / Parquet (target: >= 0.5). Both results are checked against the published counts.

Prints one JSON object. ``--messages N`` for a smaller run.

    python benchmarks/spark_read.py [--messages 5000000] [--size 100] [--partitions 4]
        [--runs 3] [--max-offsets-per-partition 500000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 5_000
IN_FLIGHT = 8


async def publish(address: str, stream: str, partitions: int, messages: int, size: int) -> float:
    """Publish ``messages`` random values evenly over the partitions; returns seconds taken."""
    from tidelog.client import AsyncClient

    values = [os.urandom(size) for _ in range(min(messages, 100_000))]

    async def fill(client: AsyncClient, partition: int, count: int) -> None:
        async with client.publisher(stream, partition) as publisher:
            pending: list[asyncio.Future[Any]] = []
            for first in range(0, count, BATCH):
                chunk = [
                    values[(first + i) % len(values)] for i in range(min(BATCH, count - first))
                ]
                pending.append(await publisher.send(chunk))
                if len(pending) >= IN_FLIGHT:
                    await pending.pop(0)
            for future in pending:
                await future

    started = time.perf_counter()
    async with AsyncClient(address) as client:
        await client.create_stream(stream, partitions=partitions)
        share = [messages // partitions + (p < messages % partitions) for p in range(partitions)]
        await asyncio.gather(*(fill(client, p, n) for p, n in enumerate(share)))
    return time.perf_counter() - started


def timed(query: Any, runs: int) -> tuple[float, list[Any], list[float]]:
    """Median seconds of ``runs`` collects after one warm-up, the result, every time."""
    result = query().collect()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = query().collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-offsets-per-partition", type=int, default=None)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tidelog.process import ServerProcess
    from tidelog.spark import TidelogDataSource

    work = Path(tempfile.mkdtemp(prefix="tidelog-spark-bench-"))
    server = ServerProcess(work / "data")
    spark = None
    try:
        server.start()
        # Not asyncio.run: grpc.aio's poller may still call into the loop after it would be
        # closed, which prints a harmless but noisy "Event loop is closed".
        loop = asyncio.new_event_loop()
        publish_s = loop.run_until_complete(
            publish(server.address, "bench", args.partitions, args.messages, args.size)
        )
        cores = os.cpu_count() or 1
        spark = (
            SparkSession.builder.master("local[*]")
            .appName("tidelog-spark-read-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(cores))
            .config("spark.sql.python.filterPushdown.enabled", "true")
            .config("spark.sql.warehouse.dir", str(work / "warehouse"))
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(TidelogDataSource)

        reader = (
            spark.read.format("tidelog").option("servers", server.address).option("stream", "bench")
        )
        if args.max_offsets_per_partition:
            reader = reader.option("maxOffsetsPerPartition", str(args.max_offsets_per_partition))

        def aggregate(df: Any) -> Any:
            return df.groupBy("partition").agg(
                F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")
            )

        tasks = reader.load().rdd.getNumPartitions()
        tidelog_s, tidelog_result, tidelog_times = timed(
            lambda: aggregate(reader.load()), args.runs
        )

        parquet = work / "bench.parquet"
        started = time.perf_counter()
        reader.load().write.parquet(str(parquet))
        parquet_write_s = time.perf_counter() - started
        parquet_s, parquet_result, parquet_times = timed(
            lambda: aggregate(spark.read.parquet(str(parquet))), args.runs
        )

        for name, result in (("tidelog", tidelog_result), ("parquet", parquet_result)):
            rows = sum(r["n"] for r in result)
            size = sum(r["bytes"] for r in result)
            if rows != args.messages or size != args.messages * args.size:
                raise RuntimeError(f"{name} counted {rows} rows / {size} bytes")

        # The sink's number (benchmarks/spark_stream_sink.py): a streaming tidelog -> tidelog
        # copy of the same stream through the exactly-once sink.
        from spark_stream_sink import streaming_copy

        sink = streaming_copy(spark, server.address, "bench", args.messages, work / "sink-cp")

        tidelog_rate = args.messages / tidelog_s
        parquet_rate = args.messages / parquet_s
        print(
            json.dumps(
                {
                    "tidelog_rows_per_s": round(tidelog_rate),
                    "parquet_rows_per_s": round(parquet_rate),
                    "ratio": round(tidelog_rate / parquet_rate, 3),
                    "target_ratio": 0.5,
                    "met": tidelog_rate / parquet_rate >= 0.5,
                    "streaming_rows_per_s": sink["streaming_rows_per_s"],
                    "settings": {
                        "messages": args.messages,
                        "size": args.size,
                        "partitions": args.partitions,
                        "runs": args.runs,
                        "spark_master": f"local[*] ({cores} cores)",
                        "spark_tasks": tasks,
                        "max_offsets_per_partition": args.max_offsets_per_partition,
                        "query": 'groupBy("partition").agg(count("*"), sum(length("value")))',
                    },
                    "details": {
                        "tidelog_seconds": [round(t, 3) for t in tidelog_times],
                        "parquet_seconds": [round(t, 3) for t in parquet_times],
                        "publish_seconds": round(publish_s, 2),
                        "parquet_write_seconds": round(parquet_write_s, 2),
                        "streaming_seconds": sink["streaming_seconds"],
                        "parquet_bytes": sum(f.stat().st_size for f in parquet.rglob("*.parquet")),
                    },
                },
                indent=2,
            )
        )
    finally:
        if spark is not None:
            spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
