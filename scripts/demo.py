#!/usr/bin/env python3
"""``make demo``: tidelog's main pipeline end to end — trace spans through Spark, exactly once.

1. Uses the tidelog broker on the embedded defaults (127.0.0.1:9292): one already running
   (``make serve``), or one it starts itself (data in ``./tidelog-data``) and stops at the end.
   ``--server HOST:PORT`` names another broker, which must be running.
2. (Re)creates the streams ``spans`` (2 partitions, with a window view ``recent`` keyed by
   ``<service>:<status>``) and ``spans.stats``.
3. Publishes synthetic trace spans (service, trace id, span id, duration, status, timestamp).
4. Runs the Spark Structured Streaming job ``jobs/span_stats.py`` in local mode: per service and
   minute, count, errors, p50 and p99 duration, into ``spans.stats`` exactly once, each minute
   once it is complete (append mode with a 2-minute event-time watermark).
5. Shows the latest statistics, read from ``spans.stats`` in reverse; checks that every complete
   (service, minute) was written exactly once with exactly its spans' count and errors; and
   asks for the last 10 error traces of one service in the last 5 minutes with a backward
   query of the window view.

Exit codes: 0 done and checked, 1 a check failed or the pipeline failed, 2 Java is missing,
3 no broker could be reached or started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.span_stats import SPANS, STATS  # noqa: E402

from tidelog import Client  # noqa: E402
from tidelog.client import ClientError, Message, View  # noqa: E402
from tidelog.process import ServerProcess  # noqa: E402

DEFAULT_SERVER = "127.0.0.1:9292"
SERVICES = ("checkout", "payments", "search", "catalog", "auth")
ERROR_RATES = (0.04, 0.02, 0.01, 0.005, 0.03)
MEDIAN_MS = (120.0, 80.0, 35.0, 20.0, 10.0)
WINDOW_VIEW = "recent"
console = Console()


def fail(message: str, code: int) -> int:
    console.print(f"[red]error:[/red] {message}")
    return code


def broker_answers(address: str) -> bool:
    try:
        with Client(address) as client:
            client.list_streams()
        return True
    except ClientError:
        return False


@dataclass
class Spans:
    """The generated spans: the messages, and per span its service, error flag and start."""

    messages: list[Message]
    services: np.ndarray
    errors: np.ndarray
    starts_ms: np.ndarray

    def expected_stats(self, watermark_ms: int) -> dict[str, tuple[int, int]]:
        """``<service>|<minute>`` -> (spans, errors) for every minute complete by the watermark."""
        minutes = self.starts_ms - self.starts_ms % 60_000
        expected: dict[str, tuple[int, int]] = {}
        for service, minute, error in zip(
            self.services.tolist(), minutes.tolist(), self.errors.tolist(), strict=True
        ):
            if minute + 60_000 > watermark_ms:
                continue
            stamp = datetime.fromtimestamp(minute / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")
            key = f"{SERVICES[service]}|{stamp}"
            count, errors = expected.get(key, (0, 0))
            expected[key] = (count + 1, errors + int(error))
        return expected


def generate_spans(count: int, minutes: int, seed: int = 7) -> Spans:
    """``count`` spans spread over the last ``minutes`` minutes, keyed ``<service>:<status>``."""
    rng = np.random.default_rng(seed)
    services = rng.integers(0, len(SERVICES), count)
    errors = rng.random(count) < np.take(ERROR_RATES, services)
    durations = np.take(MEDIAN_MS, services) * rng.lognormal(0.0, 0.6, count)
    durations[errors] *= 3  # failures are slow
    now_ms = int(time.time() * 1000)
    starts = np.sort(rng.integers(now_ms - minutes * 60_000, now_ms, count))
    traces = rng.integers(0, 1 << 63, count // 4 + 1)
    messages = []
    for i in range(count):
        service = SERVICES[services[i]]
        status = "error" if errors[i] else "ok"
        span = {
            "service": service,
            "trace_id": f"{traces[i // 4]:016x}",
            "span_id": f"{i:08x}",
            "duration_ms": round(float(durations[i]), 3),
            "status": status,
            "ts_ms": int(starts[i]),
        }
        messages.append(Message(json.dumps(span).encode(), key=f"{service}:{status}".encode()))
    return Spans(messages, services, errors, starts)


def prepare_streams(client: Client) -> None:
    existing = {s.name for s in client.list_streams()}
    for name in (SPANS, STATS):
        if name in existing:
            client.delete_stream(name)
    client.create_stream(SPANS, partitions=2, views=[View.window(WINDOW_VIEW, 60_000)])
    client.create_stream(STATS)


def publish(client: Client, spans: list[Message]) -> None:
    with Progress(
        TextColumn("publishing spans"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("publish", total=len(spans))
        for start in range(0, len(spans), 5000):
            chunk = spans[start : start + 5000]
            client.publish_batch(SPANS, chunk, partition=(start // 5000) % 2)
            progress.advance(task, len(chunk))


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no notice when Spark forks its JVM
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_pipeline(servers: str, checkpoint: Path, total: int) -> int | None:
    """Run the job until it has caught up; returns its final event-time watermark (ms), or None
    when there was nothing to process."""
    from jobs import span_stats

    with console.status("starting Spark (local mode, 2 cores)"):
        spark = spark_session()
    query = span_stats.start(spark, servers, str(checkpoint), max_offsets_per_trigger=50_000)
    with Progress(
        TextColumn("spark: spans aggregated"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("spark", total=total)
        seen: set[int] = set()
        done = 0
        while query.isActive:
            for report in query.recentProgress:
                batch = int(report["batchId"])
                if batch not in seen:
                    seen.add(batch)
                    done += int(report["numInputRows"])
            progress.update(task, completed=min(done, total))
            time.sleep(0.2)
        for report in query.recentProgress:
            if int(report["batchId"]) not in seen:
                done += int(report["numInputRows"])
        progress.update(task, completed=min(done, total))
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the Spark query failed: {error}")
    watermark = (query.lastProgress or {}).get("eventTime", {}).get("watermark")
    if watermark is None:
        return None
    return int(datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp() * 1000)


def show_results(client: Client, spans: Spans, watermark_ms: int) -> bool:
    ok = True
    newest = []
    for message in client.subscribe(STATS, start="latest", reverse=True):
        newest.append(json.loads(message.value))
        if len(newest) == 15:
            break
    table = Table(
        "service", "minute (UTC)", "spans", "errors", "p50 ms", "p99 ms",
        title=f"the newest 15 records of {STATS} (read in reverse), by minute",
    )  # fmt: skip
    for row in sorted(newest, key=lambda r: (r["minute"], r["service"]), reverse=True):
        table.add_row(
            row["service"],
            row["minute"],
            str(row["count"]),
            str(row["errors"]),
            f"{row['p50_ms']:.1f}",
            f"{row['p99_ms']:.1f}",
        )
    console.print(table)

    # Exactly once: every complete (service, minute) written once, with exactly its spans.
    written: dict[str, list[tuple[int, int]]] = {}
    for message in client.subscribe(STATS, start="earliest", stop="latest"):
        row = json.loads(message.value)
        written.setdefault(message.key.decode() if message.key else "", []).append(
            (row["count"], row["errors"])
        )
    expected = spans.expected_stats(watermark_ms)
    twice = [key for key, rows in written.items() if len(rows) > 1]
    found = {key: rows[0] for key, rows in written.items()}
    if not twice and found == expected:
        counted = sum(count for count, _ in found.values())
        console.print(
            f"[green]exactly once:[/green] {len(found)} complete (service, minute) rows written "
            f"once each, {counted:,} spans counted = the spans published in those minutes; "
            f"{len(spans.messages) - counted:,} newer spans wait for their minutes to complete"
        )
    else:
        ok = False
        wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        console.print(
            f"[red]the statistics do not match the spans:[/red] written twice {twice[:5]}, "
            f"different or missing {wrong[:5]}"
        )

    now_ms = int(time.time() * 1000)
    service = SERVICES[0]
    started = time.perf_counter()
    last = client.last_values(
        SPANS, WINDOW_VIEW, f"{service}:error".encode(), 10, now_ms - 5 * 60_000, now_ms
    )
    elapsed_ms = (time.perf_counter() - started) * 1000
    traces = Table(
        "published at", "trace id", "span id", "duration ms",
        title=f"last 10 error traces of {service} in the last 5 minutes "
        f"(one backward query, {elapsed_ms:.1f} ms)",
    )  # fmt: skip
    for entry in last:
        span = json.loads(entry.value)
        traces.add_row(
            entry.time.strftime("%H:%M:%S.%f")[:-3],
            span["trace_id"],
            span["span_id"],
            f"{span['duration_ms']:.1f}",
        )
    console.print(traces)
    expected_last = [m for m in spans.messages if m.key == f"{service}:error".encode()]
    expected_last = expected_last[-10:][::-1]
    if [e.value for e in last] != [m.value for m in expected_last]:
        ok = False
        console.print("[red]the backward query did not return the newest 10 error spans[/red]")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tidelog's span pipeline, end to end")
    parser.add_argument("--spans", type=int, default=200_000, help="spans to generate")
    parser.add_argument("--minutes", type=int, default=10, help="event-time span of the data")
    parser.add_argument("--server", help="use this running broker (host:port)")
    parser.add_argument("--data-dir", default="tidelog-data", help="for a broker started here")
    args = parser.parse_args(argv)

    if shutil.which("java") is None:
        return fail(
            "Java 17 or newer is needed to run Spark and none is on PATH; `make java` installs "
            "Debian's openjdk-17-jre-headless",
            2,
        )
    server: ServerProcess | None = None
    address = args.server or DEFAULT_SERVER
    if args.server is not None:
        if not broker_answers(address):
            return fail(f"no tidelog broker answers at {address}; start one with `make serve`", 3)
    elif broker_answers(address):
        console.print(f"using the tidelog broker already running at {address}")
    else:
        with console.status(f"starting a tidelog broker on {address}"):
            try:
                server = ServerProcess(Path(args.data_dir), "--port", "9292").start()
            except RuntimeError as error:
                return fail(f"could not start a tidelog broker on {address}: {error}", 3)
        console.print(f"started a tidelog broker at {address} (pid {server.pid})")
    checkpoint = Path(args.data_dir).resolve().parent / ".demo-checkpoints" / "span-stats"
    shutil.rmtree(checkpoint, ignore_errors=True)  # the streams are new, so is the query
    try:
        with Client(address) as client:
            prepare_streams(client)
            spans = generate_spans(args.spans, args.minutes)
            publish(client, spans.messages)
            started = time.perf_counter()
            watermark_ms = run_pipeline(address, checkpoint, len(spans.messages))
            if watermark_ms is None:
                return fail("the Spark query processed no spans", 1)
            console.print(f"pipeline done in {time.perf_counter() - started:.1f} s")
            return 0 if show_results(client, spans, watermark_ms) else 1
    except (ClientError, RuntimeError) as error:
        return fail(str(error), 1)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
