"""Sites over the life of real servers (docs/replication.md): a site declared after the source
transmitted, a source idle with a caught-up site, and a source rebuilt from an empty data
directory or a lost delta queue."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.api.test_sites_replication import received, wait_for
from tests.support.server import ServerProcess, served

import tidelog
from tidelog.client import SiteStatus

DEADLINE_S = 30.0
"""Well under the source's ack timeouts (10 s, then 20 s, then 40 s before a snapshot sync): an
entry that is not delivered within this is stuck, not slow."""

pytestmark = pytest.mark.slow


def wait_received(address: str, client: str, source: str, count: int) -> list[tuple[int, bytes]]:
    return wait_for(address, client, source, count, DEADLINE_S)


def status_of(address: str, site: str) -> SiteStatus:
    with tidelog.Client(address) as client:
        return {s.site_id: s for s in client.site_status()}[site]


def wait_status(address: str, site: str, done: Callable[[SiteStatus], bool]) -> SiteStatus:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        state = status_of(address, site)
        if done(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def cpu_s(pid: int) -> float:
    """User and system CPU seconds a process has used (Linux: ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ)


@pytest.fixture
def source_and_sink(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with (
        served(tmp_path / "a", "--site-id", "a") as a,
        served(tmp_path / "b", "--site-id", "b") as b,
    ):
        yield a, b


def test_a_site_declared_after_the_first_transmit_gets_every_entry_for_it(
    tmp_path: Path, source_and_sink: tuple[ServerProcess, ServerProcess]
) -> None:
    a, b = source_and_sink
    with served(tmp_path / "f", "--site-id", "f") as f:
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
            client.transmit("x", b"first", ["b"])
            client.add_site("f", f.address)  # its since is past the record of "first"
            client.transmit("late", b"hello", ["f"])
            client.transmit_many("late", [(b"more-%d" % i, ["f", "b"]) for i in range(3)])
        got = wait_received(f.address, "late", "a", 4)
        assert [v for _, v in got] == [b"hello", b"more-0", b"more-1", b"more-2"]
        assert [v for _, v in received(b.address, "x", "a")] == [b"first"]
        state = wait_status(a.address, "f", lambda s: s.caught_up)
        assert (state.state, state.lag_entries, state.acked) == ("log_entry_sync", 0, got[-1][0])
        assert "caught up" in state.reason, "a caught-up site's reason says so"


def test_an_idle_source_with_a_caught_up_site_uses_almost_no_cpu(
    source_and_sink: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = source_and_sink
    with tidelog.Client(a.address) as client:
        client.add_site("b", b.address)
        client.transmit("x", b"one", ["b"])
    assert len(wait_received(b.address, "x", "a", 1)) == 1
    assert wait_status(a.address, "b", lambda s: s.caught_up).caught_up
    time.sleep(1.0)  # whatever the first sync left to do
    before, started = cpu_s(a.pid), time.monotonic()
    time.sleep(3.0)
    share = (cpu_s(a.pid) - before) / (time.monotonic() - started)
    # A sender spinning on a cancelled commit signal takes most of a core; idle is ~1 %.
    assert share < 0.2, f"the idle source used {share:.0%} of a core"


def test_a_source_rebuilt_from_an_empty_data_dir_delivers_its_new_entries(
    source_and_sink: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = source_and_sink
    with tidelog.Client(a.address) as client:
        client.add_site("b", b.address)
        for i in range(1, 4):
            client.transmit("jobs", b"old%d" % i, ["b"])
    assert len(wait_received(b.address, "jobs", "a", 3)) == 3
    a.kill()
    shutil.rmtree(a.data_dir)  # the source's disk is lost; it comes back under the same id
    os.kill(b.pid, signal.SIGSTOP)  # the source stores its new entries before it hears b
    try:
        a.start()
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
            answered = [client.transmit("jobs", b"new%d" % i, ["b"]) for i in range(1, 4)]
    finally:
        os.kill(b.pid, signal.SIGCONT)
    # Answered before the source could know better: the lost queue's positions. b gets these
    # entries lifted above all it processed.
    assert answered == [0, 1 << 16, 2 << 16]
    got = wait_received(b.address, "jobs", "a", 6)
    assert [v for _, v in got] == [b"old1", b"old2", b"old3", b"new1", b"new2", b"new3"]
    positions = [p for p, _ in got]
    assert positions == sorted(set(positions)), "no position repeats at the sink"
    state = wait_status(a.address, "b", lambda s: s.caught_up)
    assert state.caught_up and state.acked == positions[-1]
    # Entries transmitted after the source heard the sink take positions above all it knew.
    with tidelog.Client(a.address) as client:
        later = client.transmit("jobs", b"new4", ["b"])
    assert later > positions[-1] > max(answered)
    got = wait_received(b.address, "jobs", "a", 7)
    assert got[-1] == (later, b"new4")


def test_an_acknowledgement_beyond_the_source_end_is_refused_and_reported(
    source_and_sink: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = source_and_sink
    with tidelog.Client(a.address) as client:
        client.add_site("b", b.address)
        client.transmit_many("jobs", [(b"old%d" % i, ["b"]) for i in range(3)])
        client.transmit("jobs", b"old3", ["b"])
    assert len(wait_received(b.address, "jobs", "a", 4)) == 4
    a.kill()
    # The queue is lost, the registry is not: b is a site this queue has heard, and it says it
    # processed a position the queue never produced.
    for lost in ("streams/__lrq_delta", "sites_tag_index.bin", "sites_acked.json"):
        path = a.data_dir / lost
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    a.start()
    state = wait_status(a.address, "b", lambda s: "beyond" in s.reason)
    assert "beyond" in state.reason, state.reason
    assert not state.caught_up and state.state != "log_entry_sync"
    assert state.acked < (1 << 16), "the sink's position past the end is not taken as acked"
    with tidelog.Client(a.address) as client:  # the floor rose past what b processed
        assert client.transmit("jobs", b"new", ["b"]) > 1 << 16
    time.sleep(1.5)  # several reconnects: the refusal is logged once
    refusals = [line for line in a.stderr_lines if "refused: site b" in line]
    assert len(refusals) == 1, refusals
