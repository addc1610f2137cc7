#!/usr/bin/env python3
"""Streaming throughput of the exactly-once ``tidelog`` sink: a tidelog -> tidelog streaming
copy with ``Trigger.AvailableNow``, rows/s end to end (query start to the last micro-batch
committed, every record read from the source stream, cut into chunks and published as
idempotent batches).

``streaming_copy`` is what ``benchmarks/spark_read.py`` calls for its ``streaming_rows_per_s``
(on the stream it published). Run alone, this script starts its own ``tidelog serve`` on a free
127.0.0.1 port with a fresh temporary data directory (stopped by PID and removed at the end),
publishes ``--messages`` random values of ``--size`` bytes over ``--partitions`` partitions
(with ``spark_read.publish``) and prints one JSON object:

    python benchmarks/spark_stream_sink.py [--messages 1000000] [--size 100] [--partitions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def streaming_copy(
    spark: Any, address: str, source: str, messages: int, checkpoint: Path
) -> dict[str, Any]:
    """Copy stream ``source`` (``messages`` records) into a new stream with the same
    partitions, keeping each record's partition; the rate and the seconds it took."""
    from tidelog.client import Client

    target = f"{source}-copy"
    with Client(address) as client:
        partitions = len(client.stream_info(source).partitions)
        client.create_stream(target, partitions=partitions)
    started = time.perf_counter()
    query = (
        spark.readStream.format("tidelog")
        .option("servers", address)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("tidelog")
        .option("servers", address)
        .option("stream", target)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the streaming copy failed: {query.exception()}")
    with Client(address) as client:
        copied = sum(p.high_watermark + 1 for p in client.stream_info(target).partitions)
    if copied != messages:
        raise RuntimeError(f"the streaming copy holds {copied} records, not {messages}")
    return {
        "streaming_rows_per_s": round(messages / seconds),
        "streaming_seconds": round(seconds, 2),
        "streaming_micro_batches": len(query.recentProgress),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from spark_read import publish
    from tidelog.process import ServerProcess
    from tidelog.spark import TidelogDataSource

    work = Path(tempfile.mkdtemp(prefix="tidelog-spark-sink-bench-"))
    server = ServerProcess(work / "data")
    spark = None
    try:
        server.start()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(
            publish(server.address, "bench", args.partitions, args.messages, args.size)
        )
        cores = os.cpu_count() or 1
        spark = (
            SparkSession.builder.master("local[*]")
            .appName("tidelog-spark-sink-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(cores))
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(TidelogDataSource)
        result = streaming_copy(spark, server.address, "bench", args.messages, work / "cp")
        result["settings"] = {
            "messages": args.messages,
            "size": args.size,
            "partitions": args.partitions,
            "spark_master": f"local[*] ({cores} cores)",
            "query": "readStream tidelog -> writeStream tidelog, availableNow, default chunks",
        }
        print(json.dumps(result, indent=2))
    finally:
        if spark is not None:
            spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
