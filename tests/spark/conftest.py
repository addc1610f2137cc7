"""One local SparkSession for every Spark test (session-scoped: starting one costs ~10 s), and a
tidelog server per module. Shared with the sink's tests: keep both fixtures general.

Spark tests are marked ``spark`` and skipped only when no ``java`` is on PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.kafka_dist import BundleMissing, spark_kafka_jars
from tests.support.server import ServerProcess

from tidelog.client import Client
from tidelog.spark.jvm import jar_path as jvm_jar_path

JAVA = shutil.which("java")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if JAVA is not None:
        return
    skip = pytest.mark.skip(reason="Spark needs a Java runtime: no 'java' on PATH")
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(skip)


FD_LIMIT_FOR_PY4J = 900
"""py4j's callback server waits with select(), which fails for descriptors >= 1024 (and the
query then hangs): a test run that has leaked descriptors by now must fail clearly instead."""


@pytest.fixture(autouse=True)
def _few_open_descriptors() -> None:
    opened = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    assert opened < FD_LIMIT_FOR_PY4J, (
        f"{opened} file descriptors are open before a Spark test; py4j's select() breaks at "
        f"1024. An earlier test leaks descriptors (open logs, clients, servers)."
    )


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A ``local[2]`` SparkSession with the ``tidelog`` format registered (docs/spark.md:
    settings from the research notes: no UI, 2 shuffle partitions, filter pushdown on)."""
    # Workers must run this interpreter (with pyarrow and tidelog), and bind to loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession
    from spark_gateway import spark_gateway

    from tidelog.spark import TidelogDataSource

    settings = {
        "spark.master": "local[2]",
        "spark.app.name": "tidelog-tests",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        "spark.sql.session.timeZone": "UTC",
    }
    # Spark's own Kafka source (test_spark_kafka_source.py), once `make spark-kafka` fetched it:
    # its jars join the driver's class path; no other test loads a class from them.
    jars: list[Path] = []
    with contextlib.suppress(BundleMissing):
        jars.extend(spark_kafka_jars())
    # tidelog's JVM reader (`make spark-jvm`, which `make test` runs): without it the tests of
    # tidelog.spark.jvm fail with MissingJar, naming the target.
    if jvm_jar_path().is_file():
        jars.append(jvm_jar_path())
    if jars:
        settings["spark.jars"] = ",".join(str(jar) for jar in jars)
    # The JVM is started by spark_gateway, not by PySpark: PySpark forks this process to start
    # it, which fails once earlier tests left gRPC threads running (see spark_gateway.py).
    with spark_gateway(settings):
        builder = SparkSession.builder.config(conf=SparkConf().setAll([*settings.items()]))
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        session.dataSource.register(TidelogDataSource)
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``tidelog serve`` on a free loopback port for the module, stopped by PID afterwards.
    Maintenance (retention) runs every 50 ms so tests can watch it remove records."""
    process = ServerProcess(
        tmp_path_factory.mktemp("tidelog") / "data",
        env={"TIDELOG_MAINTENANCE_INTERVAL_S": "0.05"},
    ).start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as connection:
        yield connection
