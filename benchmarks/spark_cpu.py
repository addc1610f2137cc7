"""CPU seconds of a Spark read's three kinds of process, from Linux ``/proc``, around a phase.

``benchmarks/spark_read.py`` asks where a query's time goes: the tidelog server (read, CRC check,
send), Spark's Python workers (receive, Arrow batches, Arrow IPC to the JVM) and the Spark JVM
(Arrow to rows, the query). :func:`snapshot` reads, for every process below the benchmark's own
(the server, the JVM ``local[*]`` runs in, the Python workers the JVM starts) and for the server,
user + system CPU seconds including reaped children's, and classifies each process by its parent
chain: the server and what it started; ``java``; a Python process whose ancestors include
``java`` (a worker or PySpark's worker daemon). :func:`delta` subtracts two snapshots.

A process that ends between two snapshots takes its own seconds out of the sum and puts them into
its parent's reaped-children seconds: the totals are then right within what that process used
before the first snapshot (PySpark reuses its workers, so this is rare within one phase).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("server", "jvm", "workers")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """Command name, parent pid and CPU seconds (own and reaped children's) of ``pid``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    # fields[0] is the state; utime, stime, cutime, cstime are stat fields 14-17.
    return name, int(fields[1]), sum(int(f) for f in fields[11:15]) / TICKS


def snapshot(server_pid: int) -> dict[str, float]:
    """CPU seconds so far of the server, the Spark JVM and the Python workers."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _stat(int(entry))
            if got is not None:
                stats[int(entry)] = got
    me = os.getpid()
    totals = dict.fromkeys(KINDS, 0.0)
    for pid, (name, _, seconds) in stats.items():
        chain, parent, kind = [name], stats[pid][1], None
        if pid == server_pid:
            kind = "server"
        while parent in stats and parent != me and kind is None:
            if parent == server_pid:
                kind = "server"
            chain.append(stats[parent][0])
            parent = stats[parent][1]
        if kind is None and parent != me:
            continue  # not below the benchmark
        if kind is None:
            if name == "java":
                kind = "jvm"
            elif "java" in chain[1:] and name.startswith("python"):
                kind = "workers"
            else:
                continue
        totals[kind] += seconds
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {kind: round(after[kind] - before[kind], 3) for kind in KINDS}
