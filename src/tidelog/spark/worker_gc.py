"""Keeping PySpark's per-task garbage collection cheap in the Python workers that read tidelog.

PySpark's worker daemon (``pyspark/daemon.py`` in PySpark 4.3) calls ``gc.collect()`` after
every task a reused Python worker runs, and so do its planner processes (they are forked from
daemons of their own) after every planning call. A full collection walks every object the
collector tracks; a process that has read from tidelog holds those of pyarrow, numpy, grpc,
protobuf, PySpark and tidelog, and the walk took 30-35 ms of CPU per task on this project's
2-core machine: five times the 6 ms a small read itself takes (``docs/performance.md``, "Spark:
the fixed costs of a read").

:func:`settle` calls ``gc.freeze()`` once per process: the objects that exist then (modules,
classes, import-time caches, which live as long as the process) move to the collector's
permanent generation, which collections skip. Later objects, every task's own, are collected as
before, and frozen objects are still freed by reference counting; what is given up is only the
collection of reference cycles among the objects frozen, should they become garbage.

Invariants: it acts only in a process PySpark's worker daemon started (``sys.argv[0]`` is
PySpark's ``daemon.py``), never in a driver program or a test that imports the source, and at
most once per process.
"""

from __future__ import annotations

import gc
import sys
from pathlib import PurePath
from typing import Final

DAEMON: Final = PurePath("pyspark", "daemon.py")
"""The module PySpark forks its Python workers from (``python -m pyspark.daemon <worker>``)."""

_settled = False


def in_pyspark_daemon_worker(argv: list[str] | None = None) -> bool:
    """Whether this process was started as ``python -m pyspark.daemon ...`` (argv[0] is then
    the full path of PySpark's ``daemon.py``)."""
    args = sys.argv if argv is None else argv
    return bool(args) and PurePath(args[0]).parts[-2:] == DAEMON.parts


def settle() -> bool:
    """Freeze the collector's current objects, once, in a PySpark daemon worker; whether this
    call froze them."""
    global _settled
    if _settled or not in_pyspark_daemon_worker():
        return False
    _settled = True
    gc.freeze()
    return True
