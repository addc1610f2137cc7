"""Apache Kafka itself, a single KRaft node on loopback, for the Kafka tooling's self-tests and
for benchmarks that compare tidelog's Kafka listener with the real thing.

Theory of operation: :class:`ApacheKafka` writes a ``server.properties`` for one process that is
both broker and controller (``node.id=1``, a static voter set of itself), with the broker on
``PLAINTEXT://127.0.0.1:<free port>``, the controller on a second free port, its logs under its
own directory, and every internal topic at replication factor 1. It formats that directory with
Kafka's ``kafka.tools.StorageTool`` (a fresh cluster id each time), starts ``kafka.Kafka`` on the
jars of ``make kafka-dist`` (tests/support/kafka_dist.py) with a small heap, and waits until a
client's metadata request lists the broker: ApiVersions answered and the broker unfenced, so a
topic can be created at once.

Invariants:

- Whatever :meth:`ApacheKafka.start` began, :meth:`ApacheKafka.stop` ends: the JVM by its PID
  (SIGTERM, then SIGKILL after ``stop_timeout_s``) and the node's directory removed. A start
  that fails stops what it started and raises :class:`KafkaStartFailed` with the tail of the
  broker's log.
- Ports are chosen with :func:`tidelog.process.free_port`, so nothing else on the machine is
  touched; ``log4j2.properties`` sends Kafka's logging (WARN and above) to ``kafka.log`` in the
  node's directory, never to the test's output.

Benchmarks import it with the repository root on ``sys.path``
(``from tests.support.apache_kafka import apache_kafka``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient
from tests.support.kafka_dist import BROKER, jars

from tidelog.process import free_port

HEAP = "-Xmx512m"
START_TIMEOUT_S = 60.0
"""From the JVM's launch to a metadata answer that lists the broker: ~5-8 s on an idle 2-core
machine; the bound is for a loaded one."""
STOP_TIMEOUT_S = 15.0

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
"""


class KafkaStartFailed(RuntimeError):
    """Apache Kafka did not format, start, or answer in time (the message has its log's tail)."""


def cluster_id() -> str:
    """A random cluster id in Kafka's form (16 bytes, URL-safe base64 without padding); like
    Kafka's own ``Uuid.randomUuid`` it never starts with ``-``, which a command line takes for an
    option."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(
    directory: Path, port: int, controller_port: int, settings: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The single node's configuration; ``settings`` override or add keys."""
    config = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(directory / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        # One partition instead of 50: the first consumer group then starts in well under a
        # second, which the self-tests (one group each) feel.
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    config.update(settings or {})
    return config


class ApacheKafka:
    """One Apache Kafka node in ``directory`` (created, and removed by :meth:`stop`)."""

    def __init__(
        self,
        directory: Path,
        settings: Mapping[str, str] | None = None,
        *,
        heap: str = HEAP,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.config = server_properties(directory, self.port, self.controller_port, settings)
        self.heap = heap
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0
        """Seconds from the JVM's launch to the broker listed in a metadata answer."""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    def _java(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaStartFailed("no `java` on PATH (`make java` installs one)")
        classpath = os.pathsep.join(str(jar) for jar in jars(BROKER))
        return [
            java,
            self.heap,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            classpath,
            main,
            *args,
        ]

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "log4j2.properties").write_text(LOG4J2.format(log=self.log_path))
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in self.config.items()))
        return path

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ApacheKafka:
        config = self._write_config()
        try:
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(config)
                ),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            if formatted.returncode != 0:
                raise KafkaStartFailed(
                    f"StorageTool format exited with {formatted.returncode}:\n"
                    f"{formatted.stdout}{formatted.stderr}"
                )
            started = time.monotonic()
            with (self.directory / "stdout.log").open("wb") as output:
                self.process = subprocess.Popen(
                    self._java("kafka.Kafka", str(config)),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            self._wait_ready(started + timeout_s)
            self.startup_s = time.monotonic() - started
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise KafkaStartFailed(
                    f"kafka.Kafka exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaStartFailed(
                    f"no metadata answer from {self.bootstrap}:\n{self.log_tail()}"
                )
            with contextlib.suppress(Exception):  # not listening yet, or not yet unfenced
                if admin.list_topics(timeout=min(2.0, remaining)).brokers:
                    return
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        text = ""
        for name in ("stdout.log", "kafka.log"):
            path = self.directory / name
            if path.exists():
                text += "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
        return text

    def stop(self) -> None:
        """Stop the JVM by PID (SIGTERM, then SIGKILL) and remove the node's directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def apache_kafka(
    parent: Path | None = None, settings: Mapping[str, str] | None = None
) -> Iterator[str]:
    """A started Apache Kafka node in a fresh directory under ``parent`` (the system's temporary
    directory by default); yields its bootstrap address ``127.0.0.1:PORT`` and stops it, and
    removes the directory, when the block ends."""
    directory = Path(tempfile.mkdtemp(prefix="apache-kafka-", dir=parent))
    node = ApacheKafka(directory, settings)
    node.start()
    try:
        yield node.bootstrap
    finally:
        node.stop()
