"""Exactly once across a real crash: a Spark application (``sink_query.py``, its own Python
process, JVM and Python workers) is killed with SIGKILL in the middle of a micro-batch, and the
query is restarted from its checkpoint (in the test's session)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sink_query import CHUNK_RECORDS, MAX_OFFSETS_PER_TRIGGER
from sink_support import assert_exactly_once, publish_numbers, values_of
from tests.support.server import ServerProcess

from tidelog.client import Client

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def held(client: Client, stream: str) -> int:
    return sum(p.high_watermark + 1 for p in client.stream_info(stream).partitions)


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the script, its JVM and the JVM's Python workers (one process group), and wait
    until none is left."""
    group = process.pid  # start_new_session: the group id is the leader's pid
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of group {group} survived SIGKILL")


def batches_in(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / kind
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


@pytest.mark.slow
def test_exactly_once_after_kill_9_in_the_middle_of_a_micro_batch(
    spark: Any, tmp_path: Path
) -> None:
    count = 3000
    source = ServerProcess(tmp_path / "source").start()
    sink = ServerProcess(tmp_path / "sink").start()
    process: subprocess.Popen[str] | None = None
    try:
        with Client(source.address) as client:
            client.create_stream("input", partitions=2)
            publish_numbers(client, "input", 2, count)
        out = Client(sink.address)
        out.create_stream("output", partitions=2)
        checkpoint = tmp_path / "checkpoint"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "sink_query.py"),
                source.address,
                sink.address,
                str(checkpoint),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        # Kill once micro-batch 1 has written some chunks but (at 2 ms a row on 2 cores, 1 s a
        # micro-batch) not all of them. The wait includes the start of the script's own JVM and
        # workers: 117-130 s were measured on 2 cores at load 10-14, hence a bound well above.
        deadline = time.monotonic() + 300
        while held(out, "output") < MAX_OFFSETS_PER_TRIGGER + 2 * CHUNK_RECORDS:
            assert process.poll() is None, "the query ended before it was killed"
            assert time.monotonic() < deadline, "the query wrote too little in 300 s"
            time.sleep(0.02)
        kill_group(process)
        at_kill = held(out, "output")
        assert at_kill < count
        # The kill hit a micro-batch that was planned (offsets logged) but not committed.
        started, committed = batches_in(checkpoint, "offsets"), batches_in(checkpoint, "commits")
        assert max(started) not in committed

        query = (
            spark.readStream.format("tidelog")
            .option("servers", source.address)
            .option("stream", "input")
            .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
            .load()
            .select("value")
            .writeStream.format("tidelog")
            .option("servers", sink.address)
            .option("stream", "output")
            .option("maxChunkRecords", str(CHUNK_RECORDS))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(90)
        assert query.exception() is None
        assert_exactly_once(values_of(out, "output"), count)
        # Same query id after the restart: the replay was deduplicated, not a new producer.
        metadata = json.loads((checkpoint / "metadata").read_text())
        assert query.id == metadata["id"]
        out.close()
    finally:
        if process is not None:
            kill_group(process)
        source.kill()
        sink.kill()
