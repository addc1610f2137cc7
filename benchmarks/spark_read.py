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

Then, in the same run, three more queries (``queries`` in the JSON), each over Parquet, over the
tidelog source with every column (``all``), and over the tidelog source narrowed to the columns
the query needs (``narrowed``: a user-specified schema, ``.schema("partition INT")``, which the
source answers with only those Arrow columns; docs/spark.md, "Reading fast"):

- ``count``: ``df.count()`` (narrowed to ``partition``; Parquet answers from its footers);
- ``group_by_partition``: ``groupBy("partition").count()`` (narrowed to ``partition``);
- ``select_value``: ``select("value")`` written to Spark's ``noop`` sink, so every value is
  materialised and nothing is written (narrowed to ``value``);

and the first query narrowed too (``narrowed_rows_per_s``, ``narrowed_ratio``: ``partition`` and
``value``). A source without column narrowing (an older tidelog) records ``null`` for it. A read
narrowed to columns without ``value`` asks the broker for frames without value bytes
(``SubscribeBatches.without_values``), so ``count`` and ``group_by_partition`` narrowed move no
values at all. Each query also runs over the JVM reader (``tidelog.spark.jvm.read``, format
``tidelog-jvm``: ``tidelog_jvm_rows_per_s``, ``ratio_jvm``; its jar from ``make spark-jvm``,
given to the session as ``spark.jars``), which Spark prunes to the query's columns by itself,
and so does the first query (``jvm_rows_per_s``, ``jvm_ratio``). The JVM reader's ratios of the
three queries are the top-level keys ``count_vs_parquet``, ``group_by_partition_vs_parquet``,
``select_value_vs_parquet`` (target >= 0.5 each; the fastest read docs/spark.md describes), the
Python source's narrowed ones ``*_python_vs_parquet``; each query records the CPU its runs took,
in µs per row, of the server, the Spark JVM and the Python workers (``cpu_us_per_row``, from
``/proc``: ``spark_cpu.py``) beside the wall rates.
``--skip-streaming`` leaves out the streaming copy (``streaming_rows_per_s`` is then ``null``).

Prints one JSON object. ``--messages N`` for a smaller run.

    python benchmarks/spark_read.py [--messages 5000000] [--size 100] [--partitions 4]
        [--runs 3] [--max-offsets-per-partition 500000] [--skip-streaming]
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

import spark_cpu

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


def rate(messages: int, seconds: float | None) -> int | None:
    return None if seconds is None else round(messages / seconds)


def ratio(numerator: int | None, denominator: int | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def narrowed_or_none(run: Any) -> Any:
    """``run()``, or ``None`` when the source refuses a user-specified schema (a tidelog
    without column narrowing)."""
    try:
        return run()
    except Exception as error:  # an older source: Spark's analysis error names the schema
        print(f"narrowed read unsupported: {str(error).splitlines()[0]}", file=sys.stderr)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-offsets-per-partition", type=int, default=None)
    parser.add_argument("--skip-streaming", action="store_true")
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tidelog.process import ServerProcess
    from tidelog.spark import TidelogDataSource, jvm

    jar = jvm.jar_path()
    if not jar.is_file():
        raise SystemExit(f"no {jar}: build the JVM reader first (`make spark-jvm`)")

    load_before = list(os.getloadavg())
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
            .config("spark.jars", str(jar))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(TidelogDataSource)

        def tidelog_reader() -> Any:
            """A new reader each time: ``DataFrameReader.schema`` changes the reader it is
            called on."""
            reader = (
                spark.read.format("tidelog")
                .option("servers", server.address)
                .option("stream", "bench")
            )
            if args.max_offsets_per_partition:
                reader = reader.option(
                    "maxOffsetsPerPartition", str(args.max_offsets_per_partition)
                )
            return reader

        reader = tidelog_reader()

        def aggregate(df: Any) -> Any:
            return df.groupBy("partition").agg(
                F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")
            )

        # Which tidelog the Python workers import (PYTHONPATH decides, as for the driver).
        worker_tidelog = (
            spark.sparkContext.parallelize([0], 1)
            .map(lambda _: __import__("tidelog").__file__)
            .collect()[0]
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

        def narrowed(ddl: str) -> Any:
            return tidelog_reader().schema(ddl).load()

        jvm_options = {"servers": server.address, "stream": "bench"}
        if args.max_offsets_per_partition:
            jvm_options["maxOffsetsPerPartition"] = str(args.max_offsets_per_partition)

        def on_jvm() -> Any:
            """Planned again for every query, as the Python source plans every query."""
            return jvm.read(spark, jvm_options)

        jvm_s, jvm_result, jvm_times = timed(lambda: aggregate(on_jvm()), args.runs)

        narrowed_run = narrowed_or_none(
            lambda: timed(lambda: aggregate(narrowed("partition INT, value BINARY")), args.runs)
        )
        results = [
            ("tidelog", tidelog_result),
            ("parquet", parquet_result),
            ("tidelog jvm", jvm_result),
        ]
        if narrowed_run is not None:
            results.append(("tidelog narrowed", narrowed_run[1]))
        for name, result in results:
            rows = sum(r["n"] for r in result)
            size = sum(r["bytes"] for r in result)
            if rows != args.messages or size != args.messages * args.size:
                raise RuntimeError(f"{name} counted {rows} rows / {size} bytes")

        queries = {}
        server_pid = server.pid
        for query, ddl, run_query in (
            ("count", "partition INT", lambda df: df.count()),
            ("group_by_partition", "partition INT", lambda df: df.groupBy("partition").count()),
            ("select_value", "value BINARY", lambda df: df.select("value")),
        ):
            queries[query] = measure_query(
                query,
                run_query,
                all_columns=reader.load,
                narrowed=lambda ddl=ddl: narrowed(ddl),
                on_jvm=on_jvm,
                parquet=lambda: spark.read.parquet(str(parquet)),
                runs=args.runs,
                messages=args.messages,
                server_pid=server_pid,
            )

        # The sink's number (benchmarks/spark_stream_sink.py): a streaming tidelog -> tidelog
        # copy of the same stream through the exactly-once sink.
        from spark_stream_sink import streaming_copy

        sink: dict[str, Any] = {"streaming_rows_per_s": None, "streaming_seconds": None}
        if not args.skip_streaming:
            sink = streaming_copy(spark, server.address, "bench", args.messages, work / "sink-cp")

        tidelog_rate = args.messages / tidelog_s
        parquet_rate = args.messages / parquet_s
        narrowed_rate = rate(args.messages, None if narrowed_run is None else narrowed_run[0])
        jvm_rate = rate(args.messages, jvm_s)
        print(
            json.dumps(
                {
                    "tidelog_rows_per_s": round(tidelog_rate),
                    "parquet_rows_per_s": round(parquet_rate),
                    "ratio": round(tidelog_rate / parquet_rate, 3),
                    "target_ratio": 0.5,
                    "met": tidelog_rate / parquet_rate >= 0.5,
                    "streaming_rows_per_s": sink["streaming_rows_per_s"],
                    "narrowed_rows_per_s": narrowed_rate,
                    "narrowed_ratio": ratio(narrowed_rate, round(parquet_rate)),
                    "jvm_rows_per_s": jvm_rate,
                    "jvm_ratio": ratio(jvm_rate, round(parquet_rate)),
                    **{
                        f"{query}_vs_parquet": queries[query]["ratio_jvm"]
                        for query in ("count", "group_by_partition", "select_value")
                    },
                    **{
                        f"{query}_python_vs_parquet": queries[query]["ratio_narrowed"]
                        for query in ("count", "group_by_partition", "select_value")
                    },
                    "queries": queries,
                    "load_average_before": load_before,
                    "load_average_after": list(os.getloadavg()),
                    "settings": {
                        "messages": args.messages,
                        "size": args.size,
                        "partitions": args.partitions,
                        "runs": args.runs,
                        "spark_master": f"local[*] ({cores} cores)",
                        "spark_tasks": tasks,
                        "worker_tidelog": worker_tidelog,
                        "max_offsets_per_partition": args.max_offsets_per_partition,
                        "query": 'groupBy("partition").agg(count("*"), sum(length("value")))',
                    },
                    "details": {
                        "tidelog_seconds": [round(t, 3) for t in tidelog_times],
                        "parquet_seconds": [round(t, 3) for t in parquet_times],
                        "narrowed_seconds": None
                        if narrowed_run is None
                        else [round(t, 3) for t in narrowed_run[2]],
                        "jvm_seconds": [round(t, 3) for t in jvm_times],
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


def measure_query(
    name: str,
    run_query: Any,
    *,
    all_columns: Any,
    narrowed: Any,
    on_jvm: Any,
    parquet: Any,
    runs: int,
    messages: int,
    server_pid: int,
) -> dict[str, Any]:
    """One query over the three inputs: medians as rows/s, ratios to Parquet, every time, and
    the CPU of the server, the JVM and the Python workers per row read (warm-up included).

    ``run_query(df)`` returns a number (``count``) or a DataFrame, which is run to the end
    through the ``noop`` sink (every row computed, nothing written or collected)."""

    def action(make_df: Any) -> Any:
        def run() -> Any:
            outcome = run_query(make_df())
            if isinstance(outcome, int):
                return _Counted(outcome)
            return _Written(outcome)

        return run

    seconds: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    sides = (("all", all_columns), ("narrowed", narrowed), ("jvm", on_jvm), ("parquet", parquet))
    for side, make_df in sides:
        runner = action(make_df)
        before = spark_cpu.snapshot(server_pid)
        got = (
            narrowed_or_none(lambda runner=runner: timed(runner, runs))
            if side == "narrowed"
            else timed(runner, runs)
        )
        used = spark_cpu.delta(before, spark_cpu.snapshot(server_pid))
        rows = messages * (runs + 1)
        cpu[side] = {kind: round(s * 1e6 / rows, 3) for kind, s in used.items()}
        seconds[side] = got
        if got is not None and isinstance(got[1], _Counted) and got[1].rows != messages:
            raise RuntimeError(f"{name} over {side} counted {got[1].rows} rows, not {messages}")
    rates = {side: rate(messages, None if got is None else got[0]) for side, got in seconds.items()}
    return {
        "tidelog_all_columns_rows_per_s": rates["all"],
        "tidelog_narrowed_rows_per_s": rates["narrowed"],
        "tidelog_jvm_rows_per_s": rates["jvm"],
        "parquet_rows_per_s": rates["parquet"],
        "ratio_all_columns": ratio(rates["all"], rates["parquet"]),
        "ratio_narrowed": ratio(rates["narrowed"], rates["parquet"]),
        "ratio_jvm": ratio(rates["jvm"], rates["parquet"]),
        "seconds": {
            side: None if got is None else [round(t, 3) for t in got[2]]
            for side, got in seconds.items()
        },
        "cpu_us_per_row": cpu,
        "load_average_after": list(os.getloadavg()),
    }


class _Counted:
    """A ``count()`` result, shaped for :func:`timed` (which calls ``.collect()``)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def collect(self) -> _Counted:
        return self


class _Written:
    """A DataFrame run to the end through the ``noop`` sink when :func:`timed` collects it."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def collect(self) -> None:
        self.df.write.format("noop").mode("overwrite").save()


if __name__ == "__main__":
    main()
