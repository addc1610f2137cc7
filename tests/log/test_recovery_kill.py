"""kill -9 in the middle of appends: every acknowledged record survives, byte for byte.

A child process appends batches whose contents derive from their offsets and prints each
acknowledged last offset (one line per append, flushed). The parent SIGKILLs it while it is
writing, reopens the directory and checks every acknowledged offset against the derivation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from logtools import as_expected, message_for, open_damaged

from tidelog.log import FlushPolicy, LogConfig

CHILD = textwrap.dedent(
    """
    import sys
    from logtools import message_for
    from tidelog.log import FlushPolicy, LogConfig, SegmentedLog

    directory, policy = sys.argv[1], sys.argv[2]
    config = LogConfig(
        segment_max_bytes=16384, flush_policy=FlushPolicy(policy), flush_interval_s=0.005
    )
    log = SegmentedLog(directory, config)
    for i in range(1_000_000):  # bounded even if nobody kills it
        first = log.next_offset
        count = 1 + i % 7
        offsets = log.append([message_for(o) for o in range(first, first + count)])
        assert offsets == range(first, first + count), (offsets, first)
        sys.stdout.write(f"{offsets[-1]}\\n")
        sys.stdout.flush()
    """
)
WATCHDOG_S = 60.0


def run_and_kill(directory: Path, policy: FlushPolicy, acks_before_kill: int) -> list[int]:
    """Start the child, SIGKILL it after ``acks_before_kill`` acknowledgements, and return every
    acknowledged offset it printed (complete lines only)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), policy.value],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    watchdog = threading.Timer(WATCHDOG_S, lambda: os.kill(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        lines: list[bytes] = []
        while len(lines) < acks_before_kill:
            line = proc.stdout.readline()
            if not line:
                break  # the child died on its own: its stderr says why
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait(timeout=WATCHDOG_S)
        stderr = proc.stderr.read().decode(errors="replace")
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=WATCHDOG_S)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, stderr
    text = b"".join(lines) + rest
    complete = text[: text.rfind(b"\n") + 1]
    return [int(x) for x in complete.split()]


@pytest.mark.slow
@pytest.mark.parametrize("acks_before_kill", [150, 437])
@pytest.mark.parametrize("policy", [FlushPolicy.NEVER, FlushPolicy.INTERVAL])
def test_acknowledged_appends_survive_kill_9(tmp_path, policy, acks_before_kill):
    directory = tmp_path / "log"
    acked = run_and_kill(directory, policy, acks_before_kill)
    assert len(acked) >= acks_before_kill
    assert acked == sorted(acked) and len(set(acked)) == len(acked)

    config = LogConfig(segment_max_bytes=16384, flush_policy=FlushPolicy.NEVER)
    log = open_damaged(directory, config)
    try:
        records = [r for batch in log.forward_reader(0) for r in as_expected(batch.records())]
        # Dense from 0, reaching at least the last acknowledged offset (unacknowledged appends
        # that made it to the OS before the kill may be there too, and must be just as intact).
        assert [r.offset for r in records] == list(range(len(records)))
        assert records[-1].offset >= acked[-1]
        for record in records:
            m = message_for(record.offset)
            assert (record.value, record.key, dict(record.headers)) == (
                m.value,
                m.key,
                dict(m.headers),
            )
        assert log.verify() == len(records)
        assert log.segment_count > 1  # the kill came after rolls: sealed and active segments
        assert log.next_offset == len(records)
        assert log.append([message_for(len(records))]) == range(len(records), len(records) + 1)
    finally:
        log.close()
