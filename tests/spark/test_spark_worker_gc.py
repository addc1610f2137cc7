"""``tidelog.spark.worker_gc``: the collector is frozen once, and only in PySpark's workers."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from tidelog.spark import worker_gc


def test_only_a_process_started_from_pyspark_daemon_counts_as_a_worker() -> None:
    daemon = str(Path("/opt/venv/lib/python3.11/site-packages/pyspark/daemon.py"))
    assert worker_gc.in_pyspark_daemon_worker([daemon, "pyspark.worker"])
    assert not worker_gc.in_pyspark_daemon_worker(["/home/me/job.py"])
    assert not worker_gc.in_pyspark_daemon_worker(["/home/me/daemon.py"])
    assert not worker_gc.in_pyspark_daemon_worker([])


def test_settle_does_nothing_outside_a_worker() -> None:
    frozen = gc.get_freeze_count()
    assert worker_gc.settle() is False  # pytest is no PySpark worker
    assert gc.get_freeze_count() == frozen


def test_settle_freezes_once_in_a_worker(tmp_path: Path) -> None:
    """A script named ``pyspark/daemon.py`` stands in for PySpark's daemon: its first
    ``settle`` freezes what exists, the second does nothing, and objects made afterwards are
    still collected."""
    script = tmp_path / "pyspark" / "daemon.py"
    script.parent.mkdir()
    script.write_text(
        "import gc, weakref\n"
        "from tidelog.spark import worker_gc\n"
        "assert gc.get_freeze_count() == 0\n"
        "first, second = worker_gc.settle(), worker_gc.settle()\n"
        "frozen = gc.get_freeze_count()\n"
        "class Node: pass\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "gone = weakref.ref(a)\n"
        "del a, b\n"
        "gc.collect()\n"
        "print(first, second, frozen > 0, gone() is None)\n"
    )
    src = Path(worker_gc.__file__).parents[2]
    run = subprocess.run(
        [sys.executable, str(script), "pyspark.worker"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=60,
    )
    assert run.stdout.split() == ["True", "False", "True", "True"]
