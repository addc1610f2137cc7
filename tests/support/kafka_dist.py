"""Java jars from Maven Central for the Kafka tooling: Apache Kafka's broker and Spark's Kafka
source, each a *bundle* of one or more artifacts and their runtime dependencies.

A bundle is fetched with the machine's Maven (``mvn dependency:copy-dependencies`` on a small
pom this module writes) into ``build/kafka/<name>-<version>/lib``; Maven keeps what it downloads
in its local repository (``~/.m2``), so a second fetch (after ``make clean``) needs no network.

Invariants:

- A bundle directory exists only once complete: jars are copied into a temporary directory
  beside it, which is renamed into place after Maven succeeded (a failed or interrupted fetch
  leaves no half bundle that a test would take for a whole one).
- ``jars(bundle)`` is the bundle's class path, sorted by file name; it raises
  :class:`BundleMissing` (with the ``make`` target to run) instead of returning nothing.
- :func:`spark_kafka_jars` never names an artifact that PySpark already ships (Scala, Hadoop's
  client, SLF4J, ...): Spark's own copy, of Spark's version, is the one its classes were built
  with, so only what Spark lacks goes into ``spark.jars``.

``scripts/kafka_dist.py`` is the command line (``make kafka-dist``, ``make spark-kafka``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "kafka"
"""Fetched bundles and the built Java test client: gitignored (``build/``), removed by
``make clean``."""

KAFKA_VERSION = "4.1.1"
"""Apache Kafka's release used for the broker beside tidelog and for the Java client."""

SPARK_KAFKA_VERSION = "4.2.0"
"""Spark's Kafka source for PySpark 4.3.0: Maven Central serves no 4.3.0 of
``spark-sql-kafka-0-10_2.13``; 4.2.0 is the newest release it serves, and
tests/spark/test_spark_kafka_source.py proves it reads under PySpark 4.3.0."""

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


class BundleMissing(RuntimeError):
    """A bundle that has not been fetched: the message names the ``make`` target that does."""


class FetchFailed(RuntimeError):
    """Maven could not resolve a bundle (its output is in the message)."""


@dataclass(frozen=True)
class Bundle:
    """Artifacts (``group:artifact:version``) fetched together with their runtime dependencies."""

    name: str
    version: str
    artifacts: tuple[str, ...]
    make_target: str

    @property
    def directory(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"

    @property
    def lib(self) -> Path:
        return self.directory / "lib"


BROKER = Bundle(
    name="broker",
    version=KAFKA_VERSION,
    # kafka_2.13 is the broker (kafka.Kafka, kafka.tools.StorageTool). Its code logs through
    # SLF4J 1.7 and log4j-api; the binding Kafka's own distribution ships (log4j's SLF4J 1.x
    # bridge, at Kafka's log4j version) comes with it, or SLF4J would drop every line.
    artifacts=(
        f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
        "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
    ),
    make_target="kafka-dist",
)

SPARK_KAFKA = Bundle(
    name="spark-kafka",
    version=SPARK_KAFKA_VERSION,
    # Spark itself is a "provided" dependency of the connector: copy-dependencies with the
    # runtime scope leaves it out, so only the connector, kafka-clients and their own
    # dependencies land here, to be named in spark.jars.
    artifacts=(f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_KAFKA_VERSION}",),
    make_target="spark-kafka",
)

BUNDLES = {bundle.name: bundle for bundle in (BROKER, SPARK_KAFKA)}


def jars(bundle: Bundle) -> list[Path]:
    """The bundle's jars, sorted by name; :class:`BundleMissing` when it was never fetched."""
    found = sorted(bundle.lib.glob("*.jar")) if bundle.lib.is_dir() else []
    if not found:
        raise BundleMissing(
            f"{bundle.name} {bundle.version} is not in {bundle.directory}: "
            f"run `make {bundle.make_target}` (Maven fetches it from Maven Central)"
        )
    return found


_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+)-\d+(?:\.\d+)+(?:[-.][\w.]+)?\.jar$")


def artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``: a jar's name without its version."""
    matched = _VERSIONED_JAR.match(jar.name)
    return matched["artifact"] if matched else jar.stem


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed PySpark (found without importing it)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise BundleMissing("PySpark is not installed (`make install`)")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def spark_kafka_jars() -> list[Path]:
    """The jars to name in ``spark.jars`` for Spark's ``kafka`` source: the connector and what
    it needs that PySpark does not ship itself (kafka-clients, commons-pool2, ...)."""
    shipped = {artifact_name(jar) for jar in pyspark_jars_dir().glob("*.jar")}
    return [jar for jar in jars(SPARK_KAFKA) if artifact_name(jar) not in shipped]


def pom(bundle: Bundle) -> str:
    """A pom whose dependencies are the bundle's artifacts (nothing is built from it)."""
    dependencies = []
    for coordinate in bundle.artifacts:
        group, artifact, version = coordinate.split(":")
        dependencies.append(
            "    <dependency>"
            f"<groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
            f"<version>{escape(version)}</version></dependency>"
        )
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<project xmlns="http://maven.apache.org/POM/4.0.0">',
            "  <modelVersion>4.0.0</modelVersion>",
            "  <groupId>tidelog.tools</groupId>",
            f"  <artifactId>{escape(bundle.name)}-bundle</artifactId>",
            "  <version>0</version>",
            "  <packaging>pom</packaging>",
            "  <dependencies>",
            *dependencies,
            "  </dependencies>",
            "</project>",
            "",
        ]
    )


def fetch(bundle: Bundle, *, force: bool = False) -> Path:
    """Fetch ``bundle`` with Maven unless it is already complete; returns its ``lib`` directory."""
    if bundle.lib.is_dir() and not force:
        return bundle.lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchFailed("no `mvn` on PATH: Debian's maven package provides it")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{bundle.name}-", dir=CACHE) as scratch:
        staging = Path(scratch) / "bundle"
        (staging / "lib").mkdir(parents=True)
        (staging / "pom.xml").write_text(pom(bundle))
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(staging / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'lib'}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise FetchFailed(
                f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        if bundle.directory.exists():
            shutil.rmtree(bundle.directory)
        os.replace(staging, bundle.directory)
    return bundle.lib
