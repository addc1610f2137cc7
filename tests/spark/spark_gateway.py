"""The Spark driver's JVM, started without forking the test process.

PySpark's ``launch_gateway`` starts ``spark-submit`` with ``Popen(preexec_fn=...)`` (to ignore
SIGINT in the child). A ``preexec_fn`` makes CPython ``fork()`` instead of ``vfork()``, and
``fork()`` runs gRPC core's ``pthread_atfork`` handlers. In a test process where earlier tests
left gRPC threads working, those handlers log "Other threads are currently calling into gRPC,
skipping fork() handlers", the child's copy of the event engine then fails
(``epoll_wait ... Bad file descriptor``) and aborts before ``exec``: ``spark-submit`` never runs,
PySpark raises ``JAVA_GATEWAY_EXITED``, and every Spark test errors in the session fixture. A
busier machine only widens that window.

So we start ``spark-submit`` ourselves the way PySpark does (same command line, same connection
file), but with no ``preexec_fn``: CPython then spawns it with ``vfork()`` + ``exec``, which runs
no fork handlers at all, and the child never executes code that touches gRPC. Its own process
group replaces the ``SIG_IGN``: a Ctrl-C on the terminal does not reach the JVM, and the group
id lets the cleanup kill the JVM and the Python workers it started, by PID. PySpark then
connects to the running JVM through ``PYSPARK_GATEWAY_PORT``/``PYSPARK_GATEWAY_SECRET``, its
path for a driver whose JVM already exists.
"""

from __future__ import annotations

import os
import shlex
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 300.0
"""How long the JVM may take to write its connection file: ~10 s idle, 20-25 s measured (with a
server start) on 2 cores at load 10. PySpark waits without a bound; we fail clearly instead."""

STOP_TIMEOUT_S = 30.0
"""How long the JVM gets to exit after its stdin closes before its process group is killed."""


@contextmanager
def spark_gateway(settings: Mapping[str, str]) -> Iterator[Any]:
    """A running driver JVM whose ``spark-submit`` got ``settings`` as ``--conf``, and PySpark's
    py4j gateway connected to it; on exit the gateway is closed and the JVM's process group is
    gone. ``SparkContext``s made inside use this JVM."""
    from pyspark.core.context import SparkContext
    from pyspark.find_spark_home import _find_spark_home  # PySpark's own rule for SPARK_HOME

    submit = os.path.join(_find_spark_home(), "bin", "spark-submit")
    command = [submit]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    with tempfile.TemporaryDirectory(prefix="tidelog-spark-") as scratch:
        info = Path(scratch) / "connection"
        env = {**os.environ, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": str(info)}
        # No preexec_fn (see the module docstring): stdin is a pipe because the JVM exits when
        # it reads EOF there, so it cannot outlive this process even after a SIGKILL.
        jvm = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, process_group=0)
        try:
            port, secret = _wait_for_connection_file(jvm, info)
            SparkContext._gateway = _connect(port, secret)
            SparkContext._jvm = SparkContext._gateway.jvm
            yield SparkContext._gateway
        finally:
            gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
            if gateway is not None:
                gateway.shutdown()
            _stop(jvm)


def _wait_for_connection_file(jvm: subprocess.Popen[bytes], info: Path) -> tuple[int, str]:
    """The port and secret the JVM writes (renamed into place whole) once it listens."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not info.exists():
        if jvm.poll() is not None:
            raise RuntimeError(f"spark-submit exited with {jvm.returncode} before it listened")
        if time.monotonic() > deadline:
            raise RuntimeError(f"spark-submit did not listen within {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    data = info.read_bytes()
    (port, length) = struct.unpack(">ii", data[:8])
    return port, data[8 : 8 + length].decode()


def _connect(port: int, secret: str) -> Any:
    """PySpark's own gateway object (py4j client, imports of Spark's classes), through its path
    for a JVM that already runs; the variables are set only for this call, so no later child
    of this process (a script's own Spark application) inherits them."""
    from pyspark.java_gateway import launch_gateway

    names = {"PYSPARK_GATEWAY_PORT": str(port), "PYSPARK_GATEWAY_SECRET": secret}
    os.environ.update(names)
    try:
        return launch_gateway()  # type: ignore[no-untyped-call]  # untyped in PySpark
    finally:
        for name in names:
            os.environ.pop(name, None)


def _stop(jvm: subprocess.Popen[bytes]) -> None:
    """Close the JVM's stdin (it exits on EOF), then SIGKILL its process group: the JVM if it
    is still there and any Python worker it left."""
    assert jvm.stdin is not None
    jvm.stdin.close()
    with suppress(subprocess.TimeoutExpired):
        jvm.wait(STOP_TIMEOUT_S)
    with suppress(ProcessLookupError):
        os.killpg(jvm.pid, signal.SIGKILL)
    jvm.wait()
